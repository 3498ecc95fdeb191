"""What a model call is about to see, kept incrementally, and the in-path fallback. Pure.

The middleware runs at every model call of an agent run, so it must not rescan
the thread (a run may reach 100,000 messages). :class:`ThreadSize` is carried in
the agent's state and advanced over the messages added since the last step:
O(new messages). It holds the thread's size in chars (the same
:func:`~offpath.compaction.accounting.message_chars` as the planner) and the
tool-call bookkeeping needed to spot orphan results (a result whose call no
longer precedes it: it must never reach a model call).

:func:`mask_observations` is the last resort when a model call would exceed the
hard limit and no summary is prepared (DESIGN.md invariant 9): the bodies of the
oldest tool results are replaced by a one-line placeholder, for that call only
("observation masking"); the stored thread is unchanged.

:class:`MessageSizes` keeps a thread's message sizes by position, as model calls see the
thread, and finds the caps of older messages from them (:meth:`MessageSizes.older_caps`, the
same caps as :func:`~offpath.compaction.shorten.older_caps` computes from the messages).

A model call over the threshold with no summary ready looks for the older messages to
shorten; on a thread of 100,000 messages, sizing each of them at every call costs more than
the call's model. :class:`MessageSizes` sizes each message once, as it first arrives, and
keeps the messages outside the keep window sorted by size, so that a call does work in
proportion to the messages it has not seen, the keep window's messages, and the messages
it shortens.

Message ids name messages: a thread's ids are unique (LangGraph's ``add_messages`` gives
each message one), and a message replaced under its id is one the caller says it replaced
(:meth:`MessageSizes.replaced`); any other change to the messages already sized (a
compaction removed some, the counted prefix is not the thread's any more, or its size is not
the one the agent's state holds) makes :meth:`MessageSizes.sync` size the thread again.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from offpath.compaction.accounting import args_chars, content_chars, message_chars
from offpath.compaction.pairing import call_ids
from offpath.compaction.shorten import (
    MIN_OLDER_CHARS,
    MIN_SAVING_CHARS,
    caps_for,
    cuttable_chars,
)
from offpath.compaction.summary import is_summary

#: The agent state's private key where the middleware keeps the thread's size
#: (:class:`ThreadSize`), a compaction a run applied and must record, the run's growth
#: rate. Here (not in the middleware) so the code that patches a thread from outside a
#: run (a revert, the API) finds it without importing the agent side.
KEY = "offpath"


@dataclass(frozen=True, slots=True)
class ThreadSize:
    """The size of the first ``n`` messages of a thread (``last``: the id of message n-1).

    ``open`` counts unanswered calls by id; ``orphans`` are the ids of results that
    answered none.
    """

    n: int = 0
    last: str | None = None
    chars: int = 0
    open: Mapping[str, int] = field(default_factory=dict)
    orphans: tuple[str, ...] = ()

    def advance(self, messages: Sequence[BaseMessage]) -> ThreadSize:
        """The size of ``messages``: counts only those past ``n``, unless the counted prefix
        changed (a compaction removed or replaced messages), then all of them."""
        start = self
        if self.n and (self.n > len(messages) or messages[self.n - 1].id != self.last):
            start = ThreadSize()
        if start.n == len(messages):
            return start
        chars, open_, orphans = start.chars, dict(start.open), list(start.orphans)
        for m in messages[start.n :]:
            chars += message_chars(m)
            if isinstance(m, ToolMessage):
                cid = m.tool_call_id
                if open_.get(cid):
                    open_[cid] -= 1
                    if not open_[cid]:
                        del open_[cid]
                else:
                    orphans.append(str(m.id))
            elif isinstance(m, AIMessage) and (m.tool_calls or m.invalid_tool_calls):
                for cid in call_ids(m):
                    open_[cid] = open_.get(cid, 0) + 1
        return replace(
            start,
            n=len(messages),
            last=str(messages[-1].id) if messages else None,
            chars=chars,
            open=open_,
            orphans=tuple(orphans),
        )

    def to_state(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "last": self.last,
            "chars": self.chars,
            "open": dict(self.open),
            "orphans": list(self.orphans),
        }

    @classmethod
    def from_state(cls, value: Mapping[str, Any] | None) -> ThreadSize:
        if not value:
            return cls()
        return cls(
            n=int(value.get("n", 0)),
            last=value.get("last"),
            chars=int(value.get("chars", 0)),
            open=dict(value.get("open") or {}),
            orphans=tuple(value.get("orphans") or ()),
        )


#: What a masked tool result reads instead of its body.
MASK = "[offpath: this tool result ({chars} chars) is hidden for this call: the context was over its hard limit and no summary was ready yet]"
#: What a masked AI message's text reads instead (second pass of :func:`mask_observations`).
MASK_TEXT = "[offpath: this message's text ({chars} chars) is hidden for this call: the context was over its hard limit and no summary was ready yet]"
#: The one argument a masked tool call keeps (its name and id stay, so its result pairs).
MASK_ARGS_KEY = "offpath_hidden"
MASK_ARGS = "{chars} chars of arguments hidden for this call (context over its hard limit)"


@dataclass(frozen=True, slots=True)
class Masking:
    """What :func:`mask_observations` hid: ``results`` tool results and ``messages`` AI
    messages (their text and call arguments), ``chars`` chars in all."""

    results: int
    chars: int
    messages: int = 0


def _mask_ai(message: AIMessage) -> tuple[AIMessage, int]:
    """``message`` with its text and its tool calls' arguments replaced by placeholders (each
    only where the placeholder is shorter), and the chars this hides. The calls keep their
    ids and names, so each result still pairs with its call (DESIGN.md invariant 2)."""
    saved = 0
    update: dict[str, Any] = {}
    content = message.content
    text = len(content) if isinstance(content, str) else content_chars(content)
    placeholder = MASK_TEXT.format(chars=text)
    if text > len(placeholder):
        update["content"] = placeholder
        saved += text - len(placeholder)
    calls = []
    for call in message.tool_calls:
        chars = args_chars(call.get("args"))
        hidden = {MASK_ARGS_KEY: MASK_ARGS.format(chars=chars)}
        if chars > args_chars(hidden):
            saved += chars - args_chars(hidden)
            call = {**call, "args": hidden}
        calls.append(call)
    if saved == 0:
        return message, 0
    # the provider's raw copy of the calls (additional_kwargs) would send the arguments again
    kwargs = {k: v for k, v in message.additional_kwargs.items() if k != "tool_calls"}
    update.update(tool_calls=calls, additional_kwargs=kwargs)
    return message.model_copy(update=update), saved


def mask_observations(
    messages: Sequence[BaseMessage], limit: int, total: int | None = None
) -> tuple[list[BaseMessage], Masking]:
    """``messages`` with the oldest tool results' bodies (before the last AI message) replaced
    by :data:`MASK` until their size is at most ``limit`` chars (``total``: their size, if known). The result is a new
    list; the messages passed in are not changed.

    If every tool result is masked and the size is still over ``limit`` (a run whose own
    messages, its reasoning and its calls' arguments such as file writes, hold most of the
    thread: a coding agent's run), the oldest AI messages' text and call arguments
    are hidden next (:data:`MASK_TEXT`, :data:`MASK_ARGS`), never the last AI message nor a
    human or system message; the latest step's results go last. Every call stays under the
    hard limit (DESIGN.md invariant 13) while the request and, wherever the limit allows,
    the run's latest step are sent whole. Only this call's copy is masked; the thread keeps
    every message."""
    size = total if total is not None else sum(message_chars(m) for m in messages)
    out = list(messages)
    results = hidden = masked_ai = 0
    if size <= limit:
        return out, Masking(0, 0)
    last_ai = max((i for i, m in enumerate(out) if isinstance(m, AIMessage)), default=-1)
    # older results first, then older AI messages, then the latest step's results
    order = [
        *(i for i in range(last_ai) if isinstance(out[i], ToolMessage)),
        *(i for i in range(last_ai) if isinstance(out[i], AIMessage)),
        *(i for i in range(max(last_ai, 0), len(out)) if isinstance(out[i], ToolMessage)),
    ]
    for i in order:
        if size <= limit:
            break
        m = out[i]
        if isinstance(m, AIMessage):
            out[i], saved = _mask_ai(m)
            masked_ai += saved > 0
        else:
            chars = message_chars(m)
            placeholder = MASK.format(chars=chars)
            if chars <= len(placeholder):
                continue
            out[i] = m.model_copy(update={"content": placeholder, "artifact": None})
            saved = chars - len(placeholder)
            results += 1
        size -= saved
        hidden += saved
    return out, Masking(results, hidden, masked_ai)


#: What a position holds, as :func:`~offpath.compaction.shorten.older_caps` tells them apart.
TOOL, AI, HUMAN, OTHER = 0, 1, 2, 3
#: The smallest size (chars) a tool result, a model's message or a request has to be for a
#: cap to save :data:`~offpath.compaction.shorten.MIN_SAVING_CHARS` at
#: :data:`~offpath.compaction.shorten.MIN_OLDER_CHARS` (the lowest floor of all three).
ELIGIBLE_CHARS = MIN_OLDER_CHARS + MIN_SAVING_CHARS

#: (chars a cap may cut, message id, chars that stay whatever the cap, position)
_Item = tuple[int, str, int, int]


def _kind(message: BaseMessage) -> int:
    if isinstance(message, ToolMessage):
        return TOOL
    if message.type in ("ai", "human"):
        return AI if message.type == "ai" else HUMAN
    return OTHER


class MessageSizes:
    """The sizes (chars, :func:`~offpath.compaction.accounting.message_chars`) of a thread's
    first :attr:`n` messages by position, their total (:attr:`chars`), and, for the positions
    before the keep window as last found (:attr:`older_to`), the tool results, model messages
    and requests large enough to be shortened, sorted by size. Not thread-safe: one model
    call of the thread at a time."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.sizes: list[int] = []
        self.kinds: list[int] = []
        #: per position: the chars a cap may cut (a model's message or request whose content
        #: is text and that is not a summary: its text and its calls' long arguments), or -1
        self.cuttable: list[int] = []
        self.chars = 0
        #: positions ``[0, older_to)`` are in the sorted lists below
        self.older_to = 0
        self._older: dict[int, list[_Item]] = {TOOL: [], AI: [], HUMAN: []}
        #: the position of each message named by the caps :meth:`older_caps` returned last
        self.where: dict[str, int] = {}

    @property
    def n(self) -> int:
        return len(self.ids)

    # --- keeping in step with the thread ------------------------------------------------

    def sync(self, messages: Sequence[BaseMessage], chars: int | None = None) -> int:
        """Size the messages of ``messages`` not sized yet; all of them again when the sized
        prefix is not ``messages``' (fewer messages, another id at its end) or when the
        total then differs from ``chars`` (the thread's size as the agent's state counts it,
        when known). Returns how many messages were sized."""
        n = self.n
        if n and (n > len(messages) or messages[n - 1].id != self.ids[-1]):
            self.clear()
        fresh = self.append(messages[self.n :])
        if chars is not None and self.chars != chars:
            self.clear()
            fresh = self.append(messages)
        return fresh

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    def append(self, messages: Iterable[BaseMessage]) -> int:
        """Size ``messages``, the thread's next ones."""
        count = 0
        for m in messages:
            self._put(m)
            count += 1
        return count

    def _put(self, m: BaseMessage) -> None:
        size, kind = message_chars(m), _kind(m)
        self.ids.append(str(m.id))
        self.sizes.append(size)
        self.kinds.append(kind)
        self.cuttable.append(_cuttable(m, kind))
        self.chars += size

    def replaced(self, at: Iterable[int], messages: Sequence[BaseMessage]) -> None:
        """The messages at positions ``at`` were replaced in place (same ids) by those of
        ``messages`` (the whole thread) at the same positions: their sizes again."""
        for i in at:
            m = messages[i]
            if i < self.older_to:
                self._drop(i)
            size = message_chars(m)
            self.chars += size - self.sizes[i]
            self.sizes[i] = size
            self.cuttable[i] = _cuttable(m, self.kinds[i])
            if i < self.older_to:
                self._add(i)

    # --- the older messages, sorted -------------------------------------------------------

    def _item(self, i: int) -> _Item | None:
        kind = self.kinds[i]
        if kind == TOOL:
            size = self.sizes[i]
            return (size, self.ids[i], 0, i) if size >= ELIGIBLE_CHARS else None
        cut = self.cuttable[i]
        if cut < ELIGIBLE_CHARS:
            return None
        return (cut, self.ids[i], self.sizes[i] - cut, i)

    def _add(self, i: int) -> None:
        item = self._item(i)
        if item is not None:
            bisect.insort(self._older[self.kinds[i]], item)

    def _drop(self, i: int) -> None:
        item = self._item(i)
        if item is not None:
            items = self._older[self.kinds[i]]
            k = bisect.bisect_left(items, item)
            if k < len(items) and items[k] == item:
                del items[k]

    def _older_until(self, start: int) -> None:
        """Move the sorted lists' end to position ``start``."""
        if start > self.older_to:
            if start - self.older_to > 64:  # many at once (a thread sized anew): one sort
                for i in range(self.older_to, start):
                    item = self._item(i)
                    if item is not None:
                        self._older[self.kinds[i]].append(item)
                for items in self._older.values():
                    items.sort()
            else:
                for i in range(self.older_to, start):
                    self._add(i)
        else:
            for i in range(start, self.older_to):
                self._drop(i)
        self.older_to = start

    # --- the caps -----------------------------------------------------------------------

    def older_caps(
        self,
        keep_chars: int,
        need: int,
        new_from: int | None = None,
        request_floor: int = MIN_OLDER_CHARS,
    ) -> dict[str, int]:
        """:func:`~offpath.compaction.shorten.older_caps` of the sized messages (the same
        arguments, the same caps), in time proportional to the keep window's messages and
        the messages capped, after the first call (which sorts the thread's older
        messages)."""
        self.where = {}
        if need <= 0:
            return {}
        sizes, n = self.sizes, self.n
        acc, start = 0, n
        while start > 0 and acc < keep_chars:
            start -= 1
            acc += sizes[start]
        self._older_until(start)
        caps, saved = _fill(self._older[TOOL], need, MIN_OLDER_CHARS, self.where)
        left = need - saved
        end = n if new_from is None else min(new_from, n)
        if left > 0 and end > start:
            seen = [(self.ids[i], sizes[i]) for i in range(start, end) if self.kinds[i] == TOOL]
            more = caps_for(seen, left, MIN_OLDER_CHARS)
            caps.update(more)
            left -= sum(s - more[i] for i, s in seen if i in more)
            self.where.update((self.ids[i], i) for i in range(start, end) if self.ids[i] in more)
        own_start, acc = max(0, n - 1), sizes[-1] if n else 0
        while own_start > 0 and acc + sizes[own_start - 1] <= keep_chars:
            own_start -= 1
            acc += sizes[own_start]
        for kind, floor in ((AI, MIN_OLDER_CHARS), (HUMAN, max(request_floor, MIN_OLDER_CHARS))):
            if left <= 0:
                break
            items = self._older[kind]
            if kind == HUMAN and own_start > start:  # the requests in the keep window's edge
                extra = [item for i in range(start, own_start) if (item := self._item_of(i, kind))]
                items = sorted(items + extra) if extra else items
            elif kind == HUMAN and own_start < start:  # a keep window of no chars
                out = {self.ids[i] for i in range(own_start, start) if self.kinds[i] == kind}
                items = [item for item in items if item[1] not in out]
            more, saved = _fill(items, left, floor, self.where)
            caps.update(more)
            left -= saved
        return caps

    def _item_of(self, i: int, kind: int) -> _Item | None:
        return self._item(i) if self.kinds[i] == kind else None


def position(messages: Sequence[BaseMessage], message_id: str | None) -> int:
    """The position of the message ``message_id`` in ``messages`` (ids are unique), looked
    for from the end (it is one of the newest); ``len(messages)`` when it is not there or
    ``message_id`` is None."""
    if message_id is not None:
        for i in range(len(messages) - 1, -1, -1):
            if messages[i].id == message_id:
                return i
    return len(messages)


def _cuttable(m: BaseMessage, kind: int) -> int:
    if kind in (AI, HUMAN) and isinstance(m.content, str) and not is_summary(m):
        return len(m.content) + cuttable_chars(m)
    return -1


def _fill(
    items: list[_Item], need: int, floor: int, where: dict[str, int]
) -> tuple[dict[str, int], int]:
    """``(caps, saved)``: :func:`~offpath.compaction.shorten.caps_for` of ``items``
    (sorted; those under ``floor + MIN_SAVING_CHARS`` are left out), each cap raised by the
    chars that stay, and the chars they save at least. The positions of the messages capped
    are added to ``where``."""
    if need <= 0 or not items:
        return {}, 0
    first = bisect.bisect_left(items, (floor + MIN_SAVING_CHARS,))
    if first >= len(items):
        return {}, 0
    cut = [item[0] for item in items[first:]]
    sums = [0, *accumulate(cut)]
    total = sums[-1]

    def saves(c: int) -> int:  # sum(max(0, s - c)) over the eligible
        k = bisect.bisect_right(cut, c)
        return total - sums[k] - c * (len(cut) - k)

    if total - floor * len(cut) <= need:
        cap = floor
    else:
        lo, hi = floor, cut[-1]
        while hi - lo > 1:
            c = (lo + hi) // 2
            if saves(c) >= need:
                lo = c
            else:
                hi = c
        cap = lo
    k = bisect.bisect_left(cut, cap + MIN_SAVING_CHARS)
    capped = items[first + k :]
    where.update((i, at) for _, i, _, at in capped)
    return {i: cap + stays for _, i, stays, _ in capped}, sum(c[0] for c in capped) - cap * len(
        capped
    )


#: Most messages the sizes of :class:`SizedThreads` hold, all threads together (60-130 bytes
#: a message: at most ~26 MB): the threads used least recently are forgotten first.
MAX_SIZED_MESSAGES = 200_000


class SizedThreads:
    """Each thread's :class:`MessageSizes`, by thread id, for the model calls of one process.
    Thread-safe: :meth:`take` hands a thread's sizes to one call at a time (a call of the
    same thread running meanwhile gets sizes of its own, empty), :meth:`give` keeps them for
    the next call."""

    def __init__(self, max_messages: int = MAX_SIZED_MESSAGES) -> None:
        self.max_messages = max_messages
        self._threads: OrderedDict[str, MessageSizes] = OrderedDict()
        self._held = 0
        self._guard = threading.Lock()

    def take(self, thread: str) -> MessageSizes:
        with self._guard:
            sizes = self._threads.pop(thread, None)
            if sizes is not None:
                self._held -= sizes.n
        return sizes if sizes is not None else MessageSizes()

    def give(self, thread: str, sizes: MessageSizes) -> None:
        with self._guard:
            old = self._threads.pop(thread, None)
            if old is not None:
                self._held -= old.n
            if sizes.n > self.max_messages:
                return
            self._threads[thread] = sizes
            self._held += sizes.n
            while self._held > self.max_messages:
                _, dropped = self._threads.popitem(last=False)
                self._held -= dropped.n

    def forget(self, thread: str) -> None:
        with self._guard:
            sizes = self._threads.pop(thread, None)
            if sizes is not None:
                self._held -= sizes.n
