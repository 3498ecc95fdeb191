"""The check before the swap: the identifiers that messages written while a
summary was prepared name, which only the part it removes held, quoted under
:data:`~offpath.compaction.facts.SWAP_HEADING` (:func:`swap_check`)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from langchain_core.messages import BaseMessage

from offpath.compaction.facts.patterns import find, normal
from offpath.compaction.facts.reading import fact_blocks, tool_arguments
from offpath.compaction.facts.sections import SWAP_HEADING, clip_around
from offpath.compaction.standing import is_standing, standing_blocks
from offpath.compaction.summary.instructions import looks_like_instruction
from offpath.compaction.summary.message import cite

#: A token someone may name: an id, a code, a name with digits or separators.
_NAMED = re.compile(r"(?<![\w#.-])[#A-Za-z0-9][\w.#:/-]{3,60}(?<![.:/-])(?![\w-])")


def _looks_named(token: str) -> bool:
    """``token`` reads as a name rather than a word: it holds a digit, ``_`` or ``#``, or it
    is all capitals (``XEHQWM``)."""
    return (
        any(c.isdigit() for c in token)
        or "_" in token
        or "#" in token
        or (token.isupper() and len(token) >= 5)
    )


def swap_check(
    later: Sequence[BaseMessage],
    removed: Sequence[BaseMessage],
    kept: Sequence[BaseMessage],
    summary_text: str,
    max_chars: int,
) -> tuple[str, int]:
    """The check before the swap (after "Slipstream", arXiv 2605.08580, without an
    LLM): the identifiers that the ``later`` messages (written while the summary was
    prepared) name in what the agent or the user says or passes to a tool (not in tool
    output), which only the ``removed`` part held (not the summary, not the ``kept``
    messages), quoted with their line and message under :data:`SWAP_HEADING`, in at most
    ``max_chars`` chars. Returns the section ("" when none is needed) and how many such
    identifiers did not fit (the caller re-prepares the compaction then)."""
    from offpath.compaction.accounting import render_content

    visible = normal(summary_text + "\n" + "\n".join(render_content(m.content) for m in kept))
    refs: dict[str, str] = {}
    for m in later:
        named = [v for v, _ in tool_arguments(m)]
        for text, role, _ in fact_blocks(m):
            if role == "data":  # what the agent or the user names, not tool output
                continue
            named += [v for v, k, _ in find(text) if k not in ("timestamp", "quantity")]
            named += [t for t in _NAMED.findall(text) if _looks_named(t)]
        for value in named:
            if normal(value) not in visible:
                refs.setdefault(normal(value), value)
    if not refs:
        return "", 0
    blocks = standing_blocks([*removed, *kept, *later])
    header = f"{SWAP_HEADING} (named by messages that came after it; `recall` reads them):"
    room = max_chars - len(header) - 2
    # one entry per line quoted: the identifiers found on the same line share it
    quoted: dict[tuple[str, int], list[str]] = {}  # (message id, line start) -> clips
    entries: dict[str, str] = {}  # clip -> entry
    missing = 0
    found: set[str] = set()
    for m in removed:
        for text, _, mid in fact_blocks(m):
            low = text.casefold()
            for key, value in refs.items():
                if key in found:
                    continue
                at = low.find(value.casefold())
                if at < 0:
                    continue
                start = text.rfind("\n", 0, at) + 1
                end = text.find("\n", at)
                line = text[start : end if end >= 0 else len(text)]
                if looks_like_instruction(line) or is_standing(line, blocks):
                    continue
                found.add(key)
                clips = quoted.setdefault((str(mid), start), [])
                if any(value.casefold() in c.casefold() for c in clips):
                    continue  # quoted already with another identifier of its line
                clip = clip_around(line, at - start, value).replace("`", chr(39))
                entry = f"\n- `{clip}` ({cite(mid)})"
                if clip in entries:
                    continue
                if len(entry) > room:
                    missing += 1
                    continue
                clips.append(clip)
                entries[clip] = entry
                room -= len(entry)
    if not entries:
        return "", missing
    return header + "".join(entries.values()), missing
