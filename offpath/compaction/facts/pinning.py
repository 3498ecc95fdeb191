"""What the fact guard adds to a summary for the facts it would lose: the **Pinned facts**
section (:func:`pin` appends the facts a summary missed, listed by value one line per kind and
quoted with their line and message, in a bounded budget), and the check before the swap
(:func:`swap_check`: the identifiers that messages written while a summary was prepared name,
which only the part it removes held, quoted under
:data:`~offpath.compaction.facts.sections.SWAP_HEADING`).
"""

from __future__ import annotations

import functools
import itertools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from langchain_core.messages import BaseMessage

from offpath.compaction.facts.extraction import Fact, extract_ranked
from offpath.compaction.facts.patterns import find, held_in, normal, stands_in
from offpath.compaction.facts.reading import fact_blocks, read_back, tool_arguments
from offpath.compaction.facts.sections import (
    AGE_MARK,
    ASKED_LABEL,
    MAX_LINE_CHARS,
    PINNED_HEADING,
    SAID_LABEL,
    SAID_MARK,
    SIGNATURE,
    STATED_LABEL,
    SWAP_HEADING,
    clip_around,
    is_blob,
)
from offpath.compaction.fields import message_field
from offpath.compaction.standing import is_standing, standing_blocks
from offpath.compaction.summary import archived_as, cite, is_summary, looks_like_instruction

#: The smallest section budget (chars) that lists the values stated on lines of their own:
#: a label more per kind; below it they share their kind's line (on small budgets, tau-bench
#: at 4,000 / 1,500: 95.1% of the ground truth visible, 93.8% with the lines apart).
STATED_LINE_MIN_BUDGET = 1_000
#: The smallest section budget (chars) that keeps a quarter for quoted lines (:func:`pin`).
QUOTED_SHARE_MIN_BUDGET = 1_000
#: Most compactions a quoted line is carried for: an older one gives its place to newer
#: lines, its values listed (a line quoted at every compaction of a long session holds the
#: room of a dozen values).
QUOTED_AGE_MAX = 3


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
    stated_lines: bool | None = None,
    lost: Sequence[Fact] = (),
) -> tuple[str, Pinned]:
    """``summary_text`` with a **Pinned facts** section holding, most important first, the
    facts of ``removed`` that neither the summary nor the ``kept`` messages contain (in any
    letter case, as a token of its own: :func:`~offpath.compaction.facts.patterns.stands_in`;
    ``loki`` inside ``loki-0`` names another thing), in at most ``max_chars`` chars (0: no
    section). What the agent said or the user named counts as contained only in the summary
    or in the agent's and the user's kept words: a kept tool output that echoes it is
    shortened, or goes at a later compaction, unread for names.

    The facts are listed by value first, densely, one line per kind (``- ids: OBUT9V,
    credit_card_9513926``; ``- times: 2024-05-20``): an identifier costs its length and two
    chars, where quoting its line costs ~90 (at a 4,000-char threshold the section would hold
    two or three facts); on a budget of :data:`STATED_LINE_MIN_BUDGET` or more, those the
    agent or the user stated on a line of their own (``- ids (stated): ...``), which the
    next summary reads back as stated. The facts an earlier summary carried come
    first (no telephone game), in up to 60% of the budget while new facts wait, those the
    agent or the user stated first and each span's in turn (a line of values keeps one group
    per span, ``; `` between them, oldest first); then the new ones, stated first, by rank
    (:func:`rank`); then the carried ones left. A fact listed already (as a token of its own) is
    not listed again. Values only tool output holds are last: opaque ones (times of day,
    request, trace and hex ids) and those that share one shape (4 or more
    ``/api/cart/<n>/items``) as one line per kind or shape (a time range, a count and a
    ``recall`` query), in what the rest leaves. What the values leave (and, on a budget of
    1,000 chars or more, a quarter kept for them, but for what the agent said and the user
    named, which may fill it) quotes the lines the highest-ranked facts were found on (at most
    :data:`MAX_LINE_CHARS` chars, in conversation order, citing their message, marked
    "; said" for the agent's own message and "; age N" when carried from N compactions
    before; near-duplicate lines once, "; +N similar"); a quoted line takes the place of the
    values it holds that the next summary reads back from it
    (:func:`~offpath.compaction.facts.reading.read_back`): one known only as a tool's
    argument stays listed.
    ``recall`` finds each value in the archive. ``header``: the section's heading line
    (default: the Pinned facts one). ``stated_lines``: whether the values stated are on lines
    of their own whatever the budget (None: by the budget). ``lost``: facts earlier
    compactions took out of view (their loss reports), which ``removed`` may no longer hold:
    those the agent said or the user named, in neither the summary nor the ``kept``
    messages, are listed again right after what ``removed`` holds of the kind, each span's in
    turn (:attr:`Fact.age`), ahead of arguments and of identifiers only tool output holds.
    Returns the text and what was pinned; the text is unchanged when nothing is missing."""
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
    # by the id their facts cite (a request's copy: the request's, :func:`archived_as`)
    position = {archived_as(m): i for i, m in enumerate(removed)}
    by_id = {archived_as(m): m for m in removed}
    facts, by_rank = extract_ranked(removed)
    positive = list(itertools.takewhile(lambda f: f.score > 0, by_rank))  # highest score first
    # the opaque values only tool output holds (score 0: listed one line per kind, step 4);
    # with ``positive`` the only facts whose presence is asked (most of a thread's facts are
    # neither: noise lines' values, bare numbers nobody used)
    opaque = [f for f in facts if f.grouped]
    # the names of the tools called: the agent has them in its tool list, a fact of no task
    # (but where the agent names one in its own words, or the user does)
    tools = _tool_names([*removed, *kept])
    ranked = [f for f in positive if f.value not in tools or _own(f)]
    alike = _alike(ranked)
    if alike:
        ranked = [f for f in ranked if id(f) not in alike]
    held: set[str] | None = None  # the facts' forms the summary or the keep window holds
    # ... and those the summary or the agent's and the user's words in the keep window hold:
    # what the agent said or the user named (now, or carried by an earlier summary) is pinned
    # while only a kept tool output holds it too (that output is shortened, or goes at a
    # later compaction, and tool output is not read for names: the value would go with it)
    held_said: set[str] | None = None

    @functools.cache
    def said_text() -> str:
        """The summary and the agent's and the user's words in the keep window."""
        words = "\n".join(t for m in kept for t, role, _ in fact_blocks(m) if role != "data")
        return normal(summary_text + "\n" + words)

    forms: dict[str, str] = {}  # value -> its form looked for (see ``form``)

    def form(fact: Fact) -> str:
        # a name, or a value that is a fact only where it stood (a word passed to a tool, or
        # the user asked about), is found again only in backticks: a summary that wrote it
        # bare holds it for the model, but not for the next summary's reading
        bare = fact.kind != "name" and read_bare(fact.value)
        return normal(fact.value if bare else f"`{fact.value}`")

    # what earlier compactions lost that the agent said or the user named, and nothing in
    # view holds: its values, as the summaries that dropped them listed them
    again = [f for f in lost if _own(f) and f.value not in tools]
    if again:
        shown = held_in((form(f) for f in again), said_text(), whole=True)
        again = [f for f in again if form(f) not in shown]
    again_ids = {id(f) for f in again}

    def missing(fact: Fact) -> bool:
        # not in the summary nor the keep window: all the facts are looked for in one pass
        # over them, the first time one is asked about (tens of thousands of chars, a
        # thread's facts hundreds)
        nonlocal held, held_said
        if id(fact) in again_ids:  # looked for above
            return True
        if held is None:
            forms.update((f.value, form(f)) for f in (*positive, *opaque))
            held = held_in(forms.values(), present, whole=True)
        if _own(fact):
            if held_said is None:
                held_said = held_in(
                    (forms.get(f.value) or form(f) for f in positive if _own(f)),
                    said_text(),
                    whole=True,
                )
            return (forms.get(fact.value) or form(fact)) not in held_said
        looked_for = forms.get(fact.value)
        if looked_for is None:  # not one of those looked for at once: looked for alone
            return not stands_in(form(fact), present)
        return looked_for not in held

    pinned = ""  # the values listed and the lines quoted so far
    listed: dict[str, list[Fact]] = {}  # label -> facts listed by value, in rank order
    used = 0
    quoted: list[tuple[int, int, str, str]] = []
    similar: dict[str, int] = {}
    lines_text = ""
    values_text = ""  # the values listed so far
    read: set[str] = set()  # the values the next summary reads back from the quoted lines

    # 0. what the kept messages name (the agent's or the user's words, a tool's argument)
    #    that a removed tool result holds: that line (its record) is quoted first, in up to
    #    a quarter of the budget, though the value itself stays in view (a
    #    compaction prepared again after a message names an id keeps the name, not the record;
    #    a kept result that echoes the id may not hold the record either)
    if kept:
        named = normal(
            "\n".join(
                t
                for m in kept
                for t, role, _ in fact_blocks(m)
                if role in ("agent", "action", "user")
            )
        )
        data_ids = {archived_as(m) for m in removed if m.type == "tool"}
        said = normal(summary_text)
        for fact in ranked:
            if budget // 4 - used < 60:
                break
            if fact.message_id not in data_ids or stands_in(fact.value, lines_text):
                continue
            value = normal(fact.value)
            if value not in named or value in said:
                continue
            line = clip_around(fact.line, max(0, fact.line.find(fact.value)), fact.value, line_max)
            if all(normal(v) == value or normal(v) in present for v, _, _ in find(line)):
                continue  # the line says nothing the kept messages do not: no record
            entry = f"\n- `{line.replace('`', chr(39))}` ({cite(fact.message_id)})"
            if used + len(entry) + 14 > budget // 4:
                continue
            signature = SIGNATURE.sub("#", fact.line.casefold())
            similar[signature] = 0
            quoted.append((position.get(fact.message_id, 0), fact.order, entry, signature))
            used += len(entry) + 14
            lines_text += "\n" + line
            pinned += "\n" + line
            read.update(read_back(line))

    def carried_on(value: str) -> bool:
        # listed already (as a token of its own), or on a quoted line the next summary
        # reads it back from: a value a line holds but no reading finds there (an id known
        # only as a tool's argument) is listed still, or the summary after loses it
        return stands_in(value, values_text) or (
            stands_in(value, lines_text) and any(stands_in(value, v) for v in read)
        )

    def cost(fact: Fact, label: str) -> int:
        return len(_shown(fact.value)) + (2 if listed.get(label) else len(label) + 5)

    def add(fact: Fact, room: int) -> None:
        nonlocal used, pinned, values_text
        # the cheap tests first: once the room is spent, most facts end here; a fact the
        # summary or the keep window holds needs no label
        if room - used < len(fact.value) + 2 or carried_on(fact.value) or not missing(fact):
            return
        label = _label(
            fact, budget >= STATED_LINE_MIN_BUDGET if stated_lines is None else stated_lines
        )
        took = cost(fact, label)
        if used + took > room:
            return
        listed.setdefault(label, []).append(fact)
        used += took
        pinned += "\n" + fact.value
        values_text += "\n" + fact.value

    # 1. values: first what the agent said in its own words and what the user named: every
    #    span's in turn by the room they take, the shortest first, the new ones as the
    #    newest span (each span keeps its share of the room: no middle of the session drops
    #    out, the older ones hold fewer as spans are added; a long URL waits for the short
    #    values of every span); then what the agent or the user stated otherwise (a tool call's
    #    argument), then the rest: of each, the carried ones first, in up to 60% while new
    #    ones wait, each span's in turn, then the new ones, then the carried ones left. On a
    #    large budget a quarter waits for the quoted lines (filled with values after them
    #    when they leave it)
    values_room = budget - (budget // 4 if budget >= QUOTED_SHARE_MIN_BUDGET else 0)
    own = sorted((f for f in ranked if _own(f)), key=lambda f: len(f.value))
    for fact in _by_share(own):
        # what the agent said and the user named may take the quoted lines' quarter too:
        # listed bare, one costs its length and two chars, quoted ~100
        add(fact, budget)
    # then what they said or named that an earlier compaction took out of view: ahead of a
    # tool's arguments and of what only tool output holds, each span's in turn
    for fact in _by_share(again):
        add(fact, values_room)
    carried_room = values_room * 3 // 5 if any(not f.carried for f in ranked) else values_room
    for relied in (True, False):
        carried = _by_span([f for f in ranked if f.carried and _relied(f) == relied])
        for fact in carried:
            add(fact, carried_room)
        for fact in ranked:
            if not fact.carried and _relied(fact) == relied:
                add(fact, values_room)
        for fact in carried:
            add(fact, values_room)

    # 2. quoted lines, what the agent or the user stated first, then by rank, in what the
    #    values leave: a line takes the place of the values listed from it (its message's
    #    values that are on it); while some of what the agent said or the user named found
    #    no room (``scarce``), those listed stay listed and their own lines are not quoted
    scarce = any(_own(f) and not stands_in(f.value, pinned) and missing(f) for f in ranked)

    def keep_listed(f: Fact) -> bool:
        # on a large budget what the agent or the user stated stays listed beside its line:
        # a summary over its budget gives up quoted lines first, and the next one carries
        # the values it lists; on a small one a line takes their place (room for one more)
        if budget >= QUOTED_SHARE_MIN_BUDGET:
            return _relied(f)
        return scarce and _own(f)

    for fact in sorted(ranked, key=lambda f: not _relied(f)):
        if budget - used < 60 and not listed:
            break
        if stands_in(fact.value, lines_text) or fact.line in ("", fact.value) or not missing(fact):
            continue
        if scarce and _own(fact) and not fact.carried and stands_in(fact.value, pinned):
            continue  # listed by value already, while others wait: its line would cost ~100
            # chars more (a line an earlier summary concluded is quoted still: its words are
            # the finding)
        if fact.carried and fact.age + 1 > QUOTED_AGE_MAX:
            continue  # quoted for as many compactions: newer lines take its place, its
            # values stay listed
        signature = SIGNATURE.sub("#", fact.line.casefold())
        if signature in similar:
            similar[signature] += 1
            continue
        line = fact.line
        if len(line) > line_max:
            line = clip_around(line, max(0, line.find(fact.value)), fact.value, line_max)
        if is_blob(line):  # a fact inside one long line of JSON: listed by value
            continue
        # a line of the agent's message is marked so; lines keep their backticks: their names
        # are found again when the next summary reads them back
        agent_said = fact.stated and getattr(by_id.get(fact.message_id), "type", "ai") == "ai"
        marks = (SAID_MARK if agent_said else "") + (
            f"{AGE_MARK}{fact.age + 1}" if fact.carried else ""
        )
        entry = f"\n- `{line}` ({cite(fact.message_id)}{marks})"
        # while some wait, what the agent said and the user named stays listed by value beside
        # the line: a summary over its budget gives up quoted lines first. A value the next
        # summary would not read back from the line (one known only as a tool's argument,
        # of no shape of its own) stays listed too
        found = read_back(line)
        on_line = {
            label: [
                f
                for f in values
                if f.message_id == fact.message_id
                and any(f.value in v for v in found)
                and not keep_listed(f)
            ]
            for label, values in listed.items()
        }
        freed = sum(
            sum(len(_shown(f.value)) + 2 for f in values)
            + (len(label) + 3 if len(values) == len(listed[label]) else 0)
            for label, values in on_line.items()
            if values
        )
        if len(entry) + 14 > budget - used + freed:  # with room for "; +N similar"
            continue
        for label, values in on_line.items():
            listed[label] = [f for f in listed[label] if f not in values]
        similar[signature] = 0
        quoted.append((position.get(fact.message_id, 0), fact.order, entry, signature))
        used += len(entry) + 14 - freed
        lines_text += "\n" + line
        pinned += "\n" + line
        read.update(found)
    # 3. the values that still fit, in what the quoted lines left
    for fact in (*_by_share(again), *ranked):
        add(fact, budget)
    # 4. the opaque values only tool output holds, one line per kind, in what is left
    if alike:  # in the facts' order, as the opaque ones are
        chosen = {id(f) for f in opaque}.union(alike)
        candidates = [f for f in facts if id(f) in chosen]
    else:
        candidates = opaque
    grouped = _grouped(
        [f for f in candidates if f.value not in pinned and missing(f)],
        alike,
    )
    for entry in grouped:
        if used + len(entry) <= budget:
            used += len(entry)
            pinned += entry

    entries = []
    for _, _, entry, signature in sorted(quoted):
        if similar[signature]:
            entry = entry[:-1] + f"; +{similar[signature]} similar)"
        entries.append(entry)
    for label, values in listed.items():
        if values:
            entries.append(f"\n- {label}: " + _spans(values))
    entries += [e for e in grouped if e in pinned]
    if not entries:
        return summary_text, Pinned((), 0)
    # the facts with a score and the opaque ones (whose score is 0: the two never overlap)
    covered = sum(stands_in(fact.value, pinned) and missing(fact) for fact in (*positive, *opaque))
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
    "address": "addresses",
    "name": "names",
    "term": "names",
    "line": "lines",
    "function": "names",
    "env": "names",
}


def _tool_names(messages: Sequence[BaseMessage]) -> set[str]:
    """The names of the tools that ``messages`` call."""
    return {
        str(call.get("name"))
        for m in messages
        for call in message_field(m, "tool_calls") or []
        if call.get("name")
    }


def _by_span(facts: Sequence[Fact]) -> list[Fact]:
    """``facts`` (carried, in rank order) taking turns by span: the first of each span
    (:attr:`Fact.age`, oldest first), then the second of each, and so on."""
    spans: dict[int, list[Fact]] = {}
    for f in facts:
        spans.setdefault(f.age, []).append(f)
    order = [spans[age] for age in sorted(spans, reverse=True)]
    return [f for turn in itertools.zip_longest(*order) for f in turn if f is not None]


def _by_share(facts: Sequence[Fact]) -> list[Fact]:
    """``facts`` (shortest first) taking turns by span (:attr:`Fact.age`, the facts not
    carried a span of their own, the newest) by the room they take rather than by count:
    each value comes at the chars its span has listed with it (its length and two chars,
    the shorter ones of its span before it), the oldest span first at a tie. Every span
    keeps its share of the room, and a long value (a 130-char URL holds the room of ten
    names) waits for the shorter ones of every span."""
    spans: dict[int, int] = {}  # age -> chars listed so far
    keyed: list[tuple[int, int, int, Fact]] = []
    for f in facts:
        age = f.age if f.carried else -1
        spans[age] = spans.get(age, 0) + len(f.value) + 2
        keyed.append((spans[age], -age, len(keyed), f))
    return [f for *_, f in sorted(keyed, key=lambda k: k[:3])]


def _spans(facts: Sequence[Fact]) -> str:
    """The values of one line, a group per span, oldest first, ``; `` between groups:
    a carried value in its span's, the new ones last."""
    groups: dict[int, list[str]] = {}
    for f in facts:
        groups.setdefault(f.age + 1 if f.carried else 0, []).append(_shown(f.value))
    return "; ".join(", ".join(groups[k]) for k in sorted(groups, reverse=True))


@functools.lru_cache(maxsize=4_096)
def read_bare(value: str) -> bool:
    """``value`` is a fact when read bare: its kind's pattern finds it whole
    (:func:`~offpath.compaction.facts.patterns.find`), as the next summary's reading of
    this one does. A plain word (``arrays``) is a fact only in backticks, or as a tool's
    argument or a value the user asked about: written bare in a summary it is read as prose."""
    return any(found == value for found, _, _ in find(value))


def _own(fact: Fact) -> bool:
    """The agent said ``fact`` in its own words, or the user named it (now, or as a summary's
    said or asked values): what the section lists first."""
    return fact.said or fact.asked


def _relied(fact: Fact) -> bool:
    """The agent or the user stated ``fact`` (now, or as a summary's stated values)."""
    return fact.stated or fact.asked


def _label(fact: Fact, stated_line: bool = True) -> str:
    """The line ``fact`` is listed on: its kind's label (a value known only as a tool's
    argument: by the kind :func:`find` gives it whole, a date, a number, else ``ids``),
    followed by :data:`STATED_LABEL` for a value the agent or the user stated when
    ``stated_line`` (its own line: the next summary reads it back as stated)."""
    kind = fact.kind
    if kind == "argument":
        kind = whole_kind(fact.value) or kind
    mark = ""
    if stated_line:
        if fact.said:
            mark = SAID_LABEL
        elif fact.asked:
            mark = ASKED_LABEL
        elif fact.stated:
            mark = STATED_LABEL
    return _LABELS.get(kind, "ids") + mark


#: A time of day alone (``14:15``, ``09:30:05``): :func:`find` leaves it to the words around
#: it in prose, but a tool's argument that is all of it is a time (``"since": "14:15"``).
_CLOCK = re.compile(r"^(?:[01]?\d|2[0-3]):[0-5]\d(?::[0-5]\d(?:\.\d+)?)?$")


@functools.lru_cache(maxsize=4_096)
def whole_kind(value: str) -> str | None:
    """The kind :func:`find` gives ``value`` when it finds one fact that is all of it (a time
    of day alone: ``timestamp``), else None (asked once per value: a thread's tool arguments
    repeat across its compactions)."""
    found = find(value)
    if len(found) == 1 and found[0][0] == value:
        return found[0][1]
    return "timestamp" if _CLOCK.match(value) else None


def _shown(value: str) -> str:
    """``value`` as a dense line lists it: bare, quoted as code only when it holds a
    separator (``, `` or ``; ``); never a backtick of its own."""
    value = value.replace("`", "'")
    return f"`{value}`" if ", " in value or "; " in value else value


#: How a line of grouped values names its kind.
_GROUP_NAMES = {"trace_id": "request ids", "uuid": "uuids", "sha": "hex ids"}
_KEY_BEFORE = re.compile(r"([A-Za-z][\w.-]{2,40})[=:]\s*$")


#: Values only tool output holds, of one kind and one shape (``/api/cart/4101/items``,
#: ``/api/cart/4102/items``), at least this many: counted on one line, not listed.
ALIKE_MIN = 4


def _alike(ranked: Sequence[Fact]) -> dict[int, str]:
    """``id(fact) -> shape`` for the facts of ``ranked`` that only tool output holds, seen
    on no line that reports an error, whose kind and shape (:data:`SIGNATURE`: numbers and
    hex ids as ``#``) :data:`ALIKE_MIN` or more of them share."""
    shapes: dict[int, str] = {}
    for f in ranked:
        if f.tool_only and not f.error and f.kind != "timestamp":
            shapes[id(f)] = f"{_label(f, False)} {SIGNATURE.sub('#', f.value.casefold())}"
    count = Counter(shapes.values())
    return {k: shape for k, shape in shapes.items() if count[shape] >= ALIKE_MIN}


def _grouped(facts: Sequence[Fact], alike: dict[int, str]) -> list[str]:
    """The lines that stand for ``facts``, :attr:`Fact.grouped` or ``alike`` (their shapes,
    :func:`_alike`): their times as one range (``- times in tool output:
    2026-03-02T10:02:11Z-10:09:47Z (32)``), their ids as a count per kind with a ``recall``
    query that finds them: the key they follow on their lines (``request_id=``) when most
    share one, else the first of them; values alike as a count per shape with the first."""
    out: list[str] = []
    for shape, group in itertools.groupby(
        sorted((f for f in facts if id(f) in alike), key=lambda f: (alike[id(f)], f.order)),
        key=lambda f: alike[id(f)],
    ):
        values = list(group)
        label = shape.split(" ", 1)[0]
        out.append(
            f"\n- {len(values)} {label} alike in tool output: {_shown(values[0].value)}, ..."
        )
    facts = [f for f in facts if id(f) not in alike]
    times = sorted(f.value for f in facts if f.kind == "timestamp")
    if times:
        first, last = times[0], times[-1]
        for sep in ("T", " "):
            if sep in first and first.split(sep, 1)[0] == last.split(sep, 1)[0]:
                last = last.split(sep, 1)[1]
                break
        shown = first if len(times) == 1 else f"{first}-{last} ({len(times)})"
        out.append(f"\n- times in tool output: {shown}")
    for kind, name in _GROUP_NAMES.items():
        ids = [f for f in facts if f.kind == kind]
        if not ids:
            continue
        keys = Counter(
            m.group(1)
            for f in ids
            if (m := _KEY_BEFORE.search(f.line[: max(0, f.line.find(f.value))]))
        )
        key, count = keys.most_common(1)[0] if keys else (ids[0].value, 0)
        query = key if count * 2 > len(ids) else ids[0].value
        out.append(f'\n- {len(ids)} {name} in tool output, recall("{query}") finds them')
    return out


#: Most chars of one line the check before the swap quotes (around the identifier it is
#: quoted for): the line says where the identifier came from; ``recall`` reads the whole
#: message it cites.
SWAP_LINE_CHARS = 80
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
    ``max_chars`` chars: one quoted line per removed message, the
    message's other identifiers listed by value on one line citing it (``- also in <id>: a,
    b``), as are those found only on lines that say nothing of where they came from
    (:func:`_context_line`). Returns the section ("" when none is needed) and how many such
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
    # a line the later messages hold word for word (a template or a task sent again) is
    # their own context: quoting it from the removed part adds nothing
    said_later = normal("\n".join(" ".join(t.split()) for m in later for t, _, _ in fact_blocks(m)))
    header = f"{SWAP_HEADING} (named by messages that came after it; `recall` reads them):"
    room = max_chars - len(header) - 2
    # one entry per line quoted: the identifiers found on the same line share it
    quoted: dict[tuple[str, int], list[str]] = {}  # (message id, line start) -> clips
    entries: dict[str, str] = {}  # clip -> entry
    # per message, its identifiers past its first quoted line (or on a line that is no
    # context: offpath's own notes, an earlier summary's lists of values), listed by value
    lined: set[str] = set()
    listed: dict[str, list[str]] = {}
    missing = 0
    found: set[str] = set()
    for m in reversed(removed):  # the newest line that holds an identifier quotes it
        own = str(m.id) if is_summary(m) else None
        for text, role, mid in fact_blocks(m):
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
                if normal(" ".join(line.split())) in said_later:
                    continue
                clips = quoted.setdefault((str(mid), start), [])
                if any(value.casefold() in c.casefold() for c in clips):
                    continue  # quoted already with another identifier of its line
                # a line of an earlier summary's own text (its agent's place, its findings:
                # offpath's words, citing the summary) is no record either: listed by value
                if str(mid) in lined or not _context_line(line, role) or str(mid) == own:
                    listed.setdefault(str(mid), []).append(value)
                    continue
                clip = clip_around(line, at - start, value, SWAP_LINE_CHARS)
                clip = clip.replace("`", chr(39))
                entry = f"\n- `{clip}` ({cite(mid)})"
                if clip in entries:
                    continue
                if len(entry) > room:
                    missing += 1
                    continue
                clips.append(clip)
                entries[clip] = entry
                lined.add(str(mid))
                room -= len(entry)
    for mid, values in listed.items():
        shown = [_shown(v) for v in dict.fromkeys(values)]
        while shown:
            entry = f"\n- also in {cite(mid)}: " + ", ".join(shown)
            if len(entry) <= room:
                entries[entry] = entry
                room -= len(entry)
                break
            shown.pop()
            missing += 1
    if not entries:
        return "", missing
    return header + "".join(entries.values()), missing


#: Lines offpath writes itself into a shortened message (its facts, where ``recall`` reads
#: the rest): they hold an identifier but say nothing of where it came from.
_OWN_NOTE = re.compile(r"Facts in (?:it|the part not shown): ")


def _context_line(line: str, role: str) -> bool:
    """``line`` (of a block read with ``role``, :func:`fact_blocks`) says where an identifier
    came from: not one of offpath's own notes in a shortened message, nor an earlier summary's
    list of values (its ids listed, not a line of the conversation)."""
    return not (role.endswith("values") or _OWN_NOTE.search(line))
