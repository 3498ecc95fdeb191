"""Search excerpts: the part of an archived message a full-text search answers with, taken
where the query's words are (the same on every database)."""

from __future__ import annotations

import difflib
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


#: Two excerpts are alike when this share of their words match in order (difflib's ratio):
#: the same sentence with other values, as a session that repeats its steps writes it.
ALIKE_RATIO = 0.6
#: Most chars of what one alike excerpt says differently.
DIFFERENCE_MAX_CHARS = 240


def alike(first: str, other: str) -> bool:
    """``first`` and ``other`` (excerpts) say the same with other values (:data:`ALIKE_RATIO`)."""
    a, b = first.split(), other.split()
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() >= ALIKE_RATIO


def difference(first: str, other: str, most: int = DIFFERENCE_MAX_CHARS) -> str:
    """What ``other`` says that ``first`` (an excerpt alike) does not: each run of its words
    that differs, with one word either side, ``; `` between runs, at most ``most`` chars."""
    a, b = first.split(), other.split()
    runs = []
    for op, _, _, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op in ("replace", "insert"):
            runs.append(" ".join(b[max(0, j1 - 1) : j2 + 1]))
    text = "; ".join(runs)
    return text if len(text) <= most else text[: most - 3].rstrip() + "..."
