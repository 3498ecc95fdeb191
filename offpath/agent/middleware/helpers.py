"""The middleware's logger and its module-level functions on a thread and its run: what a
model call sends besides the thread (:func:`outside_chars`), the state update a call returns (:func:`_diff`), the
checkpoint namespace of the graph it runs in and a subgraph's update to its parent."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, get_type_hints

from langchain.agents.middleware import AgentState
from langchain.agents.middleware.types import ModelRequest, OmitFromSchema
from langchain_core.messages import BaseMessage, RemoveMessage
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from offpath.compaction.accounting import message_chars
from offpath.compaction.tracking import KEY

log = logging.getLogger("offpath.middleware")


def outside_chars(request: ModelRequest) -> int:
    """Chars a model call sends besides the thread's messages: its system prompt when it is
    given to the agent (``create_agent(system_prompt=...)``) rather than held in the thread.
    Tool schemas are not counted (the seed counts messages)."""
    system = request.system_message
    return message_chars(system) if system is not None else 0


def _outside(private: dict[str, Any]) -> int:
    """The chars the run's last model call sent besides the thread (:func:`outside_chars`,
    kept in the private key for the hooks that have no request: the run's end, the job)."""
    return int(private.get("outside") or 0)


def _diff(before: Sequence[BaseMessage], after: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The ``add_messages`` update that turns ``before`` into ``after``, where ``after`` only
    replaced messages in place or removed them (its ids are ``before``'s, in order)."""
    now = {m.id: m for m in after}
    update: list[BaseMessage] = []
    for m in before:
        new = now.get(m.id)
        if new is None:
            update.append(RemoveMessage(id=str(m.id)))
        elif new is not m and new != m:
            update.append(new)
    return update


def _parent_update(state: dict[str, Any]) -> dict[str, Any]:
    """What a subgraph run that removed messages writes to its parent: its messages as they
    are (replacing the parent's whole list: the parent's reducer only adds and replaces, so
    the messages a compaction removed would stay there) and its other output keys."""
    hidden = {KEY}
    for name, hint in get_type_hints(AgentState, include_extras=True).items():
        extras = getattr(hint, "__metadata__", ())
        if any(isinstance(x, OmitFromSchema) and x.output for x in extras):
            hidden.add(name)
    update = {k: v for k, v in state.items() if k not in hidden and k != "messages"}
    update["messages"] = [RemoveMessage(id=REMOVE_ALL_MESSAGES), *state["messages"]]
    return update
