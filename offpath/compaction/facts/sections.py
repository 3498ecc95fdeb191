"""The sections the fact guard writes into a summary: their headings, the formats of their
entries (written by :func:`~offpath.compaction.facts.pin` and
:func:`~offpath.compaction.facts.pinning.swap_check`, read back from an earlier summary), and how a
quoted line is clipped around its fact and compared with the others."""

from __future__ import annotations

import re

#: The heading of the section the guard appends (after the seed's four).
PINNED_HEADING = "**Pinned facts**"
#: The heading of the section a compaction applied late adds for the messages that came
#: after its summary was written and that it removes too (LLM-free: their facts, by
#: message). Its entries read like pinned ones.
SINCE_HEADING = "**Since this summary was written**"
#: The heading of the entries the check before the swap adds: identifiers that messages
#: written while the summary was prepared name, which only the removed part held.
SWAP_HEADING = "**Named since this summary was written**"
#: The heading of the archive index at a summary's end (:mod:`offpath.compaction.index`): the
#: index is offpath's own table of contents, never read back as facts.
INDEX_HEADING = "**Archive index**"
#: What a section's text says once its lines were left out for space (a template heading
#: keeps its place): offpath's words, never read back as a fact.
LEFT_OUT = "(left out for space; `recall` finds it)"
#: Most chars of one pinned entry's quoted line.
MAX_LINE_CHARS = 160
#: An entry of an earlier summary's Pinned facts: a quoted line, or values by message.
#: A quoted line of the agent's own words is marked ``(<id>; said)``: the next summary reads
#: its facts back as stated by the agent.
QUOTED_PATTERN = re.compile(r"^- `(?P<line>.*)` \((?P<id>[^()\s;]+)(?P<tail>(?:; [^()]*)?)\)$")
SAID_MARK = "; said"
#: A quoted line carried from an earlier span is marked ``(<id>; age <n>)``: pinned ``n``
#: compactions before this one (its values take turns with other spans').
AGE_MARK = "; age "
LISTED_PATTERN = re.compile(r"^- also in (?P<id>\S+): (?P<values>.*)$")
#: The compact line of carried facts that found no room with their message ids.
_EARLIER_LINE = "\n- earlier, each found by `recall`: "
EARLIER_PATTERN = re.compile(r"^- earlier, each found by `recall`: (?P<values>.*)$")
#: What follows a kind's label on the line of the values stated (:func:`pin`).
STATED_LABEL = " (stated)"
#: What follows it on the line of the values the agent said in its own words (its
#: conclusions, figures, names): read back as said, they keep the first share of the budget
#: at every later compaction.
SAID_LABEL = " (said)"
#: And on the line of the values the user named or fixed (read back as asked).
ASKED_LABEL = " (asked)"
#: A line of values of one kind (:func:`pin`): ``- ids: OBUT9V, credit_card_9513926``; the
#: values the agent or the user stated are on a line of their own, ``- ids (stated): ...``,
#: so that a summary that carries them keeps them ranked as stated (a long run's tenth
#: summary had dropped the names the agent stated for paths that a traceback printed).
VALUES_PATTERN = re.compile(
    r"^- (?:ids|names|lines|addresses|times|errors|settings|amounts|numbers|versions|paths|urls)"
    rf"(?P<stated>{'|'.join(re.escape(x) for x in (STATED_LABEL, SAID_LABEL, ASKED_LABEL))})?"
    r": (?P<values>.+)$"
)


#: What makes two lines near duplicates: the same but for their numbers, times and long hex
#: ids (an identifier with letters, ``fact-3``, ``pod-x7``, keeps them apart).
SIGNATURE = re.compile(
    r"(?<![\w-])\d[\d:.,/+TZ-]*(?![\w-])|(?<![\w-])[0-9a-f]{8,}(?![\w-])", re.IGNORECASE
)


def is_blob(line: str) -> bool:
    """``line`` (clipped by :func:`clip_around`) is a piece of one long line of JSON, which says
    little quoted: ``..."15:00:00", "status":...`` or ``...["OI5L9G", "AQLBTL",...`` (tau-bench)."""
    return (line.startswith("...") or line.endswith("...")) and ('":' in line or '", "' in line)


def clip_around(line: str, offset: int, value: str, most: int = MAX_LINE_CHARS) -> str:
    """``line`` clipped to ``most`` chars (default :data:`MAX_LINE_CHARS`) around ``value``,
    cut at word boundaries."""
    line = " ".join(line.split())
    if len(line) <= most:
        return line
    offset = max(0, line.find(value))
    room = most - len(value)
    start = max(0, offset - room // 2)
    end = min(len(line), start + most)
    start = max(0, end - most)
    if start > 0:
        cut = line.find(" ", start, offset)
        start = cut + 1 if cut >= 0 else start
    if end < len(line):
        cut = line.rfind(" ", offset + len(value), end)
        end = cut if cut > 0 else end
    return ("..." if start else "") + line[start:end] + ("..." if end < len(line) else "")
