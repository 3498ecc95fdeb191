"""The fact guard's **Pinned facts** section: :func:`pin` appends the facts a summary
missed, listed by value one line per kind and quoted with their line and message, in a
bounded budget."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from langchain_core.messages import BaseMessage

from offpath.compaction.facts.extraction import Fact, extract, rank
from offpath.compaction.facts.patterns import find, normal
from offpath.compaction.facts.reading import _blocks
from offpath.compaction.facts.sections import (
    _SIGNATURE,
    MAX_LINE_CHARS,
    PINNED_HEADING,
    STATED_LABEL,
    _around,
    _blob,
)
from offpath.compaction.summary import cite

#: The smallest section budget (chars) that lists the values stated on lines of their own:
#: a label more per kind; below it they share their kind's line (issue 19's small budgets,
#: tau-bench at 4,000 / 1,500: 95.1% of the ground truth visible, 93.8% with the lines apart).
STATED_LINE_MIN_BUDGET = 1_000
#: The smallest section budget (chars) that keeps a quarter for quoted lines (:func:`pin`).
QUOTED_SHARE_MIN_BUDGET = 1_000


@dataclass(frozen=True, slots=True)
class Pinned:
    """What :func:`pin` added: the entries, and how many facts they cover."""

    entries: tuple[str, ...]
    facts: int


def pin(
    summary_text: str,
    removed: Sequence[BaseMessage],
    max_chars: int,
    kept: Sequence[BaseMessage] = (),
    header: str | None = None,
) -> tuple[str, Pinned]:
    """``summary_text`` with a **Pinned facts** section holding, most important first, the
    facts of ``removed`` that neither the summary nor the ``kept`` messages contain (in any
    letter case), in at most ``max_chars`` chars (0: no section).

    The facts are listed by value first, densely, one line per kind (``- ids: OBUT9V,
    credit_card_9513926``; ``- times: 2024-05-20``): an identifier costs its length and two
    chars, where quoting its line cost ~90 (issue 19: at a 4,000-char threshold the section
    held two or three facts); on a budget of :data:`STATED_LINE_MIN_BUDGET` or more, those
    the agent or the user stated on a line of their own (``- ids (stated): ...``), which the
    next summary reads back as stated (issue 22). The facts an earlier summary carried come
    first (no telephone game), in up to 60% of the budget while new facts wait, then the new
    ones by rank (:func:`rank`), then the carried ones left. A fact inside a value listed already is not
    listed again. What the values leave (and, on a budget of 1,000 chars or more, a quarter
    kept for them) quotes the lines the highest-ranked facts were found on (at most
    :data:`MAX_LINE_CHARS` chars, in conversation order, citing their message; near-duplicate
    lines once, "; +N similar"); a quoted line takes the place of the values it holds.
    ``recall`` finds each value in the archive. ``header``: the section's heading line
    (default: the Pinned facts one). Returns the text and what was pinned; the text is
    unchanged when nothing is missing."""
    if max_chars <= 0:
        return summary_text, Pinned((), 0)
    from offpath.compaction.accounting import render_content

    present = normal(summary_text + "\n" + "\n".join(render_content(m.content) for m in kept))
    if header is None:
        header = f"{PINNED_HEADING} (`recall` finds each):"
    header = f"\n\n{header}"
    budget = max_chars - len(header)
    if budget <= 0:
        return summary_text, Pinned((), 0)
    # a quoted line's length follows the budget: a small one is better spent on values
    line_max = max(60, min(MAX_LINE_CHARS, budget // 6))
    position = {str(m.id): i for i, m in enumerate(removed)}
    ranked = [f for f in rank(extract(removed)) if f.score > 0]
    absent: dict[str, bool] = {}  # value -> not in the summary nor the keep window

    def missing(fact: Fact) -> bool:
        # tested only for a fact that would fit the budget left: the summary and the keep
        # window are tens of thousands of chars, a thread's facts hundreds (issue 13)
        if fact.value not in absent:
            absent[fact.value] = normal(fact.value) not in present
        return absent[fact.value]

    pinned = ""  # the values listed and the lines quoted so far
    listed: dict[str, list[Fact]] = {}  # label -> facts listed by value, in rank order
    used = 0
    quoted: list[tuple[int, int, str, str]] = []
    similar: dict[str, int] = {}
    lines_text = ""

    # 0. what the kept messages name (the agent's or the user's words, a tool's argument)
    #    that a removed tool result holds: that line (its record) is quoted first, in up to
    #    a quarter of the budget, though the value itself stays in view (issue 19: a
    #    compaction prepared again after a message named an id kept the name, not the record;
    #    a kept result that echoes the id may not hold the record either)
    if kept:
        named = normal(
            "\n".join(t for m in kept for t, role, _ in _blocks(m) if role in ("agent", "user"))
        )
        data_ids = {str(m.id) for m in removed if m.type == "tool"}
        said = normal(summary_text)
        for fact in ranked:
            if budget // 4 - used < 60:
                break
            if fact.message_id not in data_ids or fact.value in lines_text:
                continue
            value = normal(fact.value)
            if value not in named or value in said:
                continue
            line = _around(fact.line, max(0, fact.line.find(fact.value)), fact.value, line_max)
            if all(normal(v) == value or normal(v) in present for v, _, _ in find(line)):
                continue  # the line says nothing the kept messages do not: no record
            entry = f"\n- `{line.replace('`', chr(39))}` ({cite(fact.message_id)})"
            if used + len(entry) + 14 > budget // 4:
                continue
            signature = _SIGNATURE.sub("#", fact.line.casefold())
            similar[signature] = 0
            quoted.append((position.get(fact.message_id, 0), fact.order, entry, signature))
            used += len(entry) + 14
            lines_text += "\n" + line
            pinned += "\n" + line

    def cost(fact: Fact, label: str) -> int:
        return len(_shown(fact.value)) + (2 if listed.get(label) else len(label) + 5)

    def add(fact: Fact, room: int) -> None:
        nonlocal used, pinned
        if fact.value in pinned or room - used < len(fact.value) + 2:
            return
        label = _label(fact, budget >= STATED_LINE_MIN_BUDGET)
        took = cost(fact, label)
        if used + took > room or not missing(fact):
            return
        listed.setdefault(label, []).append(fact)
        used += took
        pinned += "\n" + fact.value

    # 1. values: carried first, then new, then the carried left; on a large budget a quarter
    #    waits for the quoted lines (filled with values after them when they leave it)
    values_room = budget - (budget // 4 if budget >= QUOTED_SHARE_MIN_BUDGET else 0)
    carried_room = values_room * 3 // 5 if any(not f.carried for f in ranked) else values_room
    for fact in ranked:
        if fact.carried:
            add(fact, carried_room)
    for fact in ranked:
        if not fact.carried:
            add(fact, values_room)
    for fact in ranked:
        if fact.carried:
            add(fact, values_room)

    # 2. quoted lines, most important first, in what the values leave: a line takes the
    #    place of the values listed from it (its message's values that are on it)
    for fact in ranked:
        if budget - used < 60 and not listed:
            break
        if fact.value in lines_text or fact.line in ("", fact.value) or not missing(fact):
            continue
        signature = _SIGNATURE.sub("#", fact.line.casefold())
        if signature in similar:
            similar[signature] += 1
            continue
        line = fact.line
        if len(line) > line_max:
            line = _around(line, max(0, line.find(fact.value)), fact.value, line_max)
        if _blob(line):  # a fact inside one long line of JSON: listed by value
            continue
        entry = f"\n- `{line.replace('`', chr(39))}` ({cite(fact.message_id)})"
        on_line = {
            label: [f for f in facts if f.message_id == fact.message_id and f.value in line]
            for label, facts in listed.items()
        }
        freed = sum(
            sum(len(_shown(f.value)) + 2 for f in facts)
            + (len(label) + 3 if len(facts) == len(listed[label]) else 0)
            for label, facts in on_line.items()
            if facts
        )
        if len(entry) + 14 > budget - used + freed:  # with room for "; +N similar"
            continue
        for label, facts in on_line.items():
            listed[label] = [f for f in listed[label] if f not in facts]
        similar[signature] = 0
        quoted.append((position.get(fact.message_id, 0), fact.order, entry, signature))
        used += len(entry) + 14 - freed
        lines_text += "\n" + line
        pinned += "\n" + line
    # 3. the values that still fit, in what the quoted lines left
    for fact in ranked:
        add(fact, budget)

    entries = []
    for _, _, entry, signature in sorted(quoted):
        if similar[signature]:
            entry = entry[:-1] + f"; +{similar[signature]} similar)"
        entries.append(entry)
    for label, facts in listed.items():
        if facts:
            entries.append(f"\n- {label}: " + ", ".join(_shown(f.value) for f in facts))
    if not entries:
        return summary_text, Pinned((), 0)
    covered = sum(fact.value in pinned and missing(fact) for fact in ranked)
    return summary_text.rstrip() + header + "".join(entries), Pinned(tuple(entries), covered)


#: The label of the line a fact is listed on by value, by its kind (the rest: ``ids``).
_LABELS = {
    "timestamp": "times",
    "error_code": "errors",
    "config": "settings",
    "quantity": "amounts",
    "number": "numbers",
    "version": "versions",
    "path": "paths",
    "url": "urls",
}


def _label(fact: Fact, stated_line: bool = True) -> str:
    """The line ``fact`` is listed on: its kind's label (a value known only as a tool's
    argument: by the kind :func:`find` gives it whole, a date, a number, else ``ids``),
    followed by :data:`STATED_LABEL` for a value the agent or the user stated when
    ``stated_line`` (its own line: the next summary reads it back as stated)."""
    kind = fact.kind
    if kind == "argument":
        found = find(fact.value)
        if len(found) == 1 and found[0][0] == fact.value:
            kind = found[0][1]
    stated = stated_line and (fact.stated or fact.asked)
    return _LABELS.get(kind, "ids") + (STATED_LABEL if stated else "")


def _shown(value: str) -> str:
    """``value`` as a dense line lists it: bare, quoted as code only when it holds the
    separator (``, ``); never a backtick of its own."""
    value = value.replace("`", "'")
    return f"`{value}`" if ", " in value else value
