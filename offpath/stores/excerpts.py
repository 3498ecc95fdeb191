"""Search excerpts: the part of an archived message a full-text search answers with, taken
where the query's words are (the same on every database)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

#: Most chars of one search excerpt (before the brackets around its matched words).
EXCERPT_MAX_CHARS = 600


def excerpt(text: str, words: Sequence[str], most: int = EXCERPT_MAX_CHARS) -> str:
    """At most ``most`` chars of ``text`` (white space runs as one space), where ``words``
    (a query's words, any letter case, each matched whole: no letter or digit right before
    or after it) are densest: the window holding the most distinct words (then the most
    matches, then the first), centred on the span from its first match to its last, cut at
    spaces, ``...`` where it cuts the text. Each match is put in brackets (``[word]``).
    The text's start when no word is in it."""
    text = " ".join(text.split())
    terms = {w.rstrip(".:/@-").casefold() for w in words} - {""}
    if not terms:
        return text[:most]
    pattern = re.compile(
        r"(?<![^\W_])(?:"
        + "|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True))
        + r")(?![^\W_])",
        re.IGNORECASE,
    )
    matches = [(m.start(), m.end(), m.group(0).casefold()) for m in pattern.finditer(text)]
    if not matches:
        start, end = 0, min(len(text), most)
    else:
        best: tuple[int, int, int] = (-1, -1, 0)  # distinct words, matches, -first index
        span = (0, 0)
        inside: Counter[str] = Counter()  # the words of matches[i:j], the window at match i
        j = 0
        for i, (first, _, word) in enumerate(matches):
            while j < len(matches) and (j <= i or matches[j][1] - first <= most):
                inside[matches[j][2]] += 1
                j += 1
            score = (len(inside), j - i, -i)
            if score > best:
                best, span = score, (first, matches[j - 1][1])
            inside[word] -= 1
            if not inside[word]:
                del inside[word]
        room = most - (span[1] - span[0])
        start = max(0, min(span[0] - room // 2, len(text) - most))
        end = min(len(text), start + most)
        if start > 0:
            cut = text.find(" ", start, span[0])
            start = cut + 1 if cut >= 0 else start
        if end < len(text):
            cut = text.rfind(" ", span[1], end)
            end = cut if cut > 0 else end
    shown = pattern.sub(lambda m: f"[{m.group(0)}]", text[start:end])
    return ("..." if start > 0 else "") + shown + ("..." if end < len(text) else "")
