"""What a model call is about to see, kept incrementally, and the in-path fallback. Pure.

The middleware runs at every model call of an agent run, so it must not rescan
the thread (a run may reach 100,000 messages). :class:`ThreadSize` is carried in
the agent's state and advanced over the messages added since the last step:
O(new messages). It holds the thread's size in chars (the same
:func:`~offpath.compaction.accounting.message_chars` as the planner) and the
tool-call bookkeeping needed to spot orphan results (a result whose call no
longer precedes it: it must never reach a model call; issue 8, item 10).

:func:`mask_observations` is the last resort when a model call would exceed the
hard limit and no summary is prepared (DESIGN.md invariant 9): the bodies of the
oldest tool results are replaced by a one-line placeholder, for that call only
("observation masking"); the stored thread is unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from offpath.compaction.accounting import message_chars
from offpath.compaction.pairing import call_ids


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


@dataclass(frozen=True, slots=True)
class Masking:
    """What :func:`mask_observations` hid: ``results`` tool results, ``chars`` chars."""

    results: int
    chars: int
    over_by: int  # chars still over the limit once every tool result is masked (0: under)


def mask_observations(
    messages: Sequence[BaseMessage], limit: int, total: int | None = None
) -> tuple[list[BaseMessage], Masking]:
    """``messages`` with the oldest tool results' bodies replaced by :data:`MASK` until their
    size is at most ``limit`` chars (``total``: their size, if known). The result is a new
    list; the messages passed in are not changed."""
    size = total if total is not None else sum(message_chars(m) for m in messages)
    out = list(messages)
    results = hidden = 0
    for i, m in enumerate(out):
        if size <= limit:
            break
        if not isinstance(m, ToolMessage):
            continue
        chars = message_chars(m)
        placeholder = MASK.format(chars=chars)
        if chars <= len(placeholder):
            continue
        out[i] = m.model_copy(update={"content": placeholder, "artifact": None})
        size -= chars - len(placeholder)
        results += 1
        hidden += chars - len(placeholder)
    return out, Masking(results, hidden, max(0, size - limit))
