"""Where an agent run stands among the graphs around it (DESIGN.md invariant 18), found on real
LangGraph runs: a root graph, a node sharing its parent's messages, a subagent run from inside
a tool (the parent running its tools), a ``Send`` fan-out with messages of its own, and a node
given part of its caller's messages (refused)."""

from __future__ import annotations

import sqlite3
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Send

from offpath.agent.middleware.state import Place, Places, Role, role_of


class S(TypedDict):
    messages: Annotated[list, add_messages]


def probe_graph(seen: list[Place], places: Places):
    def probe(state: S) -> dict[str, Any]:
        place = places.of_run(state["messages"])
        assert place is not None
        seen.append(place)
        return {"messages": [AIMessage(content="looked")]}

    g = StateGraph(S)
    g.add_node("probe", probe)
    g.add_edge(START, "probe")
    return g.compile()


@pytest.fixture
def saver(tmp_path):
    conn = sqlite3.connect(tmp_path / "cp.db", check_same_thread=False)
    yield SqliteSaver(conn)
    conn.close()


def run(graph, saver, messages, thread="t"):
    graph.invoke({"messages": messages}, {"configurable": {"thread_id": thread}})


def test_a_root_graph_is_its_threads_session(saver):
    seen: list[Place] = []
    root = StateGraph(S)
    places = Places()
    root.add_node("probe", lambda state: seen.append(places.of_run(state["messages"])) or {})
    root.add_edge(START, "probe")
    run(root.compile(checkpointer=saver), saver, [HumanMessage("hi")])
    (place,) = seen
    assert place.role is Role.ROOT and place.session_id == "t" and place.listed


def test_a_node_sharing_its_parents_messages_keeps_the_thread_as_its_session(saver):
    seen: list[Place] = []
    places = Places()
    parent = StateGraph(S)
    parent.add_node("agent", probe_graph(seen, places))
    parent.add_edge(START, "agent")
    graph = parent.compile(checkpointer=saver)
    for i in range(2):  # a later run: the parent's thread holds the first one's messages
        run(graph, saver, [HumanMessage(f"question {i}")])
        place = seen[-1]
        assert place.role is Role.SHARED and place.session_id == "t" and place.hands_up
        assert place.ns.startswith("agent:")


def test_a_subagent_run_from_a_tool_is_a_callee_with_a_session_of_its_own(saver):
    """deepagents' ``task`` shape: the parent is running its tools (its last model message has
    the call open) and the subagent gets a message list of its own."""
    seen: list[Place] = []
    places = Places()
    sub = probe_graph(seen, places)

    def model(state: S) -> dict[str, Any]:
        if isinstance(state["messages"][-1], ToolMessage):
            return {"messages": [AIMessage(id="done", content="done")]}
        call = {"id": "call-1", "name": "task", "args": {"description": "look"}}
        return {"messages": [AIMessage(id="ask", content="", tool_calls=[call])]}

    def tools(state: S) -> dict[str, Any]:
        sub.invoke({"messages": [HumanMessage(id="sub-req", content="look")]})
        return {"messages": [ToolMessage(id="res", content="seen", tool_call_id="call-1")]}

    g = StateGraph(S)
    g.add_node("model", model)
    g.add_node("tools", tools)
    g.add_edge(START, "model")
    g.add_conditional_edges(
        "model", lambda s: "tools" if s["messages"][-1].tool_calls else "__end__"
    )
    g.add_edge("tools", "model")
    run(g.compile(checkpointer=saver), saver, [HumanMessage(id="req", content="investigate")])
    (place,) = seen
    assert place.role is Role.CALLEE and not place.hands_up and not place.listed
    assert not place.hands_whole  # its output goes to the tool, not to the parent's reducer
    assert place.session_id == f"t|{place.ns}" and place.ns.startswith("tools:")


def test_a_send_fan_out_with_messages_of_its_own_is_fanned(saver):
    """Its output is merged into the parent's messages: it hands them whole at its end."""
    seen: list[Place] = []
    places = Places()
    g = StateGraph(S)
    g.add_node("worker", probe_graph(seen, places))
    g.add_conditional_edges(
        START,
        lambda s: [Send("worker", {"messages": [HumanMessage(f"part {k}")]}) for k in range(2)],
    )
    run(g.compile(checkpointer=saver), saver, [HumanMessage("split this")])
    assert len(seen) == 2 and all(p.role is Role.FANNED for p in seen)
    assert all(p.hands_whole and not p.hands_up and not p.listed for p in seen)
    assert len({p.session_id for p in seen}) == 2  # each its own session
    assert all(p.session_id == f"t|{p.ns}" for p in seen)


def test_parallel_sends_given_the_parents_whole_thread_are_fanned(saver):
    """Several runs of one node in a superstep, each given the parent's whole thread (and an
    ask of its own): a compaction handed up whole (``REMOVE_ALL_MESSAGES``) by one would wipe
    what its siblings write to the parent in the same step. Each is fanned: it compacts under
    a session of its own and hands its messages whole."""
    seen: list[Place] = []
    places = Places()
    g = StateGraph(S)
    g.add_node("worker", probe_graph(seen, places))
    g.add_conditional_edges(
        START,
        lambda s: [
            Send("worker", {"messages": [*s["messages"], HumanMessage(f"part {k}")]})
            for k in range(2)
        ],
    )
    run(g.compile(checkpointer=saver), saver, [HumanMessage("split this")])
    assert len(seen) == 2 and all(p.role is Role.FANNED and not p.hands_up for p in seen)
    assert len({p.session_id for p in seen}) == 2


def test_parallel_nodes_sharing_the_parents_messages_are_fanned(saver):
    """Two agent nodes run from ``START`` in one superstep, both given the parent's thread:
    one's thread handed up whole would wipe the other's messages of that step."""
    seen: list[Place] = []
    places = Places()
    g = StateGraph(S)
    g.add_node("logs", probe_graph(seen, places))
    g.add_node("metrics", probe_graph(seen, places))
    g.add_edge(START, "logs")
    g.add_edge(START, "metrics")
    graph = g.compile(checkpointer=saver)
    for i in range(2):  # the second run: the step's triggers read against what was seen
        run(graph, saver, [HumanMessage(f"look {i}")])
    assert len(seen) == 4 and all(p.role is Role.FANNED for p in seen)


def test_one_send_given_the_parents_whole_thread_shares_it(saver):
    seen: list[Place] = []
    places = Places()
    g = StateGraph(S)
    g.add_node("worker", probe_graph(seen, places))
    g.add_conditional_edges(START, lambda s: [Send("worker", {"messages": s["messages"]})])
    run(g.compile(checkpointer=saver), saver, [HumanMessage("all of it")])
    (place,) = seen
    assert place.role is Role.SHARED and place.session_id == "t"


def test_a_node_given_part_of_its_callers_messages_is_refused(saver):
    seen: list[Place] = []
    places = Places()
    g = StateGraph(S)
    g.add_node("worker", probe_graph(seen, places))
    g.add_conditional_edges(START, lambda s: [Send("worker", {"messages": s["messages"][-1:]})])
    run(g.compile(checkpointer=saver), saver, [HumanMessage("a"), HumanMessage("b")])
    (place,) = seen
    assert place.role is Role.REFUSED and not place.compacts


def test_role_of_reads_the_parent_and_the_runs_own_messages():
    h1, h2 = HumanMessage(id="h1", content="a"), HumanMessage(id="h2", content="b")
    call = AIMessage(id="a1", content="", tool_calls=[{"id": "c", "name": "task", "args": {}}])
    assert role_of(None, [h1]) is Role.CALLEE  # the parent's checkpoint could not be read
    assert role_of([h1], [h1]) is Role.SHARED
    assert role_of([h1], [h1, h2], siblings=2) is Role.FANNED  # one of several Sends
    assert role_of([h1, call], [h1, call, h2]) is Role.CALLEE  # run from the open call's tool
    assert role_of([h1, h2], [h2]) is Role.REFUSED
    assert role_of([h1], [h2]) is Role.FANNED  # a list of its own, no call open
