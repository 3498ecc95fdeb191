"""The chat agent's LangGraph graph, compiled once per process and shared by the API
(chat turns, imported turns) and the worker (the compaction patch).

The worker patches a thread through this same graph, so every key of the
thread's state survives (DESIGN.md invariant 1: a graph with a narrower state
schema would write a checkpoint without the keys it does not know).

State: ``messages`` (``add_messages`` reducer) and ``context``, a dict of the
thread's other keys (set by ``POST /sessions/{id}/turns`` with ``"state"``).
Every write goes in "as" the one node, ``agent``, so a patch never changes what
the graph would run next.
"""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AnyMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.graph.state import CompiledStateGraph

from offpath.compaction.pairing import without_orphans

AGENT_NODE = "agent"


class AgentState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    context: dict[str, Any]


class NoChatModel(RuntimeError):
    """A chat turn was asked for but no LLM is configured."""


def build_graph(
    checkpointer: BaseCheckpointSaver, model: BaseChatModel | None
) -> CompiledStateGraph:
    """START -> agent -> END, the agent answering with ``model`` (None: no chat turns)."""

    def agent(state: AgentState) -> dict[str, Any]:
        if model is None:
            raise NoChatModel("no LLM configured")
        # an orphan tool result (imported from elsewhere) never reaches the model
        return {"messages": [model.invoke(without_orphans(state["messages"]))]}

    graph = StateGraph(AgentState)
    graph.add_node(AGENT_NODE, agent)
    graph.add_edge(START, AGENT_NODE)
    graph.add_edge(AGENT_NODE, END)
    return graph.compile(checkpointer=checkpointer)


def thread_config(session_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": session_id}}
