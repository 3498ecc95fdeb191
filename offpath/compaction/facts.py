"""The fact guard: the specifics of the removed messages that a summary must not lose (issue 11).

Pure functions, no I/O. :func:`extract` finds the facts of a list of messages with
regular expressions: identifiers (pod, host and service names, ticket and trace ids,
commit SHAs, file paths, URLs), error codes, numbers with units, and timestamps.
:func:`rank` orders them by how often they recur and by whether the agent stated
them itself (its own text and tool-call arguments: its conclusions and actions).
:func:`pin` appends the facts a summary missed as a bounded **Pinned facts**
section; each entry is the line the fact was found on, clipped, with the id of
the message it came from, so the ``recall`` tool can fetch the original from the
archive.

It runs after any summarizer (the LLM's or the offline one): see
:class:`offpath.compaction.summarizers.guarded.GuardedSummarizer`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from langchain_core.messages import BaseMessage

from offpath.compaction.summary import (
    is_summary,
    looks_like_instruction,
    may_hold_instruction,
    summary_body,
)

#: The heading of the section the guard appends (after the seed's four).
PINNED_HEADING = "**Pinned facts**"
#: The heading of the section a compaction applied late adds for the messages that came
#: after its summary was written and that it removes too (LLM-free: their facts, by message;
#: issue 18). Its entries read like pinned ones.
SINCE_HEADING = "**Since this summary was written**"
#: Most chars of one pinned entry's quoted line.
MAX_LINE_CHARS = 160
#: Facts listed by value (after the quoted lines) need at least this score: stated by the
#: agent, or recurring; a request id seen once in a log dump is left to ``recall``.
LISTED_MIN_SCORE = 5

# Kinds, most specific first: a span taken by one kind is not matched again by a later one.
# A kind may have several patterns (tried in turn). Each pattern opens with the char class
# of its first char and checks the char before it by a look-behind *after* that char
# (``\d(?<!\w\d)`` rather than ``\b\d``): the regex engine then skips, in C, every position
# whose char cannot start a fact (issue 13: the guard's scan was most of a job's CPU).
_UNITS = (
    r"(?:ms|µs|us|ns|s|sec|secs|seconds?|min|mins|minutes?|h|hrs?|hours?|days?|%|[KMGT]i?B?|"
    r"[KMGT]iB|bytes?|cores?|nanocores|millicores|m?cpus?|req/s|rps|qps|ops/s|conns?|connections)"
)
_KINDS: tuple[tuple[str, re.Pattern[str], int], ...] = (
    ("url", re.compile(r"https?://[^\s'\"<>()\[\]{}`]+[^\s'\"<>()\[\]{}`.,;:!?]"), 3),
    (
        "timestamp",
        re.compile(
            r"\d(?<!\w\d)(?:\d{3}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?(?:\.\d+)?"
            r"(?:Z|[+-]\d{2}:?\d{2})?)?"
            r"|\d?:\d{2}:\d{2}(?:\.\d+)?Z?\b|\d?:\d{2}Z?(?= ?(?:UTC|GMT|Z)\b))"
        ),
        2,
    ),
    (
        "path",  # absolute or relative to ~, . or ..: two segments at least
        re.compile(
            r"(?:~/(?<![\w/.~-]~/)|\.\./(?<![\w/.~-]\.\./)|\./(?<![\w/.~-]\./)|/(?<![\w/.~-]/))"
            r"[\w.@+-]++(?:/[\w.@+-]++)+/?"
        ),
        3,
    ),
    ("path", re.compile(r"\w(?<!\w\w)[\w.-]*+(?:/[\w.@+-]+)+\.[A-Za-z]\w{0,5}\b"), 3),  # a/b.py
    ("ticket", re.compile(r"[A-Z](?<![\w.-][A-Z])[A-Z0-9]{1,9}-\d{1,7}(?![\w.-])"), 3),
    (
        "trace_id",
        re.compile(
            r"[TtSsRrCc](?<!\w[TtSsRrCc])(?i:(?<=t)race|(?<=s)pan|(?<=r)equest|(?<=c)orrelation)"
            r"[_-]?(?i:id)[=: ]+([\w-]{6,})"
        ),
        3,
    ),
    (
        "sha",  # 7-40 hex chars with a letter and a digit among them
        re.compile(
            r"[0-9a-f](?<![\w.-][0-9a-f])(?=[0-9a-f]{6})(?:(?<=[a-f])|(?=[0-9a-f]{0,38}[a-f]))"
            r"(?:(?<=\d)|(?=[0-9a-f]{0,38}\d))[0-9a-f]{6,39}(?![\w.-])"
        ),
        3,
    ),
    (
        "error_code",
        re.compile(
            r"[sce45A-Z](?<!\w.)(?:(?<=H)TTP[=: ]+\d{3}\b|(?<=s)tatus[=: ]+\d{3}\b"
            r"|(?<=c)ode[=: ]+\d{3}\b|(?<=e)xit (?:code|status)[=: ]+\d{3}\b"
            r"|(?<=[45])\d\ds?(?= (?:errors?|responses?|status|Bad|Service|Gateway|Internal|"
            r"Not Found|Forbidden|Unauthorized|Too Many)\b)"
            r"|(?<=[A-Z])[A-Za-z]*+(?:(?<=[A-Za-z]Error)|(?<=[A-Za-z]Exception)"
            r"|(?<=[A-Za-z]BackOff)|(?<=[A-Za-z]Killed)|(?<=[A-Za-z]Failure)"
            r"|(?<=[A-Za-z]Timeout))\b"
            r"|(?<=E)(?:CONNREFUSED|CONNRESET|CONNABORTED|TIMEDOUT|HOSTUNREACH|NETUNREACH|"
            r"ADDRINUSE|ACCES|PERM|PIPE|AGAIN|NOENT|NOSPC|MFILE|NOTFOUND|NOMEM|AI_AGAIN)\b"
            r"|(?:(?<=E)(?:RR)?|(?<=O)RA|(?<=S)QLSTATE)[-_ ]?\d{3,5}\b)"
        ),
        3,
    ),
    (
        "quantity",  # a number with a unit, or a ratio n/m
        re.compile(
            r"\d(?:(?<![\w.]\d)[\d,]*+(?:\.\d+)?\s?" + _UNITS + r"(?![\w/])"
            r"|(?<![\w./]\d)\d*+/\d+(?![\w/.]))"
        ),
        2,
    ),
    (
        "identifier",
        re.compile(r"[A-Za-z](?<![\w./-][A-Za-z])\w*+(?:[-.:]\w+)+(?![\w/-])"),
        2,
    ),
)
_WEIGHT = {kind: weight for kind, _, weight in _KINDS}
#: An identifier without digits is a fact only with one of these parts (a service's usual
#: names) or at least two separators; ``read-only`` and ``well-known`` are words, not names.
_SERVICE_PARTS = frozenset(
    "api service svc worker web app db database cache redis postgres mysql mongo kafka proxy "
    "gateway server primary replica queue broker controller operator agent node cluster pod "
    "deployment ingress frontend backend auth payments checkout ledger loki prometheus grafana "
    "nginx envoy istio etcd coredns kube".split()
)
_WORDS = re.compile(r"[a-z]+")
_DIGIT = re.compile(r"\d")


@dataclass(slots=True)
class Fact:
    """One fact: its ``value`` (as written), ``kind``, the id of the first message it was seen
    in and the line there, how many messages hold it, and whether the agent stated it."""

    value: str
    kind: str
    message_id: str
    line: str
    messages: int = 1
    stated: bool = False
    order: int = 0
    _seen: set[str] = field(default_factory=set, repr=False)

    @property
    def score(self) -> int:
        """Higher first: kind weight, +3 if the agent stated it, + up to 3 for recurrence."""
        return _WEIGHT[self.kind] + 3 * self.stated + min(self.messages - 1, 3)


def find(text: str) -> list[tuple[str, str, int]]:
    """The facts in ``text`` as ``(value, kind, offset)``, in order of appearance. Each char
    belongs to one fact at most: the first kind (most specific) to match it takes it."""
    taken = bytearray(len(text))  # 1 where a fact already is: one C-level scan per check
    out: list[tuple[str, str, int]] = []
    for kind, pattern, _ in _KINDS:
        for m in pattern.finditer(text):
            group = m.lastindex or 0  # a kind with a group: the value is the group
            start, end = m.span(group)
            if taken.find(1, start, end) != -1:
                continue
            value = m.group(group).rstrip(".,:;")
            if "\n" in value or (kind == "identifier" and not _is_name(value)):
                continue
            if kind == "quantity" and value.count("/") > 1:
                continue
            taken[start:end] = b"\x01" * (end - start)
            out.append((value, kind, start))
    out.sort(key=lambda f: f[2])
    return out


def _is_name(value: str) -> bool:
    if _DIGIT.search(value):
        return len(value) >= 4
    if value.count("-") + value.count(".") + value.count(":") >= 2:
        return not value.endswith((".py", ".md")) or "/" in value
    return any(w in _SERVICE_PARTS for w in _WORDS.findall(value.lower()))


#: An entry of an earlier summary's Pinned facts: a quoted line, or values by message.
_QUOTED = re.compile(r"^- `(?P<line>.*)` \((?P<id>[^()\s]+)\)$")
_LISTED = re.compile(r"^- also in (?P<id>\S+): (?P<values>.*)$")


def _blocks(message: BaseMessage) -> Iterable[tuple[str, bool, str]]:
    """``(text, stated, message_id)`` for each block of a message worth reading for facts;
    ``stated``: the agent's own words or actions (its text, its tool-call arguments). An
    earlier summary's pinned entries are read as the line they quote and the message they
    name, so that a fact pinned again keeps its source and is not quoted twice over."""
    from offpath.compaction.prompt import render_content

    mid = str(message.id)
    if is_summary(message):
        text = summary_body(message)
        cut = min(
            (i for i in (text.find(PINNED_HEADING), text.find(SINCE_HEADING)) if i >= 0),
            default=len(text),
        )
        body, pinned = text[:cut], text[cut:]
        yield body, True, mid  # an earlier summary is what the agent concluded before
        for line in pinned.splitlines()[1:]:
            if quoted := _QUOTED.match(line.strip()):
                yield quoted["line"], True, quoted["id"]
            elif listed := _LISTED.match(line.strip()):
                yield listed["values"].replace("`", ""), True, listed["id"]
        return
    yield render_content(message.content), message.type == "ai", mid
    for call in getattr(message, "tool_calls", None) or []:
        # the call with the first line of each argument is the agent's action (stated); the
        # rest of a multi-line argument (a heredoc, a file's new content) is data it wrote
        args = call.get("args") or {}
        heads = {k: v.split("\n", 1)[0] if isinstance(v, str) else v for k, v in args.items()}
        yield f"{call.get('name')}({json.dumps(heads, ensure_ascii=False, default=str)})", True, mid
        for value in args.values():
            if isinstance(value, str) and "\n" in value:
                yield value.split("\n", 1)[1], False, mid


def extract(messages: Sequence[BaseMessage]) -> list[Fact]:
    """The facts of ``messages``, one per distinct value, with where each was first seen
    (the line it is on).

    Lines that read as instructions to an assistant (injected text) are skipped: their
    contents are never pinned into a summary, which the model reads in the user's role.
    """
    facts: dict[str, Fact] = {}
    for m in messages:
        for text, stated, mid in _blocks(m):
            instruction: dict[int, bool] = {}  # line start -> the line reads as one
            test_lines = may_hold_instruction(text)
            for value, kind, offset in find(text):
                fact = facts.get(value)
                if fact is None or test_lines:  # the line is needed (most values recur)
                    start = text.rfind("\n", 0, offset) + 1
                    end = text.find("\n", offset)
                    line = text[start : end if end >= 0 else len(text)]
                    if test_lines:
                        if start not in instruction:
                            instruction[start] = looks_like_instruction(line)
                        if instruction[start]:
                            continue
                if fact is None:
                    fact = facts[value] = Fact(
                        value, kind, mid, _around(line, offset - start, value), order=len(facts)
                    )
                    fact._seen.add(mid)
                elif mid not in fact._seen:
                    fact._seen.add(mid)
                    fact.messages += 1
                fact.stated = fact.stated or stated
    return list(facts.values())


def rank(facts: Iterable[Fact]) -> list[Fact]:
    """``facts`` most important first: by :attr:`Fact.score`, then first seen first."""
    return sorted(facts, key=lambda f: (-f.score, f.order))


def stated_facts(messages: Sequence[BaseMessage]) -> list[Fact]:
    """The facts the agent stated itself (what the fidelity benchmark marks in a transcript)."""
    return [f for f in extract(messages) if f.stated]


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
    facts of ``removed`` that neither the summary nor the ``kept`` messages contain, in at
    most ``max_chars`` chars (0: no section). In the first half of the budget each entry
    quotes the line a fact was found on (at most :data:`MAX_LINE_CHARS` chars), in
    conversation order; then the remaining facts the agent stated or that recur
    (:data:`LISTED_MIN_SCORE`) are listed by value, grouped by message ("also in <id>:
    ..."). Every entry names its message, for ``recall``. Returns the text
    and what was pinned; the text is unchanged when nothing is missing."""
    if max_chars <= 0:
        return summary_text, Pinned((), 0)
    from offpath.compaction.prompt import render_content

    present = summary_text + "\n" + "\n".join(render_content(m.content) for m in kept)
    if header is None:
        header = f"{PINNED_HEADING} (verbatim from the summarized messages; `recall` finds them):"
    header = f"\n\n{header}"
    budget = max_chars - len(header)
    position = {str(m.id): i for i, m in enumerate(removed)}
    ranked = rank(extract(removed))
    absent: dict[str, bool] = {}  # value -> not in the summary nor the keep window

    def missing(fact: Fact) -> bool:
        # tested only for a fact that would fit the budget left: the summary and the keep
        # window are tens of thousands of chars, a thread's facts hundreds (issue 13)
        if fact.value not in absent:
            absent[fact.value] = fact.value not in present
        return absent[fact.value]

    pinned = ""  # the lines quoted and the values listed so far
    # the highest-ranked facts with the line they were found on, in up to half the budget
    quoted: list[tuple[int, int, str]] = []
    room = budget // 2
    for fact in ranked:
        if fact.value in pinned:  # on a line quoted for an earlier fact
            continue
        line = fact.line.replace("`", "'")
        entry = f"\n- `{line}` ({fact.message_id})"
        if len(entry) > room or not missing(fact):
            continue
        quoted.append((position.get(fact.message_id, 0), fact.order, entry))
        room -= len(entry)
        pinned += "\n" + fact.line
    budget -= budget // 2 - room
    # the rest by value only, grouped by the message they came from, while the budget lasts
    named: dict[str, list[str]] = {}
    for fact in ranked:
        if fact.score < LISTED_MIN_SCORE or fact.value in pinned:
            continue
        values = named.setdefault(fact.message_id, [])
        cost = len(fact.value) + 4 + (0 if values else len(fact.message_id) + 12)
        if cost > budget or not missing(fact):
            continue
        values.append(fact.value.replace("`", "'"))
        budget -= cost
        pinned += "\n" + fact.value
    listed = [
        (position.get(mid, 0), 0, f"\n- also in {mid}: " + ", ".join(f"`{v}`" for v in values))
        for mid, values in named.items()
        if values
    ]
    if not quoted and not listed:
        return summary_text, Pinned((), 0)
    ordered = tuple(entry for *_, entry in sorted(quoted)) + tuple(e for *_, e in sorted(listed))
    covered = sum(fact.value in pinned and missing(fact) for fact in ranked)
    return summary_text.rstrip() + header + "".join(ordered), Pinned(ordered, covered)


def _around(line: str, offset: int, value: str) -> str:
    """``line`` clipped to :data:`MAX_LINE_CHARS` around ``value`` (at ``offset``), cut at
    word boundaries."""
    line = " ".join(line.split())
    if len(line) <= MAX_LINE_CHARS:
        return line
    offset = max(0, line.find(value))
    room = MAX_LINE_CHARS - len(value)
    start = max(0, offset - room // 2)
    end = min(len(line), start + MAX_LINE_CHARS)
    start = max(0, end - MAX_LINE_CHARS)
    if start > 0:
        cut = line.find(" ", start, offset)
        start = cut + 1 if cut >= 0 else start
    if end < len(line):
        cut = line.rfind(" ", offset + len(value), end)
        end = cut if cut > 0 else end
    return ("..." if start else "") + line[start:end] + ("..." if end < len(line) else "")
