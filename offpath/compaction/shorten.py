"""Shortening a tool result in place: its head and tail, the facts of the part cut out, and one
line saying how to read the rest. Pure: no I/O.

A shortened result keeps its message id, type and ``tool_call_id`` (it still answers its call:
DESIGN.md invariant 3); only its content changes. The original is archived whole by whoever
writes the update, in the same step (invariants 12 and 13): nothing is lost, and ``recall``
reads it back, by message id and, page by page, from any offset.

Three callers shorten with :func:`shorten` (DESIGN.md "Where each kind of shrinking belongs"):

* a result over ``TOOL_RESULT_MAX_CHARS`` as it arrives (the middleware, before any model
  call sees it; ``POST /sessions/{id}/turns``, in the turn's own write);
* a compaction, for kept results, so that the keep window holds no more than its budget and
  the thread lands under its prepare floor (:func:`caps_for`);
* the middleware, for older results, when a model call would be over the threshold and no
  summary is ready yet: the call stays bounded while the summary is written.

What a message says, as a short digest (:func:`digest`), is how a prepared compaction
recognises, when it is applied, that the messages it planned on are unchanged
(:func:`offpath.compaction.patch.fit`). A shortened result carries its original's digest in
its mark, so shortening a message does not make a compaction planned on it stale: it still
says the same thing, and its original is archived.

A result larger than the keep window is shortened too: kept whole, one ``kubectl`` dump in the
last turn would leave every job after it nothing to remove (``too_few_messages``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

import orjson
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from offpath.compaction.accounting import args_chars, content_text, message_chars
from offpath.compaction.facts.sections import ARGUMENT_HEAD_CHARS, run_after, run_before
from offpath.compaction.fields import message_field
from offpath.compaction.settings import MIN_SHORTENED_CHARS
from offpath.compaction.summary import REQUEST_COPY, archived_as, cite, is_summary

M = TypeVar("M", bound=BaseMessage)

#: ``additional_kwargs`` key of a shortened result: ``{"chars": <the original's chars>,
#: "digest": <the original's digest>}`` (a client's copy of it is dropped by ``/turns``).
MARK = "offpath_shortened"
#: Most chars of the facts listed in the line that replaces the cut part.
MAX_FACT_CHARS = 600
#: A result is shortened only when that saves at least this many chars.
MIN_SAVING_CHARS = 200
#: The fewest chars an *older* result is shortened to, outside the keep window, while a call
#: would be over the threshold with no summary ready: its first line and the recall line.
MIN_OLDER_CHARS = 200
#: Under this cap a shortened result is a stub: its first line and the recall line, no facts.
STUB_BELOW_CHARS = 500
#: A tool-call argument (a string of several lines) is cut only when it is longer than this:
#: what is left is its first line (at most this long) and one line saying how to read it.
MIN_ARGUMENT_CHARS = ARGUMENT_HEAD_CHARS


def raw_digest(message: BaseMessage) -> str:
    """A short digest of what ``message`` says now (type, content, tool calls, tool-call id,
    name): two processes compute the same for the same message. 16 hex chars."""
    parts = [
        message.type,
        message.content,
        message_field(message, "tool_calls") or None,
        message_field(message, "tool_call_id"),
        message.name,
    ]
    raw = orjson.dumps(parts, default=str, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


#: Digests by message object (held, so that its ``id`` stays its own) while
#: :func:`digests_kept` is entered; None: not entered (each call digests its message).
_KEPT: ContextVar[dict[int, tuple[BaseMessage, str]] | None] = ContextVar(
    "offpath_digests", default=None
)


@contextmanager
def digests_kept() -> Iterator[None]:
    """Within it (in this thread or task), :func:`digest` computes a message object's digest
    once: the caller changes no message in place meanwhile (a compaction job, which digests
    the messages it plans on, then checks them at the apply: the same objects unless the
    thread was read again)."""
    token = _KEPT.set({})
    try:
        yield
    finally:
        _KEPT.reset(token)


def digest(message: BaseMessage) -> str:
    """:func:`raw_digest` of ``message``, or of its original when offpath shortened it (the
    digest its :data:`MARK` carries)."""
    mark = message.additional_kwargs.get(MARK)
    if isinstance(mark, dict) and isinstance(mark.get("digest"), str):
        return mark["digest"]
    kept = _KEPT.get()
    if kept is None:
        return raw_digest(message)
    known = kept.get(id(message))
    if known is not None and known[0] is message:
        return known[1]
    value = raw_digest(message)
    kept[id(message)] = (message, value)
    return value


def is_shortened(message: BaseMessage) -> bool:
    """``message`` is a result offpath shortened (its original is archived)."""
    return isinstance(message.additional_kwargs.get(MARK), dict)


def originals_of(
    messages: Sequence[BaseMessage], read: Callable[[Sequence[str]], Mapping[str, BaseMessage]]
) -> dict[str, BaseMessage]:
    """The archived originals of those of ``messages`` that offpath shortened, by their ids in
    the thread: each read (``read``: archived ids -> messages,
    :func:`offpath.stores.archive.originals` bound to the thread) under :func:`archived_as`,
    taken only when its digest is the one the shortened message carries (:data:`MARK`; an id
    used by two messages never gives the other one) and given the thread's id. Those not
    archived, or archived otherwise, are left out: the caller keeps the shortened copy. A
    request's copy gives the request, still marked as the copy (``REQUEST_COPY``)."""
    short = [m for m in messages if is_shortened(m)]
    if not short:
        return {}
    found = read(list(dict.fromkeys(archived_as(m) for m in short)))
    out: dict[str, BaseMessage] = {}
    for m in short:
        original = found.get(archived_as(m))
        if original is None or raw_digest(original) != m.additional_kwargs[MARK].get("digest"):
            continue
        if original.id != m.id:
            # in the copy's place, still naming the request it copies (what its facts cite)
            extra = {**original.additional_kwargs}
            if REQUEST_COPY in m.additional_kwargs:
                extra[REQUEST_COPY] = m.additional_kwargs[REQUEST_COPY]
            original = original.model_copy(update={"id": m.id, "additional_kwargs": extra})
        out[str(m.id)] = original
    return out


def original_chars(message: BaseMessage) -> int:
    """The size of the result before offpath shortened it (its own size if it never was)."""
    mark = message.additional_kwargs.get(MARK)
    if isinstance(mark, dict) and isinstance(mark.get("chars"), int):
        return mark["chars"]
    return message_chars(message)


def shorten(message: M, cap: int, *, recall: bool = True, floor: int = MIN_SHORTENED_CHARS) -> M:
    """``message`` (a tool result; or a long request a compaction keeps as its own message,
    :func:`~offpath.compaction.planner.request_cap_chars`) with its content cut to at most
    ``cap`` chars (at least
    :data:`~offpath.compaction.settings.MIN_SHORTENED_CHARS`): its head and tail around one
    line that names the chars not shown, the facts found in them (the fact guard's extractor;
    lines that read as instructions give none) and how to read them (``recall`` by message id,
    with an offset; ``recall``: the agent has the tool). Deterministic: the same message and
    cap give the same text. A message already within ``cap`` is returned as it is. A message
    of parts (list content) becomes the text read from them
    (:func:`~offpath.compaction.accounting.content_text` with placeholders: images and files
    as one line each, as ``recall`` reads it), cut so only when that is still over ``cap``.
    """
    cap = max(cap, floor)
    size = message_chars(message)
    if size <= cap:
        return message
    total = original_chars(message)
    mid = archived_as(message)  # where recall finds its original (a copy: the request)
    noun = "result" if isinstance(message, ToolMessage) else "message"
    extra = {**message.additional_kwargs, MARK: {"chars": total, "digest": digest(message)}}
    if isinstance(message, AIMessage) and message.tool_calls:
        # the model's own message: the data its tool calls carry (a file it wrote) goes
        # first; its text, then, to what is left of the cap
        calls, args = _cut_arguments(message.tool_calls, size - cap, mid, recall)
        if calls is not message.tool_calls:
            extra.pop("tool_calls", None)  # the provider's raw copy: tool_calls are the source
            message = message.model_copy(update={"tool_calls": calls, "additional_kwargs": extra})
            size = message_chars(message)
            if size <= cap:
                return message
        cap = max(cap - args, floor)
    text = content_text(message.content, placeholders=True)
    if isinstance(message, AIMessage) and message.tool_calls and len(text) <= cap:
        return message  # its text fits what its arguments left (or the floor)
    if not isinstance(message.content, str):
        # parts (an image costs a fixed amount, its placeholder a line): the text read from
        # them may fit whole where the parts did not
        how = f'recall("{cite(mid)}") reads it' if recall else f"archived as message {mid}"
        note = (
            f"[offpath: this {noun}'s parts are shown as text here, images and files as "
            f"placeholders ({total:,} chars in all); {how}]"
        )
        if len(text) + len(note) + 1 <= cap:
            content = f"{text}\n{note}"
            return message.model_copy(update={"content": content, "additional_kwargs": extra})
    if cap < STUB_BELOW_CHARS:
        how = (
            f'recall("{cite(mid)}") reads it' if recall else f"offpath archived it as message {mid}"
        )
        stub = f"[offpath: {total:,} of this {noun}'s {total:,} chars are not shown here; {how}]"
        first = text.split("\n", 1)[0]
        room = max(0, cap - len(stub) - 2)
        head = first if len(first) <= room else first[: max(0, room - 3)] + "..."
        content = f"{head}\n{stub}\n"[: max(cap, len(stub))]
        return message.model_copy(update={"content": content, "additional_kwargs": extra})
    facts_max = min(MAX_FACT_CHARS, cap // 4)
    marker = ""
    for _ in range(3):  # the marker's length depends on the cut, which depends on it
        room = max(0, cap - len(marker) - 2)
        head_end, tail_start = _cut(text, room)
        marker = _marker(message, text, head_end, tail_start, total, recall, facts_max)
    room = max(0, cap - len(marker) - 2)
    head_end, tail_start = _cut(text, room)
    content = f"{text[:head_end]}\n{marker}\n{text[tail_start:]}"
    if len(content) > cap:  # a pathological marker (huge id): never over the cap
        content = content[:cap]
    return message.model_copy(update={"content": content, "additional_kwargs": extra})


def shorten_each(
    messages: Sequence[BaseMessage],
    caps: dict[str, int],
    *,
    recall: bool = True,
    offset: int = 0,
    floor: int | None = None,
    at: Mapping[str, int] | None = None,
) -> tuple[list[BaseMessage], list[tuple[int, BaseMessage]]]:
    """``(out, originals)``: ``messages`` with the messages named in ``caps`` (message id ->
    cap in chars: tool results; a model's long message or a request, as :func:`older_caps`
    names them) shortened (:func:`shorten`), and the originals to archive before the update
    that shortens them is written, as ``(thread position, message)`` (``offset``: the
    position of ``messages[0]``). ``out`` is ``messages`` itself when nothing is to
    shorten. ``at``: each capped message's index in ``messages`` (no other is looked at)."""
    out = list(messages)
    originals: list[tuple[int, BaseMessage]] = []
    ids = (str(m.id) for m in out)
    for i, mid in enumerate(ids) if at is None else sorted((i, d) for d, i in at.items()):
        if (cap := caps.get(mid)) is None:
            continue
        m, short = out[i], shorten(out[i], cap, recall=recall, floor=floor or MIN_SHORTENED_CHARS)
        if short is not m:
            originals.append((offset + i, m))
            out[i] = short
    if not originals:
        return (messages if isinstance(messages, list) else list(messages)), []
    return out, originals


def _cut_arguments(calls: list[Any], need: int, mid: str, recall: bool) -> tuple[list[Any], int]:
    """``(calls, chars)``: ``calls`` (an AI message's tool calls) with their longest
    multi-line string arguments cut to their first line and one line saying how to read
    them and which facts they hold, longest first until ``need`` chars are saved (or none is
    left to cut; ``calls`` itself when none is cut), and the chars of their arguments then. An
    agent that writes files through heredocs spends 2-8k chars of arguments a step: with
    every tool result at its floor, its own tool calls are what is left to shorten while its
    summary is written."""
    how = f'recall("{cite(mid)}") reads the whole message' if recall else f"archived as {mid}"
    long = sorted(
        (
            (len(value), k, key)
            for k, call in enumerate(calls)
            for key, value in (call.get("args") or {}).items()
            if _cuts(value)
        ),
        reverse=True,
    )
    before = sum(args_chars(c.get("args")) for c in calls)
    if not long or need <= 0:
        return calls, before
    out = [{**c, "args": dict(c.get("args") or {})} for c in calls]
    saved = 0
    for n, k, key in long:
        if saved >= need:
            break
        value = out[k]["args"][key]
        first = value.split("\n", 1)[0][:MIN_ARGUMENT_CHARS]
        shown = first
        if len(first) >= MIN_ARGUMENT_CHARS:  # cut, maybe mid-word: its last run is not read
            shown = first[: run_before(first, len(first))]
        probe = ToolMessage(content=value, tool_call_id="-", id="-")
        facts = _facts(probe, value, shown, MAX_FACT_CHARS // 2)
        listed = f" Facts in it: {facts}." if facts else ""
        out[k]["args"][key] = (
            f"{first}\n[offpath: {n:,} chars of this argument not shown; {how}.{listed}]"
        )
        saved += n - len(out[k]["args"][key])
    return out, sum(args_chars(c.get("args")) for c in out)


def cuttable_chars(message: BaseMessage) -> int:
    """Chars of ``message``'s tool-call arguments that :func:`_cut_arguments` may cut (the
    multi-line string values over :data:`MIN_ARGUMENT_CHARS`, not cut already)."""
    return sum(
        len(value)
        for call in message_field(message, "tool_calls") or []
        for value in (call.get("args") or {}).values()
        if _cuts(value)
    )


def _cuts(value: Any) -> bool:
    """An argument value :func:`_cut_arguments` may cut."""
    return (
        isinstance(value, str)
        and "\n" in value
        and len(value) > MIN_ARGUMENT_CHARS
        and "\n[offpath: " not in value  # cut already
    )


def _cut(text: str, room: int) -> tuple[int, int]:
    """Where the head ends and the tail starts for ``room`` chars of both: three fifths head,
    two fifths tail, moved to a line break when one is near."""
    if room >= len(text):
        return len(text), len(text)
    head = room * 3 // 5
    tail = room - head
    head_end, tail_start = head, len(text) - tail
    nl = text.rfind("\n", int(head * 0.7), head_end)
    if nl > 0:
        head_end = nl
    nl = text.find("\n", tail_start, tail_start + max(1, int(tail * 0.3)))
    if nl >= 0:
        tail_start = nl + 1
    return head_end, max(tail_start, head_end)


def _marker(
    message: BaseMessage,
    text: str,
    head_end: int,
    tail_start: int,
    total: int,
    recall: bool,
    facts_max: int,
) -> str:
    mid = archived_as(message)  # where recall finds its original (a copy: the request)
    noun = "result" if isinstance(message, ToolMessage) else "message"
    hidden = text[head_end:tail_start]
    if recall:
        how = (
            f'recall("{cite(mid)}") reads the whole {noun}, recall("{cite(mid)}", '
            f"offset={head_end}) from this cut on"
        )
    else:
        how = f"offpath archived the whole {noun} as message {mid}"
    # a value the cuts may have split is not shown: the reader leaves out the runs of chars
    # next to them (:func:`~offpath.compaction.facts.sections.without_cut_runs`), the note
    # lists it
    shown = text[: run_before(text, head_end)] + "\n" + text[run_after(text, tail_start) :]
    facts = _facts(message, text, shown, facts_max)
    listed = f" Facts in the part not shown: {facts}." if facts else ""
    return (
        f"[offpath: {len(hidden):,} of this {noun}'s {total:,} chars are not shown here; "
        f"{how}.{listed}]"
    )


def _facts(message: BaseMessage, text: str, shown: str, max_chars: int) -> str:
    """The facts of ``text`` (``message``'s whole content) that ``shown`` (its head and tail)
    does not hold, most important first, as a list of at most ``max_chars`` chars: those of
    the part not shown. Read from the whole text, whose facts the extractor keeps per
    process, so the cuts tried for one cap and a result shortened again to a smaller cap read
    it once (each cut's hidden part was read anew: three reads of a 75,000-char dump per
    shortening, in the model call's path). A tool result with text content is read as
    itself (the same facts as any text read as tool output), so the facts found for it
    anywhere else in the process serve here too: the middleware reads new results ahead,
    while the model answers (:func:`offpath.compaction.facts.warm`)."""
    from offpath.compaction.facts.extraction import extract, rank

    if isinstance(message, ToolMessage) and isinstance(message.content, str):
        probe: BaseMessage = message
    else:
        probe = ToolMessage(content=text, tool_call_id="-", id="-")
    out: list[str] = []
    used = 0
    for fact in rank(extract([probe])):
        if fact.value in shown or len(fact.value) > 120:
            continue
        item = "`" + fact.value.replace("`", "'") + "`"
        if used + len(item) + 2 > max_chars:
            break
        out.append(item)
        used += len(item) + 2
    return ", ".join(out)


def caps_for(
    sizes: Sequence[tuple[str, int]], need: int, floor: int = MIN_SHORTENED_CHARS
) -> dict[str, int]:
    """Caps (chars) for the results ``sizes`` (``(message id, chars)``) that save at least
    ``need`` chars: the largest are cut first, all to one common cap (water filling), none
    below ``floor``, none for less than
    :data:`MIN_SAVING_CHARS`. Returns ``{}`` when ``need <= 0``; when even every result at the
    smallest cap saves less than ``need``, those smallest caps (the most that can be saved).
    """
    if need <= 0:
        return {}
    eligible = sorted((s, i) for i, s in sizes if s - floor >= MIN_SAVING_CHARS)
    if not eligible:
        return {}
    # the highest common cap c with sum(max(0, s - c)) >= need
    saved_at_floor = sum(s - floor for s, _ in eligible)
    if saved_at_floor <= need:
        return {i: floor for _, i in eligible}
    lo, hi = floor, eligible[-1][0]
    while hi - lo > 1:
        c = (lo + hi) // 2
        if sum(max(0, s - c) for s, _ in eligible) >= need:
            lo = c
        else:
            hi = c
    return {i: lo for s, i in eligible if s - lo >= MIN_SAVING_CHARS}


def saving(sizes: dict[str, int], caps: dict[str, Any]) -> int:
    """Chars the ``caps`` save at least on results of ``sizes`` (a shortened result is at most
    its cap)."""
    return sum(max(0, sizes[i] - int(c)) for i, c in caps.items() if i in sizes)


def older_caps(
    messages: Sequence[BaseMessage],
    keep_chars: int,
    need: int,
    new_from: int | None = None,
    request_floor: int = MIN_SHORTENED_CHARS,
) -> dict[str, int]:
    """Caps that save ``need`` chars on older messages: first the tool results outside the
    newest ``keep_chars`` chars (the keep window), then, if that is not enough, those in it
    that a model call has seen already (before ``new_from``, the index of the first message
    new since the last call); then, outside the keep window, the model's own long messages
    (their text, and first the multi-line arguments of their tool calls: a file the agent
    wrote) and long requests (not below
    ``request_floor``: a compaction keeps a request shortened to
    :func:`~offpath.compaction.planner.request_cap_chars`; for them the keep window holds at
    most ``keep_chars``: a long request at its edge is not recent). The newest results and
    the keep window's own messages stay whole. What a model call over the threshold
    shortens while no summary is ready (no lower than :data:`MIN_OLDER_CHARS`).

    Older messages are capped whatever their kind: a run whose size is the model's own
    writing (files written a step at a time) or a long pasted task is otherwise over its
    threshold while its summary is written, with every tool result already at its floor."""
    acc, start = 0, len(messages)
    while start > 0 and acc < keep_chars:
        start -= 1
        acc += message_chars(messages[start])
    older = [(str(m.id), message_chars(m)) for m in messages[:start] if isinstance(m, ToolMessage)]
    caps = caps_for(older, need, MIN_OLDER_CHARS)
    left = need - saving(dict(older), caps)
    end = len(messages) if new_from is None else min(new_from, len(messages))
    if left > 0 and end > start:
        seen = [
            (str(m.id), message_chars(m)) for m in messages[start:end] if isinstance(m, ToolMessage)
        ]
        caps.update(caps_for(seen, left, MIN_OLDER_CHARS))
        left = need - saving(dict(older + seen), caps)
    # for requests the keep window holds no more than its chars (the newest message whatever
    # its size): a 19k pasted request at its edge would else count as recent and stay whole
    # (sweagent-pydicom: 1.05x over the threshold with nothing else to shorten)
    own_start, acc = max(0, len(messages) - 1), 0
    if messages:
        acc = message_chars(messages[-1])
    while own_start > 0 and acc + message_chars(messages[own_start - 1]) <= keep_chars:
        own_start -= 1
        acc += message_chars(messages[own_start])
    for kind, floor in (("ai", MIN_OLDER_CHARS), ("human", request_floor)):
        if left <= 0:
            break
        # a model's message by what can be cut: its text and its tool calls' multi-line
        # arguments (a file it wrote); the rest of its calls stays whatever the cap
        mine = [
            m
            for m in messages[: start if kind == "ai" else own_start]
            if m.type == kind and isinstance(m.content, str) and not is_summary(m)
        ]
        own = [(str(m.id), len(m.content) + cuttable_chars(m)) for m in mine]
        fixed = {str(m.id): message_chars(m) - n for m, (_, n) in zip(mine, own, strict=True)}
        more = caps_for(own, left, max(floor, MIN_OLDER_CHARS))
        caps.update({i: cap + fixed[i] for i, cap in more.items()})
        left -= saving(dict(own), more)
    return caps


def arrival_caps(new: Sequence[BaseMessage], limit: int, step_limit: int) -> dict[str, int]:
    """Caps for the tool results that arrived since the last model call: none over ``limit``
    (``TOOL_RESULT_MAX_CHARS``), and together no more than ``step_limit`` (the keep window: a
    batch of parallel results shares it), the largest cut first: four parallel results of
    5,000 chars would make one step two thirds of a 30,000-char threshold."""
    results = [(str(m.id), message_chars(m)) for m in new if isinstance(m, ToolMessage)]
    caps = {i: limit for i, c in results if c > limit}
    capped = [(i, min(c, limit)) for i, c in results]
    over = sum(c for _, c in capped) - step_limit
    if over > 0:
        for i, cap in caps_for(capped, over).items():
            caps[i] = min(cap, caps.get(i, cap))
    return caps
