"""The archive's index at a summary's end: what the compactions of a session removed, one
line per compacted span (its turns, how many messages, the tools called, the main entities
and topics, the first message's id), so that a model that sees only the summary knows what
``recall`` can fetch, and by which words. Pure.

A compaction writes the line of the span it removes after the lines the earlier summary it
folds in carried (read back from that summary's text, never its metadata). When the lines
do not fit their room, the two oldest spans are merged into one line, again and again: no
span in the middle vanishes, the oldest ones get coarser (:func:`merge_oldest`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage

from offpath.compaction.accounting import content_text
from offpath.compaction.facts.extraction import extract_ranked
from offpath.compaction.facts.sections import INDEX_HEADING
from offpath.compaction.pairing import is_request
from offpath.compaction.summary import (
    REQUEST_COPY,
    archived_as,
    cite,
    is_summary,
    looks_like_instruction,
)

#: The whole heading line, with how to use it.
INDEX_HEADER = (
    f"{INDEX_HEADING} (what compactions removed; `recall` finds it by these words or an id):"
)
#: Most tools and topics one span line names.
MAX_TOOLS = 4
MAX_TOPICS = 6
#: Tools a span line keeps named while its topics give way (:func:`shorter_line`).
LEAST_TOOLS = 2
#: Most chars of one topic named in a span line.
MAX_TOPIC_CHARS = 40
#: The index takes at most a ``1/INDEX_SHARE`` of the summary's budget (its oldest spans
#: merged to fit), and at least :data:`INDEX_MIN_CHARS` (:func:`index_room`).
INDEX_SHARE = 8
INDEX_MIN_CHARS = 200
#: One span line: ``- turns 3-5, 18 messages from 1a2b3c4d: tools a x2, b; topics: x, y``.
_LINE = re.compile(
    r"^- turns? (?P<first>\d+)(?:-(?P<last>\d+))?, (?P<count>\d+) messages from (?P<id>\S+?)"
    r"(?: \((?P<spans>\d+) spans\))?(?:: tools (?P<tools>[^;]*))?(?:; topics: (?P<topics>.*))?$"
)


def index_room(budget: int) -> int:
    """Most chars the index of a summary with a ``budget`` (chars of the whole message; 0: no
    bound) may take."""
    return max(INDEX_MIN_CHARS, budget // INDEX_SHARE) if budget else 10**9


def _tools(text: str) -> Counter[str]:
    out: Counter[str] = Counter()
    for part in text.split(", "):
        name, _, times = part.strip().partition(" x")
        if name:
            out[name] += int(times) if times.isdigit() else 1
    return out


def _line(
    first: int,
    last: int,
    count: int,
    mid: str,
    tools: Counter[str],
    topics: Sequence[str],
    spans: int = 1,
) -> str:
    turns = f"turn {first}" if first == last else f"turns {first}-{last}"
    line = f"- {turns}, {count} messages from {mid}"
    if spans > 1:
        line += f" ({spans} spans)"
    if tools:
        named = [f"{n} x{c}" if c > 1 else n for n, c in tools.most_common(MAX_TOOLS)]
        line += ": tools " + ", ".join(named)
    if topics:
        line += "; topics: " + ", ".join(topics[:MAX_TOPICS])
    return line


def _last_turn(lines: Sequence[str]) -> int:
    for line in reversed(lines):
        if found := _LINE.match(line):
            return int(found["last"] or found["first"])
    return 0


def index_lines(summary: BaseMessage) -> list[str]:
    """The span lines an earlier summary's index holds, read from its text."""
    text = content_text(summary.content)
    _, sep, rest = text.partition(f"\n{INDEX_HEADING}")
    if not sep:
        return []
    out = []
    for line in rest.split("\n")[1:]:
        if not line.startswith("- "):
            break
        if _LINE.match(line):
            out.append(line)
    return out


def span_line(removed: Sequence[BaseMessage], last_turn: int, shown: str = "") -> str | None:
    """The line of a span of ``removed`` messages (earlier summaries left out), its turns
    counted on from ``last_turn`` (the last turn the index names so far); None for none.
    Its topics are the span's :data:`MAX_TOPICS` highest-ranked values less those ``shown``
    (the rest of the summary) holds: a value the summary names already says nothing more in
    the index, and none further down takes its place, so the line is never longer than the
    one made without ``shown`` (the guard fits the summary's text beside that one). An
    opaque value only tool output holds (a time of day, a request id:
    :attr:`~offpath.compaction.facts.extraction.Fact.grouped`) is no topic, however often
    it recurs."""
    fresh = [m for m in removed if not is_summary(m)]
    if not fresh:
        return None
    requests = sum(1 for m in fresh if is_request(m) and not m.additional_kwargs.get(REQUEST_COPY))
    first = last_turn + 1 if fresh and is_request(fresh[0]) else max(1, last_turn)
    last = max(first, last_turn + requests)
    tools: Counter[str] = Counter()
    for m in fresh:
        if isinstance(m, AIMessage):
            for call in m.tool_calls:
                name = str(call.get("name") or "")
                if re.fullmatch(r"[\w.-]{1,40}", name):
                    tools[name] += 1
    topics: list[tuple[str, str]] = []  # (key, as shown)
    seen: set[str] = set()
    present = shown.casefold()
    for fact in extract_ranked(fresh)[1]:
        if fact.grouped or not (fact.stated or fact.asked or fact.messages > 1):
            continue
        value = " ".join(fact.value.split())
        key = value.casefold()
        if (
            len(value) > MAX_TOPIC_CHARS
            or key in seen
            or any(key in s for s in seen)
            or looks_like_instruction(value)
        ):
            continue
        seen.add(key)
        topics.append((key, value.replace("`", "'").replace(";", ",")))
        if len(topics) >= MAX_TOPICS:
            break
    named = [text for key, text in topics if key not in present]
    return _line(first, last, len(fresh), cite(archived_as(fresh[0])), tools, named)


def merge_oldest(lines: Sequence[str]) -> list[str] | None:
    """``lines`` (span lines, oldest first) with the two oldest merged into one (their turns
    and messages together, the tools counted together, the topics of each in turn); None
    when fewer than two remain or they are not span lines."""
    if len(lines) < 2:
        return None
    a, b = _LINE.match(lines[0]), _LINE.match(lines[1])
    if a is None or b is None:
        return None
    tools = _tools(a["tools"] or "") + _tools(b["tools"] or "")
    topics_a = [t for t in (a["topics"] or "").split(", ") if t]
    topics_b = [t for t in (b["topics"] or "").split(", ") if t]
    topics: list[str] = []
    for pair in zip(topics_a, topics_b, strict=False):
        topics += list(pair)
    longer = topics_a if len(topics_a) > len(topics_b) else topics_b
    topics += longer[min(len(topics_a), len(topics_b)) :]
    merged = _line(
        int(a["first"]),
        int(b["last"] or b["first"]),
        int(a["count"]) + int(b["count"]),
        a["id"],
        tools,
        list(dict.fromkeys(topics)),
        int(a["spans"] or 1) + int(b["spans"] or 1),
    )
    return [merged, *lines[2:]]


def shorter_line(line: str) -> str | None:
    """Span ``line`` naming less: its least-called tool past the first :data:`LEAST_TOOLS`
    (the agent has its tools listed; the entities are what only the index names), then its
    last topic, then its tools but the first; None when it names one tool and no topic (or
    is no span line). Its turns, messages and first id stay: what the span is and where
    ``recall`` starts."""
    found = _LINE.match(line)
    if found is None:
        return None
    topics = [t for t in (found["topics"] or "").split(", ") if t]
    tools = [t for t in (found["tools"] or "").split(", ") if t]
    if len(tools) > LEAST_TOOLS or (not topics and len(tools) > 1):
        tools.pop()
    elif topics:
        topics.pop()
    else:
        return None
    head = line[: found.end("id")] + (f" ({found['spans']} spans)" if found["spans"] else "")
    return (
        head
        + (": tools " + ", ".join(tools) if tools else "")
        + ("; topics: " + ", ".join(topics) if topics else "")
    )


def archive_index(removed: Sequence[BaseMessage], room: int, shown: str = "") -> str:
    """The index section of a summary replacing ``removed`` (in thread order, earlier
    summaries among them): the spans the earlier summaries' indexes hold, then this one's
    (its topics none that ``shown``, the summary's other parts, holds), in at most ``room``
    chars (the oldest spans merged until it fits; at least the heading and one line). ""
    when nothing is indexed."""
    lines: list[str] = []
    for m in removed:
        if is_summary(m):
            lines += index_lines(m)
    new = span_line(removed, _last_turn(lines), shown)
    if new is not None:
        lines.append(new)
    if not lines:
        return ""
    while len(INDEX_HEADER) + sum(len(x) + 1 for x in lines) > room:
        merged = merge_oldest(lines)
        if merged is None:
            break
        lines = merged
    # one line still over: it names fewer topics and tools, never fewer turns
    while len(INDEX_HEADER) + sum(len(x) + 1 for x in lines) > room:
        k = max(range(len(lines)), key=lambda i: len(lines[i]))
        less = shorter_line(lines[k])
        if less is None:
            break
        lines[k] = less
    return "\n".join([INDEX_HEADER, *lines])
