"""The middleware's state and what a model call returns: :class:`OffPathState` (the agent's
state with the thread's private key), a model call as its decisions change it (:class:`Turn`,
:class:`CompactingTurn`), what it returns (:class:`Call`) and an archive write it makes
(:data:`Write`), and the updates the hooks build from them: a call's
(:func:`diff`), a subgraph run's to its parent (:func:`parent_update`), the thread's private
key (:func:`private_of`), what a call sends (:func:`sending`) and the chars it sends besides
the thread (:func:`outside_chars`, kept in the private key: :func:`outside_of`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Annotated, Any, NotRequired, cast, get_type_hints

from langchain.agents.middleware import AgentState
from langchain.agents.middleware.types import ModelRequest, OmitFromSchema, PrivateStateAttr
from langchain_core.messages import AnyMessage, BaseMessage, RemoveMessage
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from offpath.agent.middleware.place import Place
from offpath.compaction.accounting import message_chars
from offpath.compaction.planner.budgets import ThreadBudget
from offpath.compaction.sizing import MessageSizes
from offpath.compaction.tracking import KEY, ThreadSize


class OffPathState(AgentState):
    offpath: NotRequired[Annotated[dict[str, Any], PrivateStateAttr]]


#: An archive write a model call makes: the job it stores (None: results shortened), and
#: the write itself.
Write = tuple[str | None, Callable[[], None]]


@dataclass(slots=True)
class Turn:
    """A model call's thread as the middleware's decisions change it: the messages as the
    agent sent them (``original``) and as they stand (``messages``), the private key, the
    thread's size (``size``; as the state had it before: ``size_before``), where the
    messages new to the state start (``new_from``), and what the call changed: the archive
    writes to make while the model answers, the positions of ``original`` shortened in place,
    and whether a compaction was applied (the thread is sized anew)."""

    request: ModelRequest
    original: list[BaseMessage]
    private: dict[str, Any]
    size_before: dict[str, Any] | None
    size: ThreadSize
    new_from: int
    messages: list[BaseMessage] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    changed: list[int] = field(default_factory=list)
    applied: bool = False

    @property
    def session_id(self) -> str | None:
        """The thread's session, when offpath compacts it (:class:`CompactingTurn`)."""
        return None

    @property
    def fresh(self) -> list[BaseMessage]:
        """The call's messages new to the state (at the thread's end), as they stand."""
        if self.new_from >= len(self.original):
            return []
        ids = {m.id for m in self.original[self.new_from :]}
        return [m for m in self.messages[-len(ids) :] if m.id in ids]


@dataclass(slots=True, kw_only=True)
class CompactingTurn(Turn):
    """A :class:`Turn` of a thread offpath compacts (its run's ``place`` allows it, offpath
    is active): its session, its messages' sizes as this process keeps them (``sizes``),
    what the call sends besides them (``out``, chars), its budget, and its size (chars,
    thread only) before this call shortened older results (``reached``)."""

    place: Place
    session: str
    sizes: MessageSizes
    out: int
    budget: ThreadBudget
    reached: int = 0

    @property
    def session_id(self) -> str | None:
        return self.session

    @property
    def chars(self) -> int:
        """The thread's size (chars) as its messages now stand."""
        return self.sizes.chars


@dataclass(slots=True)
class Call:
    """One model call: the request to send, and the state update to return with the answer."""

    request: ModelRequest
    update: dict[str, Any] = field(default_factory=dict)
    chars: int = 0  # what the call is sent (messages), for the calibration
    session_id: str | None = None
    #: the archive writes of this call's shortenings and apply, in the order they were
    #: made, running (one after another) while the model answers
    stored: Future[Any] | None = None
    #: the thread's size as the state had it before the call (put back if a write fails)
    size_before: dict[str, Any] | None = None


def private_of(state: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of the thread's private key in the agent's ``state`` (empty if it has none)."""
    return dict((state or {}).get(KEY) or {})


def sending(request: ModelRequest, messages: Sequence[BaseMessage]) -> ModelRequest:
    """``request`` sending ``messages`` instead of its own."""
    # the thread's messages, or copies of them: the classes of ``AnyMessage``, which
    # ModelRequest.messages is typed as
    return request.override(messages=cast("list[AnyMessage]", list(messages)))


def outside_chars(request: ModelRequest) -> int:
    """Chars a model call sends besides the thread's messages: its system prompt when it is
    given to the agent (``create_agent(system_prompt=...)``) rather than held in the thread.
    Tool schemas are not counted (the seed counts messages)."""
    system = request.system_message
    return message_chars(system) if system is not None else 0


def outside_of(private: dict[str, Any]) -> int:
    """The chars the run's last model call sent besides the thread (:func:`outside_chars`,
    kept in the private key for the hooks that have no request: the run's end, the job)."""
    return int(private.get("outside") or 0)


def diff(before: Sequence[BaseMessage], after: Sequence[BaseMessage]) -> list[BaseMessage]:
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


def parent_update(state: dict[str, Any]) -> dict[str, Any]:
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
