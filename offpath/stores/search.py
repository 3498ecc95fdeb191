"""Full-text search of the archive (:func:`search`, what ``recall`` answers a query of words
with): the best matches first, each an excerpt taken where the query's words are
(:func:`excerpt`, the same on every database), the rows alike an answer's folded into it."""

from __future__ import annotations

import difflib
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from offpath.stores.archive import RECALL_MAX_CHARS

#: Rows a search reads per answer it gives: the rows alike an answer's are folded into it.
FOLD_ROWS = 4

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


def search(
    engine: Engine, session_id: str, query: str, limit: int = 5, max_chars: int = RECALL_MAX_CHARS
) -> list[dict[str, Any]]:
    """The archived originals of a thread that best match ``query`` (any of its words), as
    ``{"message_id", "type", "excerpt"}``, best first: by the database's relevance (SQLite
    FTS5's ``bm25``, PostgreSQL's ``ts_rank``), the newest first among equal ones (a session
    that repeats its steps answers with its latest). Each excerpt is
    :func:`excerpt` of the message (at most
    :data:`EXCERPT_MAX_CHARS` chars, matched words in brackets). A
    row whose excerpt is :func:`alike` an answer's (the same sentence
    with other values) is folded into it, as a line ``alike in [<id>]: <what it says
    differently>``; up to ``limit`` answers from the best ``limit`` x :data:`FOLD_ROWS` rows,
    at most ``max_chars`` chars in all."""
    words = re.findall(r"[\w][\w.:/@-]*", query)[:20]
    if not words:
        return []
    shown = (
        "(a.job_id = '' OR a.job_id IN (SELECT job_id FROM compaction_jobs WHERE status = "
        "'applied') OR (a.kind = 'shortened' AND a.job_id IN (SELECT job_id FROM "
        "compaction_jobs WHERE status = 'reverted')))"
    )
    if engine.dialect.name == "postgresql":
        sql = sa.text(
            "SELECT a.message_id, a.message->>'type' AS type, a.text "
            "FROM archive a, websearch_to_tsquery('simple', :q) q "
            f"WHERE a.session_id = :s AND a.tsv @@ q AND {shown} "
            "ORDER BY ts_rank(a.tsv, q) DESC, a.id DESC LIMIT :n"
        )
        params = {"q": " or ".join(words), "s": session_id, "n": limit}
    else:
        sql = sa.text(
            "SELECT a.message_id, json_extract(a.message, '$.type') AS type, a.text "
            "FROM archive_fts JOIN archive a ON a.id = archive_fts.rowid "
            f"WHERE archive_fts MATCH :q AND a.session_id = :s AND {shown} "
            "ORDER BY bm25(archive_fts), a.id DESC LIMIT :n"
        )
        params = {
            "q": " OR ".join('"' + w.replace('"', "") + '"' for w in words),
            "s": session_id,
            "n": limit,
        }
    params["n"] = limit * FOLD_ROWS
    hits: list[dict[str, Any]] = []
    with engine.connect() as conn:
        for row in conn.execute(sql, params):
            text = excerpt(str(row.text or ""), words)
            head = next((h for h in hits if alike(h["excerpt"], text)), None)
            if head is None:
                if len(hits) < limit:
                    hits.append(
                        {
                            "message_id": row.message_id,
                            "type": row.type,
                            "excerpt": text,
                            "alike": [],
                        }
                    )
                continue
            head["alike"].append((row.message_id, difference(head["excerpt"], text)))
    out, used = [], 0
    for hit in hits:
        text = hit["excerpt"] + "".join(
            f"\n  alike in [{mid}]: {said}" for mid, said in hit.pop("alike", [])
        )
        text = text[: max(0, max_chars - used)]
        if not text:
            break
        used += len(text)
        out.append({**hit, "excerpt": text})
    return out
