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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from offpath.compaction.accounting import args_chars, content_chars, message_chars
from offpath.compaction.pairing import call_ids

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
