"""Standing instructions: the blocks an agent framework appends to every user message (a
"Global Instructions" paragraph, Claude Code's ``<system-reminder>`` blocks). They are not
what the user asks: a summary shows them once, briefly, and never as a request. Pure.

A block is a paragraph (lines between blank lines) of at least :data:`MIN_BLOCK_CHARS` that
appears word for word (whitespace normalized) in two user messages or more, and that is not
the whole of each of them (the same request sent twice, or a request's copy, stays a
request); or a ``<system-reminder>`` block; or a paragraph that starts as a block an earlier
summary named (:func:`standing_line`, read back by :func:`read_standing`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

from langchain_core.messages import BaseMessage

from offpath.compaction.accounting import content_text
from offpath.compaction.summary import is_summary

#: The least chars of a paragraph repeated across user messages for it to count as a block.
MIN_BLOCK_CHARS = 40
#: Most chars of a block a summary quotes (its start, to recognise it by).
QUOTE_CHARS = 100
#: The summary line that names the standing instructions (in the Current state's lines).
STANDING_LABEL = "- Standing instructions (sent with every user message, not a request): "
_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL | re.IGNORECASE)
_PARAGRAPHS = re.compile(r"\n\s*\n")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _norm(text: str) -> str:
    return " ".join(text.split())


def _paragraphs(text: str) -> list[str]:
    return [p for p in (_norm(x) for x in _PARAGRAPHS.split(_REMINDER.sub("\n\n", text))) if p]


def standing_blocks(messages: Sequence[BaseMessage], known: Iterable[str] = ()) -> tuple[str, ...]:
    """The standing blocks of the user messages among ``messages`` (whitespace normalized, in
    order of first use), ``known`` ones (quoted starts an earlier summary named) counted."""
    texts = [content_text(m.content) for m in messages if m.type == "human" and not is_summary(m)]
    per: Counter[str] = Counter()
    alone: Counter[str] = Counter()
    order: dict[str, int] = {}
    for text in texts:
        paragraphs = _paragraphs(text)
        for p in dict.fromkeys(paragraphs):
            per[p] += 1
            order.setdefault(p, len(order))
            if len(paragraphs) == 1:
                alone[p] += 1
    starts = [_norm(k).removesuffix("...") for k in known if _norm(k)]
    blocks = [
        p
        for p in order
        if (len(p) >= MIN_BLOCK_CHARS and per[p] >= 2 and alone[p] < per[p])
        or any(s and p.replace('"', "'").startswith(s) for s in starts)
    ]
    return tuple(blocks)


def without_standing(text: str, blocks: Sequence[str]) -> str:
    """``text`` without its ``<system-reminder>`` blocks and the paragraphs that are one of
    ``blocks`` (its other paragraphs as they were)."""
    text = _REMINDER.sub("", text)
    if not blocks:
        return text.strip()
    wanted = set(blocks)
    kept = [p for p in _PARAGRAPHS.split(text) if _norm(p) not in wanted]
    return "\n\n".join(p.strip("\n") for p in kept).strip()


def is_standing(line: str, blocks: Sequence[str]) -> bool:
    """``line`` is part of one of ``blocks`` (a line of 12+ chars, whitespace normalized)."""
    one = _norm(line)
    return len(one) >= 12 and any(one in b for b in blocks)


def standing_line(blocks: Sequence[str]) -> str | None:
    """The summary's line naming ``blocks``: the first one's start, quoted, and how many
    more paragraphs there are."""
    if not blocks:
        return None
    first = blocks[0]
    if len(first) > QUOTE_CHARS:
        first = first[: QUOTE_CHARS - 3].rsplit(" ", 1)[0] + "..."
    more = f" (+{len(blocks) - 1} more paragraphs)" if len(blocks) > 1 else ""
    return STANDING_LABEL + '"' + first.replace('"', "'") + '"' + more


def read_standing(text: str) -> tuple[str, ...]:
    """The quoted starts of the standing blocks a summary's text names."""
    for line in text.splitlines():
        if line.startswith(STANDING_LABEL):
            return tuple(q for q in _QUOTED.findall(line[len(STANDING_LABEL) :]) if q)
    return ()
