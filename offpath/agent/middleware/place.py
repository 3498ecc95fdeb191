"""Where an agent run stands in the graphs around it, and so whose messages it may compact
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
  running it), or a node given a message list of its own (``Send`` fan-out). It compacts its
  own messages under a session of its own (``<thread_id>|<namespace>``), never writes its
  caller's state, and is never listed as a session;
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
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config
from langgraph.constants import CONFIG_KEY_CHECKPOINTER

from offpath.compaction.pairing import pair_messages

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
    CALLEE = "callee"  # messages of its own
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
        if self.role is Role.CALLEE:
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


def graph_ns(config: RunnableConfig) -> str:
    """The checkpoint namespace of the graph a node runs in: ``""`` for a root graph, a
    subgraph's (``agent:<task id>``, ``tools:<task id>``) otherwise. A node's own config names
    its task last (``...|model:<task id>``): that part is not a graph's."""
    ns = str(config.get("configurable", {}).get("checkpoint_ns") or "")
    return ns.rsplit("|", 1)[0] if "|" in ns else ""


def role_of(parent: Sequence[BaseMessage] | None, own: Sequence[BaseMessage]) -> Role:
    """The :class:`Role` of a run inside another graph's run whose parent holds ``parent``
    (None: not readable) and whose own messages are ``own`` at its first look. Pure."""
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
        return Role.SHARED
    if set(theirs) & set(mine):
        return Role.REFUSED
    return Role.CALLEE


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
            role = role_of(_parent_messages(config, str(thread), ns), messages)
        place = self._known[key] = Place(str(thread), ns, role)
        while len(self._known) > PLACES_KEPT:
            self._known.popitem(last=False)
        return place

    def session_of_run(self) -> str | None:
        """The session of the run this call belongs to, as :meth:`of_run` found it (the
        ``recall`` tool's: a callee's archive is its own)."""
        place = self.of_run()
        return place.session_id if place is not None else None


def _parent_messages(config: RunnableConfig, thread: str, ns: str) -> list[BaseMessage] | None:
    """The messages of the graph that runs the agent's graph, as its checkpoint of the current
    step holds them (the input the agent got, if it is a node sharing them); None when the
    checkpoint cannot be read within :data:`PARENT_READ_WAIT_S`."""
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
            messages = tup.checkpoint.get("channel_values", {}).get("messages")
            return list(messages) if isinstance(messages, list) else None
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)
