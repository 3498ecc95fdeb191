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
    if start > 0:  # at a space, else at a char no value holds, else where the value starts
        cut = line.find(" ", start, offset)
        if cut < 0:
            cut = next((i for i in range(start, offset) if line[i] in _BREAKS), offset - 1)
        start = cut + 1
    if end < len(line):  # the same at the end: never inside a word
        cut = line.rfind(" ", offset + len(value), end)
        if cut <= 0:
            cut = next(
                (i for i in range(end - 1, offset + len(value) - 1, -1) if line[i] in _BREAKS),
                offset + len(value),
            )
        end = cut
    return ("..." if start else "") + line[start:end] + ("..." if end < len(line) else "")


#: Chars no fact's value holds (:mod:`.patterns`): a cut next to one splits no value.
_BREAKS = frozenset(" \t\n\r\f\v\"'`<>[]{}|")


def run_before(text: str, at: int) -> int:
    """Where the run of chars that ends at ``at`` in ``text`` starts: the chars a value cut
    at ``at`` may hold (``at`` itself when a char no value holds, :data:`_BREAKS`, is before
    it)."""
    i = at
    while i > 0 and text[i - 1] not in _BREAKS:
        i -= 1
    return i


def run_after(text: str, at: int) -> int:
    """Where the run of chars that starts at ``at`` in ``text`` ends (see :func:`run_before`)."""
    j = at
    while j < len(text) and text[j] not in _BREAKS:
        j += 1
    return j


def head_before(text: str, at: int, most: int | None = None) -> str:
    """``text`` cut at ``at``, less the run of chars the cut splits (``text[:at]`` when the
    cut is next to a char no value holds): a head that ends on no part of a word. ``most``:
    the most chars given up so (a longer run, a blob of data, or a head that is one run, is
    cut where it is)."""
    if 0 < at < len(text) and text[at] not in _BREAKS:
        start = run_before(text, at)
        if most is None or (0 < start and at - start <= most):
            return text[:start]
    return text[:at]


def tail_from(text: str, at: int, most: int | None = None) -> str:
    """``text`` from ``at`` on, less the run of chars a cut at ``at`` splits (see
    :func:`head_before`)."""
    if 0 < at < len(text) and text[at - 1] not in _BREAKS:
        end = run_after(text, at)
        if most is None or (end < len(text) and end - at <= most):
            return text[end:]
    return text[at:]


#: offpath's note where it cut a shortened message's text
#: (:func:`offpath.compaction.shorten.shorten`): its head ends before it, its tail starts on
#: the line after it. A stub's note (``... reads it]``, ``... archived it as message <id>]``)
#: follows only a first line, cut with "..." when it was.
_SHORTENED_NOTE = re.compile(
    r"\n\[offpath: [\d,]+ of this (?:result|message)'s [\d,]+ chars are not shown here;[^\n]*"
)
_STUB_NOTE = re.compile(r"(?: reads it| archived it as message \S+)\]$")
#: A media part's reference clipped (``[image_url: at https://...]``,
#: :func:`offpath.compaction.accounting.content_text`): the reference is cut.
_CLIPPED_REFERENCE = re.compile(r"\[[\w-]+: at (\S+?)\.\.\.\]")


def without_cut_runs(text: str) -> str:
    """``text`` with the chars next to each cut offpath made in it (a shortened message's
    head and tail around its note, a clipped media reference) blanked, so that no value cut
    there is read as a fact (``PixelRepresentati``). The offsets of the rest are kept; a
    value whole on a cut's side is listed in the note (:func:`offpath.compaction.shorten.
    shorten` counts it as not shown). Text with no such cut is returned as it is."""
    if "[offpath: " not in text and "...]" not in text:
        return text
    spans: list[tuple[int, int]] = []
    for note in _SHORTENED_NOTE.finditer(text):
        at = note.start()
        if not _STUB_NOTE.search(note.group()) or text.endswith("...", 0, at):
            spans.append((run_before(text, at), at))
        tail = note.end() + 1
        if tail < len(text) and text[tail - 1] == "\n":
            spans.append((tail, run_after(text, tail)))
    spans += [m.span(1) for m in _CLIPPED_REFERENCE.finditer(text)]
    if not spans:
        return text
    out, last = [], 0
    for start, end in sorted(spans):
        start = max(start, last)
        if end > start:
            out += [text[last:start], " " * (end - start)]
            last = end
    out.append(text[last:])
    return "".join(out)


#: Most chars of an argument's first line that offpath keeps when it cuts the argument
#: (:func:`offpath.compaction.shorten.shorten`), its note on the next line.
ARGUMENT_HEAD_CHARS = 200
_CUT_ARGUMENT = re.compile(r"\[offpath: [\d,]+ chars of this argument not shown;")


def argument_head(value: str) -> str:
    """The first line of a tool call's argument ``value``; of an argument offpath cut, whose
    first line it kept to :data:`ARGUMENT_HEAD_CHARS`, without the run of chars the cut may
    have split (listed whole in the note, if a fact)."""
    head, _, rest = value.partition("\n")
    if len(head) >= ARGUMENT_HEAD_CHARS and _CUT_ARGUMENT.match(rest):
        return head[: run_before(head, len(head))]
    return head
