"""The middleware's state and what a model call returns: :class:`OffPathState` (the agent's
state with the thread's private key), a model call as its decisions change it (:class:`Turn`,
:class:`CompactingTurn`), what it returns (:class:`Call`) and an archive write it makes
(:data:`Write`), and the updates the hooks build from them: a call's
(:func:`diff`), a subgraph run's to its parent (:func:`parent_update`), the thread's private
key (:func:`private_of`), what a call sends (:func:`sending`) and the chars it sends besides
the thread (:func:`outside_chars`, kept in the private key: :func:`outside_of`); the thread a
call is about, the state's own messages (:func:`thread_of`), and what a middleware before
offpath changed in the call's copy of them (:class:`Overlay`), made again on what it sends.

And where an agent run stands in the graphs around it (:class:`Place`, :class:`Places`),
which decides whose messages it may compact and what update its parent is handed
(DESIGN.md invariant 18: a callee never writes its caller's state).

An agent with ``OffPathCompaction`` runs either as the root graph of a run, or inside another
graph's run (LangGraph then gives it the caller's checkpointer and ``thread_id``, under a
checkpoint namespace of its own). Inside another run it is one of:

* **a node sharing its parent's messages** (``parent.add_node("agent", agent)``): its input
  is the parent's whole ``messages`` list. Its thread *is* the parent's thread: it keeps the
  ``thread_id`` as its session, and at the end of a run that removed messages it hands the
  parent the thread whole (a subgraph's ``RemoveMessage`` never reaches its parent,
  langgraph#5755);
* **a callee with messages of its own**: run from inside a tool (deepagents' ``task``, a plain
  ``sub.invoke`` in a tool: the parent's last model message has a call still open, the one
  running it), or a node given a message list of its own (``Send`` fan-out: *fanned*). It
  compacts its own messages under a session of its own (``<thread_id>|<namespace>``), never
  writes its caller's state, and is never listed as a session. A fanned run's messages become
  its caller's when the caller's reducer merges its output: at its end it puts back the
  originals its compactions removed (from its archive), so that the caller receives its
  messages whole, as without offpath, and compacts them as its own (never a callee's summary
  in the caller's thread);
* **a node given the parent's whole thread in a step that runs other nodes too** (several
  ``Send`` packets, each with the parent's messages and an ask of its own; two agent nodes
  run in parallel from one edge; any node beside it in that step): fanned, not shared, since
  a thread one run handed up whole would wipe what the others write in the same step. Its
  compactions serve its own model calls; the parent's thread is compacted by a node that runs
  alone in its step;
* **a node given part of its caller's messages** (some of the parent's message ids, not all,
  and its output merged back by the parent's reducer): a compaction would replace or remove
  the caller's messages there, so it is refused: the run goes on uncompacted, and the
  middleware says so once.

The parent's messages are read once per run place from the parent's checkpoint of the current
step (the run's checkpointer and ``checkpoint_map``, as LangGraph hands them to a subgraph).
When they cannot be read, the run is taken for a callee: it never writes the parent.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, NotRequired, cast, get_type_hints

from langchain.agents.middleware import AgentState
from langchain.agents.middleware.types import ModelRequest, OmitFromSchema, PrivateStateAttr
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, RemoveMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config
from langgraph.constants import CONFIG_KEY_CHECKPOINTER, TASKS
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from offpath.compaction.accounting import message_chars
from offpath.compaction.pairing import pair_messages
from offpath.compaction.planner import ThreadBudget
from offpath.compaction.tracking import KEY, MessageSizes, ThreadSize

#: What separates a callee's session id from the caller's ``thread_id``.
SESSION_SEP = "|"
#: How long (s) the parent's checkpoint of the current step is waited for: LangGraph writes
#: checkpoints in the background, and a subgraph's first model call can come before it.
PARENT_READ_WAIT_S = 0.5
#: Run places remembered (one per graph namespace a run went through).
PLACES_KEPT = 4_096


class Role(StrEnum):
    """How a run's messages relate to its caller's (see the module doc)."""

    ROOT = "root"
    SHARED = "shared"  # a node whose messages are its parent's
    CALLEE = "callee"  # messages of its own, run from a tool
    FANNED = "fanned"  # messages of its own, merged into its caller's by the caller's reducer
    REFUSED = "refused"  # part of its caller's messages: not compacted


@dataclass(frozen=True, slots=True)
class Place:
    """A run's place: LangGraph's ``thread_id``, the checkpoint namespace of the agent's graph
    (``""`` for a root graph), its :class:`Role`, and the session offpath keeps for it."""

    thread_id: str
    ns: str
    role: Role

    @property
    def session_id(self) -> str:
        """The thread's session: the ``thread_id`` itself, or for a callee
        ``<thread_id>|<namespace>`` (a callee's messages are not its caller's thread)."""
        if self.role in (Role.CALLEE, Role.FANNED):
            return f"{self.thread_id}{SESSION_SEP}{self.ns}"
        return self.thread_id

    @property
    def compacts(self) -> bool:
        return self.role is not Role.REFUSED

    @property
    def listed(self) -> bool:
        """Its thread is listed as a session (a callee's messages are a step of its caller's)."""
        return self.role in (Role.ROOT, Role.SHARED)

    @property
    def hands_up(self) -> bool:
        """A run that removed messages hands its parent the thread whole."""
        return self.role is Role.SHARED

    @property
    def hands_whole(self) -> bool:
        """A run that removed messages ends with its originals back (from the archive): its
        messages are its caller's once the caller's reducer merges them, and a compaction of
        its own is for its own model calls, never for its caller's thread."""
        return self.role is Role.FANNED


def graph_ns(config: RunnableConfig) -> str:
    """The checkpoint namespace of the graph a node runs in: ``""`` for a root graph, a
    subgraph's (``agent:<task id>``, ``tools:<task id>``) otherwise. A node's own config names
    its task last (``...|model:<task id>``): that part is not a graph's."""
    ns = str(config.get("configurable", {}).get("checkpoint_ns") or "")
    return ns.rsplit("|", 1)[0] if "|" in ns else ""


def role_of(
    parent: Sequence[BaseMessage] | None, own: Sequence[BaseMessage], siblings: int = 1
) -> Role:
    """The :class:`Role` of a run inside another graph's run whose parent holds ``parent``
    (None: not readable) and whose own messages are ``own`` at its first look; ``siblings``:
    how many node runs the parent's step makes, this one included (``Send`` packets and nodes
    an edge triggered). A run given the parent's whole thread is fanned, not shared, when it
    is one of several: a thread handed up whole by one run would wipe what the others write
    to the parent in the same step (any of them may write messages). Pure."""
    if not parent:
        return Role.CALLEE
    last_ai = next((m for m in reversed(parent) if isinstance(m, AIMessage)), None)
    if last_ai is not None and last_ai.tool_calls:
        waiting = {cid for i, cid in pair_messages(parent).open_calls if parent[i] is last_ai}
        if waiting:  # the parent is running its tools: one of them runs this agent
            return Role.CALLEE
    theirs = [m.id for m in parent]
    mine = [m.id for m in own]
    if mine[: len(theirs)] == theirs:
        return Role.FANNED if siblings > 1 else Role.SHARED
    if set(theirs) & set(mine):
        return Role.REFUSED
    return Role.FANNED


class Places:
    """The places of the runs a middleware sees, found once per ``(thread_id, namespace)``
    (the parent's checkpoint is read then) and remembered (at most :data:`PLACES_KEPT`)."""

    def __init__(self) -> None:
        self._known: OrderedDict[tuple[str, str], Place] = OrderedDict()

    def of_run(self, messages: Sequence[BaseMessage] | None = None) -> Place | None:
        """The place of the run this call belongs to (None: not inside a run with a
        ``thread_id``). ``messages``: the run's messages at this call, needed the first time
        a run inside another graph is seen."""
        try:
            config = get_config()
        except RuntimeError:  # not inside a run
            return None
        thread = config.get("configurable", {}).get("thread_id")
        if thread is None:
            return None
        ns = graph_ns(config)
        key = (str(thread), ns)
        place = self._known.get(key)
        if place is not None:
            return place
        if not ns:
            role = Role.ROOT
        elif messages is None:
            return Place(str(thread), ns, Role.CALLEE)  # not remembered: looked at again
        else:
            parent, siblings = _parent_step(config, str(thread), ns)
            role = role_of(parent, messages, siblings)
        place = self._known[key] = Place(str(thread), ns, role)
        while len(self._known) > PLACES_KEPT:
            self._known.popitem(last=False)
        return place

    def session_of_run(self) -> str | None:
        """The session of the run this call belongs to, as :meth:`of_run` found it (the
        ``recall`` tool's: a callee's archive is its own)."""
        place = self.of_run()
        return place.session_id if place is not None else None


def _parent_step(
    config: RunnableConfig, thread: str, ns: str
) -> tuple[list[BaseMessage] | None, int]:
    """The messages of the graph that runs the agent's graph, as its checkpoint of the current
    step holds them (the input the agent got, if it is a node sharing them; None when the
    checkpoint cannot be read within :data:`PARENT_READ_WAIT_S`), and how many node runs that
    step makes (:func:`runs_in_step`; 0 when it cannot be read)."""
    tup = _parent_checkpoint(config, thread, ns)
    if tup is None:
        return None, 0
    values = tup.checkpoint.get("channel_values", {})
    messages = values.get("messages")
    return (list(messages) if isinstance(messages, list) else None), runs_in_step(tup.checkpoint)


#: The channel an edge writes to trigger a node (LangGraph's ``branch:to:<node>``).
BRANCH_TO = "branch:to:"


def runs_in_step(checkpoint: Mapping[str, Any]) -> int:
    """How many node runs the step after ``checkpoint`` makes: its ``Send`` packets, and the
    nodes an edge or a ``Command(goto=...)`` triggered (their ``branch:to:<node>`` channel
    holds a value until the node has run). Pure."""
    values = checkpoint.get("channel_values", {})
    sends = len(values.get(TASKS) or [])
    return sends + sum(1 for channel in values if channel.startswith(BRANCH_TO))


def _parent_checkpoint(config: RunnableConfig, thread: str, ns: str) -> Any:
    """The checkpoint tuple of the parent graph's current step, or None when it cannot be
    read within :data:`PARENT_READ_WAIT_S`."""
    conf = config.get("configurable", {})
    saver = conf.get(CONFIG_KEY_CHECKPOINTER)
    parent_ns = ns.rsplit("|", 1)[0] if "|" in ns else ""
    checkpoint_id = (conf.get("checkpoint_map") or {}).get(parent_ns)
    if saver is None or not checkpoint_id:
        return None
    read = {"configurable": {"thread_id": thread, "checkpoint_ns": parent_ns}}
    read["configurable"]["checkpoint_id"] = checkpoint_id
    deadline = time.monotonic() + PARENT_READ_WAIT_S
    while True:
        try:
            tup = saver.get_tuple(read)
        except Exception:  # a saver that cannot read it: taken for a callee
            return None
        if tup is not None:
            return tup
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


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
    #: what a middleware before offpath changed in the call's copy of the thread
    overlay: Overlay | None = None

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


@dataclass(frozen=True, slots=True)
class Overlay:
    """What a middleware placed before offpath (its handler is offpath's) changed in the
    call's copy of the thread: LangChain's ``ContextEditingMiddleware`` clears old tool
    results, a dynamic-context middleware adds a reminder, a trimming one leaves messages
    out. Those are the call's, never the thread's: offpath compacts and shortens the
    state's own messages, writes only those, and sends the call its result with the same
    edits made again (:meth:`over`).

    ``edited``: the copy's version of a thread message, by id; ``dropped``: the ids of the
    thread messages the copy leaves out; ``added``: the copy's messages not in the thread,
    each with the id of the thread message it follows (None: at the head)."""

    edited: Mapping[str, BaseMessage]
    dropped: frozenset[str]
    added: tuple[tuple[str | None, BaseMessage], ...]

    def over(
        self, messages: Sequence[BaseMessage], thread: Sequence[BaseMessage]
    ) -> list[BaseMessage]:
        """``messages`` (``thread`` as offpath left it: shortened in place, compacted) with
        the copy's edits made again: a message offpath left as it was is sent as the copy has
        it, one the copy left out is left out, and each added message follows the message it
        followed (or, that one removed by a compaction, comes where it stood)."""
        untouched = {id(m) for m in thread}
        order = {m.id: i for i, m in enumerate(thread)}
        out = [m for anchor, m in self.added if anchor is None]
        rest = sorted((order[a], k) for k, (a, _) in enumerate(self.added) if a is not None)
        p = 0
        for m in messages:
            i = order.get(m.id, -1)  # its place in the thread (a summary has none)
            while i >= 0 and p < len(rest) and rest[p][0] < i:  # their message was removed
                out.append(self.added[rest[p][1]][1])
                p += 1
            if m.id in self.dropped:
                pass
            elif id(m) in untouched and m.id in self.edited:
                out.append(self.edited[str(m.id)])
            else:
                out.append(m)
            while i >= 0 and p < len(rest) and rest[p][0] == i:
                out.append(self.added[rest[p][1]][1])
                p += 1
        out += [self.added[k][1] for _, k in rest[p:]]
        return out


def thread_of(request: ModelRequest) -> tuple[list[BaseMessage], Overlay | None]:
    """The call's thread: the state's messages, and the :class:`Overlay` of what a
    middleware before offpath changed in the call's copy of them (None: the copy is the
    thread, or the state holds no message list)."""
    sent: list[BaseMessage] = list(request.messages)
    state = request.state.get("messages") if isinstance(request.state, Mapping) else None
    if not isinstance(state, list) or (
        len(state) == len(sent) and all(a is b for a, b in zip(state, sent, strict=True))
    ):
        return sent, None
    by_id = {m.id: m for m in state if m.id is not None}
    edited: dict[str, BaseMessage] = {}
    added: list[tuple[str | None, BaseMessage]] = []
    seen: set[str] = set()
    anchor: str | None = None
    for m in sent:
        own = by_id.get(m.id) if m.id is not None and m.id not in seen else None
        if own is None:
            added.append((anchor, m))
            continue
        seen.add(str(m.id))
        anchor = str(m.id)
        if m is not own and m != own:
            edited[str(m.id)] = m
    dropped = frozenset(str(i) for i in by_id if i not in seen)
    if not edited and not added and not dropped:
        return list(state), None
    return list(state), Overlay(edited, dropped, tuple(added))
