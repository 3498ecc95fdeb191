"""The :class:`Frontier` and its forms: its JSON, and its lines in a summary's text
(:func:`into_summary` writes them into the seed's template, :meth:`Frontier.from_text` reads
them back), with clipped requests pointing at their message for ``recall``. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from offpath.compaction.standing import read_standing, standing_line
from offpath.compaction.summary.message import HEADINGS, cite

MAX_ITEM_CHARS = 160
#: How :func:`into_summary` marks the task when a later request follows it.
_STATUS = re.compile(r"^ \((done|superseded: revised by a later request|earlier)\): (.+)$")


@dataclass(frozen=True, slots=True)
class Frontier:
    """Where the session stands (see the module doc). Texts are word for word, clipped only
    by :func:`into_summary`'s budget; ids name the messages they come from (``recall``)."""

    task: str | None = None
    task_id: str | None = None
    #: "done" (answered before the next request) or "revised" (a later request revises it)
    task_status: str | None = None
    latest: str | None = None
    latest_id: str | None = None
    done: tuple[str, ...] = ()
    open: tuple[str, ...] = ()
    next: str | None = None
    instructions: tuple[str, ...] = ()
    earlier: tuple[str, ...] = field(default=(), compare=False)  # done items carried
    #: the standing instructions sent with every user message (whole, or the quoted start an
    #: earlier summary named): shown once, never as a request (:mod:`offpath.compaction.standing`)
    standing: tuple[str, ...] = ()
    #: the values the user fixed, word for word (:data:`DECISIONS_HEADING`), oldest first
    decisions: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "task_id": self.task_id,
            "task_status": self.task_status,
            "latest": self.latest,
            "latest_id": self.latest_id,
            "done": list(self.done),
            "open": list(self.open),
            "next": self.next,
            "instructions": list(self.instructions),
            "standing": list(self.standing),
            "decisions": list(self.decisions),
        }

    @classmethod
    def from_text(cls, text: str) -> Frontier | None:
        """The frontier an earlier summary shows, read from its text (what the model saw):
        never from its metadata, which a client can forge. None when it
        shows none."""
        current = original = None
        status = None
        lists: dict[str, tuple[str, ...]] = {}
        decisions: list[str] = []
        in_decisions = False
        for line in text.splitlines():
            if line.startswith(DECISIONS_HEADING):
                in_decisions = True
                continue
            if in_decisions:
                if line.startswith(DECISION_MARK):
                    decisions.append(line[len(DECISION_MARK) :].strip())
                    continue
                in_decisions = False
            if line.startswith(HEADINGS[0]) and current is None:
                current = line[len(HEADINGS[0]) :].strip() or None
            elif line.startswith(ORIGINAL_HEADING) and original is None:
                found = _STATUS.match(line[len(ORIGINAL_HEADING) :])
                if found:
                    status = {
                        "done": "done",
                        "superseded: revised by a later request": "revised",
                    }.get(found.group(1))
                    original = found.group(2).strip() or None
            elif line.startswith(DONE_HEADING):
                lists["Done"] = tuple(
                    x.strip() for x in line[len(DONE_HEADING) :].split("; ") if x.strip()
                )
            else:
                for label in ("Open", "Next", "Instructions in force"):
                    if line.startswith(f"- {label}: "):
                        lists[label] = tuple(
                            x.strip() for x in line[len(label) + 4 :].split("; ") if x.strip()
                        )
        if current is None:
            return None
        current, current_id = _pointer(current)
        original, original_id = _pointer(original) if original else (None, None)
        task, latest = (original, current) if original else (current, None)
        return cls(
            task=task,
            task_id=original_id if original else current_id,
            task_status=status if latest else None,
            latest=latest,
            latest_id=current_id if original else None,
            done=lists.get("Done", ()),
            open=lists.get("Open", ()),
            next=lists.get("Next", (None,))[0],
            instructions=lists.get("Instructions in force", ()),
            standing=read_standing(text),
            decisions=tuple(d for d in decisions if d),
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Frontier | None:
        """A frontier an earlier summary carried; None for none (or one that is not ours)."""
        if not isinstance(data, Mapping):
            return None

        def texts(key: str) -> tuple[str, ...]:
            value = data.get(key)
            return (
                tuple(str(x) for x in value if isinstance(x, str))
                if isinstance(value, list)
                else ()
            )

        def text(key: str) -> str | None:
            value = data.get(key)
            return value if isinstance(value, str) and value else None

        return cls(
            task=text("task"),
            task_id=text("task_id"),
            task_status=text("task_status"),
            latest=text("latest"),
            latest_id=text("latest_id"),
            done=texts("done"),
            open=texts("open"),
            next=text("next"),
            instructions=texts("instructions"),
            standing=texts("standing"),
            decisions=texts("decisions"),
        )


def one_line(text: str, limit: int = MAX_ITEM_CHARS) -> str:
    """``text`` on one line (whitespace runs made one space), cut at a word to at most
    ``limit`` chars with "..." when longer."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3].rsplit(" ", 1)[0] + "..."


#: The line that keeps the session's first request when a later request is the current one.
ORIGINAL_HEADING = "**Original request**"
#: The line that lists what is done (after Current state's items).
DONE_HEADING = "**Done:**"
#: The heading of the values the user fixed (an approved wording, a chosen option, "do not
#: touch X"), each quoted word for word on a line of its own, after the Investigating lines.
DECISIONS_HEADING = "**Decisions** (fixed by the user, word for word):"
#: How a decision's line opens (its text follows, word for word on one line).
DECISION_MARK = "- "
#: Most decisions a summary lists (the newest), and most chars of one (a longer one is
#: clipped at a word, its message named for ``recall``).
MAX_DECISIONS = 12
MAX_DECISION_CHARS = 400


#: A request an earlier summary clipped: its start and the id ``recall`` reads it whole by.
_POINTER = re.compile(r'^(?P<text>.*\.\.\.) \(whole: recall\("(?P<id>[^"]+)"\)\)$')


def _pointer(text: str) -> tuple[str, str | None]:
    """``(text, message id)`` of a clipped request with its ``recall`` pointer; ``(text,
    None)`` for a whole one."""
    found = _POINTER.match(text)
    return (found["text"], found["id"]) if found else (text, None)


def into_summary(text: str, frontier: Frontier, budget: int) -> str:
    """``text`` (a summary in the seed's template) with ``frontier`` written into it, in at
    most ``budget`` chars more than the template lines it replaces. **Investigating** says
    the current request, word for word: the task, or the latest request when it differs,
    with the task kept under :data:`ORIGINAL_HEADING` (marked done, superseded or earlier);
    **Current state** gains the open items (open first), the next step and the
    instructions in force, and :data:`DONE_HEADING` lists what is done. A text too long for
    the budget is clipped, naming its message (``recall`` reads it whole). A summary off the
    template is returned as it is."""
    lines = text.splitlines()
    inv = next((i for i, ln in enumerate(lines) if ln.startswith(HEADINGS[0])), None)
    cur = next((i for i, ln in enumerate(lines) if ln.startswith(HEADINGS[3])), None)
    if inv is None or cur is None:
        return text
    room = max(200, budget)
    # the request in progress gets the larger share: clipped, it loses what the agent is
    # doing ("Good, that one is finished. Now: Restore the DNS..."); the first request,
    # kept for the record, the smaller one
    latest_quote, quote = max(120, room // 2), max(80, room // 3)

    def verbatim(value: str, mid: str | None, quote: int = quote) -> str:
        one = " ".join(value.split())
        if len(one) <= quote:
            if mid and one.endswith("...") and not one.endswith("...."):
                return f'{one} (whole: recall("{cite(mid)}"))'  # clipped by an earlier summary
            return one
        cut = one[: quote - 40].rsplit(" ", 1)[0]
        return f'{cut}... (whole: recall("{cite(mid)}"))' if mid else f"{cut}..."

    if frontier.task:
        same = frontier.latest is not None and (
            " ".join(frontier.latest.split()) == " ".join(frontier.task.split())
        )
        if frontier.latest and not same:  # the same request twice says nothing more
            status = {"done": "done", "revised": "superseded: revised by a later request"}.get(
                frontier.task_status or "", "earlier"
            )
            lines[inv] = (
                f"{HEADINGS[0]} {verbatim(frontier.latest, frontier.latest_id, latest_quote)}\n"
                f"{ORIGINAL_HEADING} ({status}): {verbatim(frontier.task, frontier.task_id)}"
            )
        else:
            lines[inv] = f"{HEADINGS[0]} {verbatim(frontier.task, frontier.task_id, latest_quote)}"
    left = room - sum(len(x) for x in lines[inv].splitlines())
    if frontier.decisions:  # word for word, outside the frontier's share: budget.ORDER
        lines[inv] += "\n" + "\n".join(
            [
                DECISIONS_HEADING,
                *(
                    DECISION_MARK + one_line(d, MAX_DECISION_CHARS)
                    for d in frontier.decisions[-MAX_DECISIONS:]
                ),
            ]
        )

    def fitting(items: Sequence[str]) -> list[str]:
        nonlocal left
        out: list[str] = []
        for item in items:
            entry = one_line(item)
            if len(entry) + 4 > left:
                break
            out.append(entry)
            left -= len(entry) + 4
        return out

    extra: list[str] = []
    if standing := standing_line(frontier.standing):
        extra.append(standing)
    for label, items in (
        ("Open", frontier.open),
        ("Next", (frontier.next,) if frontier.next else ()),
        ("Instructions in force", frontier.instructions[-2:]),
    ):
        if kept_items := fitting(items):
            extra.append(f"- {label}: " + "; ".join(kept_items))
    if done := fitting(frontier.done[-5:]):
        extra.append(f"{DONE_HEADING} " + "; ".join(done))
    # the Current state section runs to the end of the template (a blank line or a note)
    end = cur + 1
    while end < len(lines) and lines[end].strip() and not lines[end].startswith("_"):
        end += 1
    return "\n".join([*lines[:end], *extra, *lines[end:]])
