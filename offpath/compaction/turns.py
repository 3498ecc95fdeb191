"""Validation of a turn appended from elsewhere (``POST /sessions/{id}/turns``). Pure.

:func:`validate_turn` checks the new messages against the thread's current
messages and returns them ready to append, or raises :class:`TurnError` naming
the first problem. Nothing is written unless every message passes (DESIGN.md
invariant 8).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from offpath.compaction.accounting import wire_chars
from offpath.compaction.pairing import CallPairer

ALLOWED = (SystemMessage, HumanMessage, AIMessage, ToolMessage)
#: ``additional_kwargs`` keys only offpath writes (a shortened result's mark, with its
#: original's digest; a kept request's copy): a client's copy of one is dropped, so that it
#: can neither hide a change from a prepared compaction nor pass for offpath's.
OWN_MARKS = ("offpath_shortened", "offpath_request_of")


class TurnError(ValueError):
    """The turn cannot be appended; the message says which message and why."""


@dataclass(frozen=True, slots=True)
class TurnWarning:
    """Something accepted but worth saying: ``code`` names it, ``message`` says where."""

    code: str
    message: str


#: ``TurnWarning.code`` of a tool result that answers no earlier unanswered call.
ORPHAN_RESULT = "orphan_tool_result"


def check_messages(
    new: Sequence[BaseMessage], *, max_messages: int, max_message_chars: int
) -> list[BaseMessage]:
    """The checks of :func:`validate_turn` that need no thread: 1 to ``max_messages``
    messages; only system, human, ai and tool messages; at most ``max_message_chars``
    chars each, every field counted; message ids non-empty (a missing one is given a
    UUID) and unique in the turn; tool calls with an id and a name. Returns ``new`` with
    ids filled in; raises :class:`TurnError` naming the first bad message.

    The API runs them before it looks at who owns the session, so that a refused turn
    answers the same whoever owns the id."""
    if not new:
        raise TurnError("the turn has no messages")
    if len(new) > max_messages:
        raise TurnError(f"the turn has {len(new)} messages; at most {max_messages} are accepted")
    seen_ids: set[str | None] = set()
    out: list[BaseMessage] = []
    for i, m in enumerate(new):
        where = f"message {i}"
        if not isinstance(m, ALLOWED):
            raise TurnError(f"{where}: type {m.type!r} is not accepted (system, human, ai or tool)")
        if m.id is None:
            m = m.model_copy(update={"id": str(uuid.uuid4())})
        elif not m.id:  # no compaction could ever remove it: the thread would never compact
            raise TurnError(f"{where}: id is empty; send a non-empty id, or none to get one")
        if m.id in seen_ids:
            raise TurnError(f"{where}: id {m.id!r} is already used in this session or turn")
        if any(k in m.additional_kwargs for k in OWN_MARKS):
            extra = {k: v for k, v in m.additional_kwargs.items() if k not in OWN_MARKS}
            m = m.model_copy(update={"additional_kwargs": extra})
        seen_ids.add(m.id)
        if (size := wire_chars(m)) > max_message_chars:
            raise TurnError(
                f"{where}: {size} chars, every field counted; at most {max_message_chars} "
                "are accepted (MAX_MESSAGE_CHARS)"
            )
        if isinstance(m, AIMessage):
            for call in [*m.tool_calls, *m.invalid_tool_calls]:
                if not call.get("id") or not call.get("name"):
                    raise TurnError(f"{where}: every tool call needs an id and a name")
        out.append(m)
    return out


def validate_turn(
    current: Sequence[BaseMessage],
    new: Sequence[BaseMessage],
    *,
    max_messages: int,
    max_message_chars: int,
    open_calls: Mapping[str, int] | None = None,
    checked: bool = False,
) -> tuple[list[BaseMessage], list[TurnWarning]]:
    """Check ``new`` against ``current``; return it with ids filled in, and the warnings.

    Rules: 1 to ``max_messages`` messages; only system, human, ai and tool
    messages; at most ``max_message_chars`` chars each, every field counted
    (:func:`~offpath.compaction.accounting.wire_chars`); message ids non-empty (a missing
    one is given a UUID), unique and not already in the thread (re-sending an id would silently edit a message); tool
    calls with an id and a name. Call ids may repeat (some servers number calls per
    response): a result answers the nearest earlier unanswered call with its id
    (:mod:`compaction.pairing`). Calls may stay unanswered (pending, e.g. waiting for
    approval). A result that answers no call (an orphan, e.g. left by another
    framework's bad trim) is accepted with an ``orphan_tool_result`` warning: it is
    never sent to a model and the next compaction removes it.
    Raises :class:`TurnError` naming the first bad message.

    ``open_calls``: the thread's unanswered calls by id, with their counts, if known
    (:class:`~offpath.compaction.tracking.ThreadSize` keeps them): the thread is then
    not walked to pair its calls. ``checked``: ``new`` comes from :func:`check_messages`
    already (its checks are not run twice).
    """
    if not checked:
        new = check_messages(new, max_messages=max_messages, max_message_chars=max_message_chars)
    seen_ids = {m.id for m in current}
    pairer = CallPairer()
    if open_calls is None:
        for i, m in enumerate(current):
            pairer.add(i, m)
    else:
        for cid, n in open_calls.items():
            pairer.add_calls(-1, [cid] * n)
    base = len(current)
    warnings: list[TurnWarning] = []
    for i, m in enumerate(new):
        where = f"message {i}"
        if m.id in seen_ids:
            raise TurnError(f"{where}: id {m.id!r} is already used in this session or turn")
        if isinstance(m, ToolMessage) and pairer.add_result(base + i, m.tool_call_id) is None:
            warnings.append(
                TurnWarning(
                    ORPHAN_RESULT,
                    f"{where}: tool result for {m.tool_call_id!r} answers no earlier unanswered "
                    "call; it is kept, never sent to a model, and removed by the next compaction",
                )
            )
        if isinstance(m, AIMessage):
            pairer.add(base + i, m)
    return list(new), warnings
