"""Which tool result answers which tool call. Pure.

The rule: a result answers the **nearest earlier
unanswered call with its id**. Matching by id alone is not enough: some
OpenAI-compatible servers (Ollama, Kimi on vLLM) number tool calls per response,
so every turn's first call is ``fetch_logs:0``, and pairing the first call with
the last result makes one "pair" span the whole thread (the ``reused-call-ids``
case). Matching by position is not enough either: a result may come after other
messages (the ``content-blocks`` case puts a human message between a call and its
result).

A result with no earlier unanswered call of its id is an *orphan* (left by another
framework's bad trim, or a second answer to one call). A call with no result is
*open*: pending while no later turn has begun, abandoned otherwise.

:class:`CallPairer` works one message at a time, so the planner can pair in the
same pass that sizes the messages; :func:`pair_messages` runs it over a list.

Requests and their answers pair the same way, by turn (DESIGN.md invariant 17): a
*turn* is a request (a human message that is not a summary) and the model's messages
and tool results after it, up to the next request. :func:`broken_turns` names a
finished turn kept in part: its request without any answer, or answers whose request
is gone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.messages.tool import InvalidToolCall, ToolCall

from offpath.compaction.summary import is_summary


def call_ids(message: AIMessage) -> list[str]:
    """Ids of an AI message's calls, malformed ones (``invalid_tool_calls``) included. An
    empty id is an id: a provider that sends ``"id": ""`` has its calls answered by results
    with ``tool_call_id=""`` (LangGraph's tool node copies the call's id). A call with no id
    at all (None) cannot be answered and is left out."""
    calls: list[ToolCall | InvalidToolCall] = [*message.tool_calls, *message.invalid_tool_calls]
    return [cid for c in calls if (cid := c.get("id")) is not None]


class CallPairer:
    """Pairs results with calls as messages are fed in thread order (by index).

    ``pairs`` holds ``(call message index, result message index)``; ``orphans`` the
    indexes of results that answer no call. :meth:`open_calls` lists calls still
    waiting, as ``(message index, call id)``.
    """

    __slots__ = ("_open", "orphans", "pairs")

    def __init__(self) -> None:
        self._open: dict[str, list[int]] = {}
        self.pairs: list[tuple[int, int]] = []
        self.orphans: list[int] = []

    def add_calls(self, index: int, ids: Iterable[str]) -> None:
        """The AI message at ``index`` makes calls with ``ids`` (an id may repeat)."""
        for cid in ids:
            stack = self._open.get(cid)
            if stack is None:
                self._open[cid] = [index]
            else:
                stack.append(index)

    def add_result(self, index: int, call_id: str) -> int | None:
        """The tool message at ``index`` answers ``call_id``: returns the index of the call
        it answers, or None (an orphan)."""
        stack = self._open.get(call_id)
        if not stack:
            self.orphans.append(index)
            return None
        call = stack.pop()
        if not stack:
            del self._open[call_id]
        self.pairs.append((call, index))
        return call

    def add(self, index: int, message: BaseMessage) -> None:
        """Feed one message of any type."""
        if isinstance(message, ToolMessage):
            self.add_result(index, message.tool_call_id)
        elif isinstance(message, AIMessage) and (message.tool_calls or message.invalid_tool_calls):
            self.add_calls(index, call_ids(message))

    def open_calls(self) -> list[tuple[int, str]]:
        """Calls with no result yet, as ``(message index, call id)``, in thread order."""
        return sorted((i, cid) for cid, stack in self._open.items() for i in stack)


@dataclass(frozen=True, slots=True)
class Pairing:
    """The pairing of a whole message list (indexes into it)."""

    pairs: tuple[tuple[int, int], ...]
    orphans: tuple[int, ...]
    open_calls: tuple[tuple[int, str], ...]


def pair_messages(messages: Sequence[BaseMessage]) -> Pairing:
    """Pair every tool result of ``messages`` with its call (see the module doc)."""
    pairer = CallPairer()
    for i, m in enumerate(messages):
        pairer.add(i, m)
    return Pairing(tuple(pairer.pairs), tuple(pairer.orphans), tuple(pairer.open_calls()))


def unpaired(messages: Sequence[BaseMessage]) -> set[str]:
    """What is unpaired in ``messages``, named by message id: ``result:<tool message id>``
    for orphan results and ``call:<ai message id>:<call id>`` for calls with no result
    (pending calls included). Message ids, not call ids, since call ids may repeat."""
    p = pair_messages(messages)
    out = {f"result:{messages[i].id}" for i in p.orphans}
    out.update(f"call:{messages[i].id}:{cid}" for i, cid in p.open_calls)
    return out


def new_unpaired(before: Sequence[BaseMessage], after: Sequence[BaseMessage]) -> set[str]:
    """What is unpaired in ``after`` and was not in ``before``: a patch must leave this
    empty (DESIGN.md invariant 3); checked before a patch is written."""
    return unpaired(after) - unpaired(before)


def is_request(message: BaseMessage) -> bool:
    """``message`` starts a turn: a human message that is not a summary (a request's copy
    kept after a summary is one)."""
    return isinstance(message, HumanMessage) and not is_summary(message)


def broken_turns(messages: Sequence[BaseMessage]) -> set[str]:
    """Finished turns of ``messages`` kept in part (DESIGN.md invariant 17):
    ``unanswered:<request id>`` for a request followed by the next request with no model
    message in between, and ``headless:<message id>`` for a model message or tool result
    before the thread's first request, when a later request follows (its own request is
    gone). The last turn is in progress and is not judged; a call still waiting for its
    result, and the results its message has, stay wherever their turn went (invariant 14)
    and are not counted. A patch must add none: :func:`new_broken_turns`."""
    last = next((i for i in range(len(messages) - 1, -1, -1) if is_request(messages[i])), None)
    if last is None:
        return set()
    pairing = pair_messages(messages)
    open_ai = {i for i, _ in pairing.open_calls}
    staying = open_ai | {t for a, t in pairing.pairs if a in open_ai}
    problems: set[str] = set()
    request: int | None = None
    answered = True
    for i, m in enumerate(messages[: last + 1]):
        if is_request(m):
            if request is not None and not answered:
                problems.add(f"unanswered:{messages[request].id}")
            request, answered = i, False
        elif isinstance(m, AIMessage):
            answered = True
        if request is None and isinstance(m, (AIMessage, ToolMessage)) and i not in staying:
            problems.add(f"headless:{m.id}")
    return problems


def new_broken_turns(before: Sequence[BaseMessage], after: Sequence[BaseMessage]) -> set[str]:
    """What :func:`broken_turns` names in ``after`` and not in ``before``: a patch must leave
    this empty (DESIGN.md invariant 17), as it leaves :func:`new_unpaired` empty."""
    return broken_turns(after) - broken_turns(before)
