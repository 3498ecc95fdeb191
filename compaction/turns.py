"""Validation of a turn appended from elsewhere (``POST /sessions/{id}/turns``). Pure.

:func:`validate_turn` checks the new messages against the thread's current
messages and returns them ready to append, or raises :class:`TurnError` naming
the first problem. Nothing is written unless every message passes (DESIGN.md
invariant 8).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from compaction.accounting import message_chars

ALLOWED = (SystemMessage, HumanMessage, AIMessage, ToolMessage)


class TurnError(ValueError):
    """The turn cannot be appended; the message says which message and why."""


def validate_turn(
    current: Sequence[BaseMessage],
    new: Sequence[BaseMessage],
    *,
    max_messages: int,
    max_message_chars: int,
) -> list[BaseMessage]:
    """Check ``new`` against ``current`` and return it with ids filled in.

    Rules: 1 to ``max_messages`` messages; only system, human, ai and tool
    messages; at most ``max_message_chars`` chars each; ids unique and not
    already in the thread (re-sending an id would silently edit a message);
    tool calls well-formed with unique ids; every tool result answers a call
    made before it (in the thread or earlier in the turn) that has no result
    yet. Calls may stay unanswered (pending, e.g. waiting for approval).
    """
    if not new:
        raise TurnError("the turn has no messages")
    if len(new) > max_messages:
        raise TurnError(f"the turn has {len(new)} messages; at most {max_messages} are accepted")
    seen_ids = {m.id for m in current}
    calls: set[str] = set()
    answered: set[str] = set()
    for m in current:
        if isinstance(m, AIMessage):
            calls.update(c["id"] for c in m.tool_calls if c.get("id"))
        elif isinstance(m, ToolMessage):
            answered.add(m.tool_call_id)
    out: list[BaseMessage] = []
    for i, m in enumerate(new):
        where = f"message {i}"
        if not isinstance(m, ALLOWED):
            raise TurnError(f"{where}: type {m.type!r} is not accepted (system, human, ai or tool)")
        if m.id is None:
            m = m.model_copy(update={"id": str(uuid.uuid4())})
        if m.id in seen_ids:
            raise TurnError(f"{where}: id {m.id!r} is already used in this session or turn")
        seen_ids.add(m.id)
        if (size := message_chars(m)) > max_message_chars:
            raise TurnError(f"{where}: {size} chars; at most {max_message_chars} are accepted")
        if isinstance(m, AIMessage):
            if m.invalid_tool_calls:
                bad = m.invalid_tool_calls[0]
                raise TurnError(
                    f"{where}: tool call {bad.get('id')!r} is malformed ({bad.get('error') or 'bad arguments'})"
                )
            for call in m.tool_calls:
                cid = call.get("id")
                if not cid or not call.get("name"):
                    raise TurnError(f"{where}: every tool call needs an id and a name")
                if cid in calls:
                    raise TurnError(f"{where}: tool call id {cid!r} is used twice")
                calls.add(cid)
        elif isinstance(m, ToolMessage):
            cid = m.tool_call_id
            if cid not in calls:
                raise TurnError(
                    f"{where}: tool result for {cid!r} answers no tool call of this session"
                )
            if cid in answered:
                raise TurnError(f"{where}: tool call {cid!r} already has a result")
            answered.add(cid)
        out.append(m)
    return out
