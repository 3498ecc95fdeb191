"""A summary message within its budget (DESIGN.md invariant 20): the whole message as it
lands in the thread (prefix line, the seed's template with the agent's place and its
decisions, findings, pinned facts, the sections added at the apply, the archive's index, the
recall line and a quoted request) holds at most its budget, ``SUMMARY_MAX_SHARE`` x the
threshold (the thread's: :func:`~offpath.compaction.planner.thread_budget`), and no line of
it repeats another. Pure.

:func:`fit_summary` shortens a summary's content by whole lines, in a fixed order, the
least needed first (see :data:`ORDER`); :func:`least_chars` says how small it can get
while keeping what is never given up for the others (the check before the swap needs that
to know its room).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from offpath.compaction.facts.reading import give_up_cost, without_one_value
from offpath.compaction.facts.sections import (
    ASKED_LABEL,
    LEFT_OUT,
    PINNED_HEADING,
    SAID_LABEL,
    SINCE_HEADING,
    SWAP_HEADING,
)
from offpath.compaction.frontier import DECISIONS_HEADING, DONE_HEADING, ORIGINAL_HEADING
from offpath.compaction.index import INDEX_HEADING, merge_oldest
from offpath.compaction.summary import HEADINGS, REQUEST_HEADING

#: The sections, in the order they are shortened (the first one first); each gives up whole
#: lines, never part of one:
#:
#: 1. ``since-facts``: the facts listed under the since-section (every one is archived, and
#:    the section names its message): its quoted lines, the last first, then its lines of
#:    values one value at a time, but for what the agent said and the user named (``said``);
#: 2. ``findings-tail``: Key findings bullets past the first :data:`FIRST_FINDINGS`, the last
#:    first (the summarizer's prose gives way to the facts: the guard's pins);
#: 3. ``pinned``: Pinned facts entries: the quoted lines first (a line of ~150 chars holds a
#:    fact or two), the last first, then the lines of values (denser) one value at a time,
#:    the longest line first, but for those of what the agent said and the user named
#:    (``said``, below);
#: 4. ``findings``: the first Key findings bullets, the last first;
#: 5. ``notes``: notes in italics other than the recall line (the offline note);
#: 6. ``state-extra``: the Current state's Done line, then its Next, Instructions in force
#:    and standing-instructions lines;
#: 7. ``prose``: the text of the Ruled out and Current state lines (their headings stay,
#:    saying the text was left out);
#: 8. ``since-requests``: the since-section's turns, the oldest first (counted in one line);
#: 9. ``index``: the archive's index, its two oldest spans merged into one line, again and
#:    again (no span in the middle is dropped);
#: 10. ``said``: the Pinned facts and since-section lines of what the agent said in its own
#:     words and the user named give up one value at a time, from their largest span group
#:     (no span's values all dropped): they outrank the summarizer's prose, the quotes of
#:     the since-section's turns and the index's detail (DESIGN.md invariant 20; ``recall``
#:     reads those turns whole and finds what the index names): the since-section's are the
#:     agent's newest words, found nowhere else in view once its messages went;
#: 11. ``open``: the Current state's Open line;
#: 12. ``decisions``: the Decisions entries, the oldest first;
#: 13. ``swap``: the identifiers the check before the swap pinned, the last first (the
#:     caller gives them room by :func:`least_chars` and checks none was dropped);
#: 14. last, a line still too long is clipped at a word with ``...`` (the Investigating and
#:     Original request lines, a quoted request: ``recall`` reads them whole).
ORDER = (
    "since-facts",
    "findings-tail",
    "pinned",
    "findings",
    "notes",
    "state-extra",
    "prose",
    "since-requests",
    "index",
    "said",
    "open",
    "decisions",
    "swap",
)
#: The steps :func:`least_chars` takes: all but the swap entries'.
_LEAST = ORDER[: ORDER.index("swap")]

#: Key findings bullets kept while pinned facts give way (:data:`ORDER`).
FIRST_FINDINGS = 3

_SINCE_TURN = re.compile(
    r"^- (?:Request \((?:answered|not answered yet)\):|The turn quoted above ended:|"
    r"\d+ earlier turn\(s\) went too)"
)
_EARLIER_TURNS = re.compile(r"^- (\d+) earlier turn\(s\) went too")


def _own(line: str) -> bool:
    """``line`` lists values the agent said in its own words or the user named."""
    head = line.split(": ", 1)[0]
    return head.endswith((SAID_LABEL, ASKED_LABEL)) and line.startswith("- ")


def _norm(line: str) -> str:
    return " ".join(line.split())


def _section_of(line: str, current: str) -> str:
    """The section a line opens (a heading line), or ``current``."""
    if line.startswith(REQUEST_HEADING) or line.startswith("**Request of the turn"):
        return "request"
    for heading, name in (
        (HEADINGS[0], "investigating"),
        (ORIGINAL_HEADING, "investigating"),
        (DECISIONS_HEADING, "decisions"),
        (HEADINGS[1], "findings"),
        (HEADINGS[2], "ruled"),
        (HEADINGS[3], "state"),
        (DONE_HEADING, "done"),
        (PINNED_HEADING, "pinned"),
        (SWAP_HEADING, "swap"),
        (SINCE_HEADING, "since"),
        (INDEX_HEADING, "index"),
    ):
        if line.startswith(heading):
            return name
    return current


class _Lines:
    """A summary's content as lines, each with its section and whether it opens it."""

    def __init__(self, content: str) -> None:
        self.rows: list[tuple[str, str, bool]] = []  # (section, line, heading)
        section = "prefix"
        for line in content.split("\n"):
            if section == "request":  # the quoted request runs to the end, word for word
                self.rows.append((section, line, False))
                continue
            opened = _section_of(line, section)
            heading = opened != section or (
                opened in ("investigating", "ruled", "state", "done") and line.startswith("**")
            )
            section = opened
            if line.startswith("_") and line.endswith("_") and len(line) > 2:
                self.rows.append(("note", line, False))
                continue
            self.rows.append((section, line, heading))

    def text(self) -> str:
        out: list[str] = []
        for section, line, _ in self.rows:
            if section != "request" and not line.strip() and (not out or not out[-1].strip()):
                continue  # one blank line between parts (a quoted request stays as it is)
            out.append(line)
        while out and not out[-1].strip():
            out.pop()
        return "\n".join(out)

    def size(self) -> int:
        return len(self.text())

    def dedupe(self) -> None:
        """Drop every non-empty line that repeats an earlier one (whitespace normalized), but
        within a quoted request, which stays word for word. A line the check before the swap
        pinned is the one kept (the other parts give up lines before it)."""
        swapped = {_norm(line) for section, line, h in self.rows if section == "swap" and not h}
        seen: set[str] = set()
        rows = []
        for row in self.rows:
            section, line, _ = row
            key = _norm(line)
            if key and section != "request":
                if key in seen or (section != "swap" and key in swapped):
                    continue
                seen.add(key)
            rows.append(row)
        self.rows = rows
        self._drop_empty_sections()

    def _drop_empty_sections(self) -> None:
        """A heading of a section that lost every entry goes too (pinned, since, swap,
        index, decisions: sections that are only their entries)."""
        rows = self.rows
        for k in range(len(rows) - 1, -1, -1):
            section, line, heading = rows[k]
            if not heading or section not in ("pinned", "since", "swap", "index", "decisions"):
                continue
            entries = any(
                s == section and not h and ln.strip()
                for s, ln, h in rows[k + 1 : k + 1 + self._span(k)]
            )
            if not entries:
                del rows[k]

    def _span(self, k: int) -> int:
        n = 0
        for s, _, h in self.rows[k + 1 :]:
            if h or s != self.rows[k][0]:
                break
            n += 1
        return n

    def entries(self, section: str, test: Callable[[str], object] | None = None) -> list[int]:
        return [
            i
            for i, (s, line, heading) in enumerate(self.rows)
            if s == section and not heading and line.strip() and (test is None or test(line))
        ]

    def drop(self, index: int) -> None:
        del self.rows[index]
        self._drop_empty_sections()


def _step(lines: _Lines, name: str, cap: int) -> None:
    """Shorten section ``name`` of ``lines`` by whole lines while they are over ``cap``."""

    def over() -> bool:
        return lines.size() > cap

    if name == "findings-tail":
        while over() and len(found := lines.entries("findings")) > FIRST_FINDINGS:
            lines.drop(found[-1])
    elif name == "since-facts":
        while over() and (found := lines.entries("since", lambda ln: ln.startswith("- `"))):
            lines.drop(found[-1])
        _one_value_at_a_time(
            lines, over, ("since",), lambda ln: not _SINCE_TURN.match(ln) and not _own(ln)
        )
    elif name == "pinned":
        while over() and (found := lines.entries("pinned", lambda ln: ln.startswith("- `"))):
            lines.drop(found[-1])
        _one_value_at_a_time(lines, over, ("pinned",), lambda ln: not _own(ln))
    elif name == "said":
        _one_value_at_a_time(lines, over, ("pinned", "since"), _own)
    elif name in ("findings", "swap"):
        while over() and (found := lines.entries(name)):
            lines.drop(found[-1])
    elif name == "notes":
        while over() and (found := lines.entries("note", lambda ln: "`recall`" not in ln)):
            lines.drop(found[0])
    elif name == "state-extra":
        for label in (DONE_HEADING, "- Next:", "- Instructions in force:", "- Standing"):
            while over() and (
                found := [
                    i
                    for i, (s, ln, _) in enumerate(lines.rows)
                    if s in ("state", "done") and ln.startswith(label)
                ]
            ):
                lines.drop(found[-1])
    elif name == "prose":
        while over() and (found := lines.entries("ruled")):  # lines under Ruled out
            lines.drop(found[-1])
        while over() and (found := lines.entries("state", lambda ln: not ln.startswith("- "))):
            lines.drop(found[-1])
        for heading in (HEADINGS[2], HEADINGS[3]):
            if not over():
                return
            for i, (s, ln, _) in enumerate(lines.rows):
                if ln.startswith(heading) and len(ln) > len(heading) + len(LEFT_OUT) + 1:
                    lines.rows[i] = (s, f"{heading} {LEFT_OUT}", True)
    elif name == "since-requests":
        while over() and (found := lines.entries("since", _SINCE_TURN.match)):
            counted = _EARLIER_TURNS.match(lines.rows[found[0]][1])
            if counted and len(found) == 1:
                lines.drop(found[0])
                break
            n = int(counted.group(1)) if counted else 0
            first = found[1] if counted else found[0]
            for i in sorted({found[0], first}, reverse=True):
                del lines.rows[i]
            line = f"- {n + 1} earlier turn(s) went too (`recall` finds them)"
            lines.rows.insert(found[0], ("since", line, False))
    elif name == "index":
        while over():
            found = lines.entries("index")
            merged = merge_oldest([lines.rows[i][1] for i in found])
            if len(found) < 2 or merged is None:
                break
            start = found[0]
            for i in reversed(found):
                del lines.rows[i]
            for k, line in enumerate(merged):
                lines.rows.insert(start + k, ("index", line, False))
    elif name == "open":
        while over() and (
            found := [
                i for i, (s, ln, _) in enumerate(lines.rows) if s == "state" and ln.startswith("- ")
            ]
        ):
            lines.drop(found[-1])
    elif name == "decisions":
        while over() and (found := lines.entries("decisions")):
            lines.drop(found[0])


def _one_value_at_a_time(
    lines: _Lines,
    over: Callable[[], bool],
    sections: tuple[str, ...],
    test: Callable[[str], object],
) -> None:
    """The lines of ``sections`` that ``test`` picks give up one value at a time while
    ``over()``, from the line whose value to give up is the longest
    (:func:`~offpath.compaction.facts.reading.give_up_cost`: the fewest facts go for the
    chars freed), the longest line at a tie, each from its largest span group (each span
    keeps its share: a line of forty values is not lost at once for a few chars); a line
    that is no line of values (a count of ids, a time range) goes whole."""
    while over() and (found := [i for s in sections for i in lines.entries(s, test)]):
        k = max(found, key=lambda i: (give_up_cost(lines.rows[i][1]), len(lines.rows[i][1])))
        shorter = without_one_value(lines.rows[k][1])
        if shorter is None:
            lines.drop(k)
        else:
            lines.rows[k] = (lines.rows[k][0], shorter, False)


def _clip(lines: _Lines, cap: int) -> None:
    """The last resort: the longest lines clipped at a word (``...``) until the content fits."""
    while lines.size() > cap:
        k = max(range(len(lines.rows)), key=lambda i: len(lines.rows[i][1]))
        section, line, heading = lines.rows[k]
        room = len(line) - (lines.size() - cap) - 3
        if room < 20 or len(line) < 24:
            break
        cut = line[:room].rsplit(" ", 1)[0] if " " in line[:room] else line[:room]
        lines.rows[k] = (section, cut.rstrip() + "...", heading)


def fit_summary(content: str, cap: int) -> str:
    """``content`` (a summary message's whole content) with no line repeating an earlier
    one (whitespace normalized; a quoted request stays word for word), shortened to at most
    ``cap`` chars (0: no bound) by whole lines in the order of :data:`ORDER`; a line is
    clipped only when nothing else is left to give up. Returns it unchanged when it fits
    and repeats nothing."""
    lines = _Lines(content)
    lines.dedupe()
    if cap:
        for name in ORDER:
            if lines.size() <= cap:
                break
            _step(lines, name, cap)
        if lines.size() > cap:
            _clip(lines, cap)
    text = lines.text()
    return text if text != content.rstrip() else content


def least_chars(content: str) -> int:
    """The size (chars) :func:`fit_summary` can bring ``content`` down to without giving up
    a line the check before the swap pinned: what such lines may add and still fit."""
    lines = _Lines(content)
    lines.dedupe()
    for name in _LEAST:
        _step(lines, name, 0)
    return lines.size()


__all__ = ["LEFT_OUT", "ORDER", "fit_summary", "least_chars"]
