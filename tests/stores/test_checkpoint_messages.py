"""The worker reads a thread's messages from its checkpoint however the graph keeps them:
a plain ``add_messages`` channel, or a ``DeltaChannel`` (deepagents' ``create_deep_agent`` keeps
its messages in one: its checkpoints store nothing, or a snapshot every 50 updates), rebuilt
from its history as LangGraph does."""

from __future__ import annotations

import sqlite3
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

from offpath.stores.checkpoints import read_thread


def _fold(state: list, writes: list) -> list:
    for write in writes:
        state = add_messages(state, write)
    return state


class Plain(TypedDict):
    messages: Annotated[list, add_messages]


class Delta(TypedDict):
    messages: Annotated[list, DeltaChannel(_fold, list, snapshot_frequency=3)]


@pytest.mark.parametrize("schema", [Plain, Delta], ids=["add_messages", "delta"])
def test_the_thread_read_from_a_checkpoint_is_the_graphs_own_state(tmp_path, schema):
    conn = sqlite3.connect(tmp_path / "cp.db", check_same_thread=False)
    saver = SqliteSaver(conn)

    def answer(state: Any) -> dict[str, Any]:
        n = len(state["messages"])
        update: list = [AIMessage(id=f"a{n}", content=f"answer to {n}")]
        if n > 6:  # a compaction-like update: the oldest message goes
            update.insert(0, RemoveMessage(id=state["messages"][0].id))
        return {"messages": update}

    g = StateGraph(schema)
    g.add_node("answer", answer)
    g.add_edge(START, "answer")
    graph = g.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "t"}}
    for i in range(6):  # past the delta channel's snapshot, and writes after it
        graph.invoke({"messages": [HumanMessage(id=f"h{i}", content=f"question {i}")]}, config)
        expected = graph.get_state(config).values["messages"]
        thread = read_thread(saver, "t")
        assert [m.id for m in thread.messages] == [m.id for m in expected]
        assert thread.messages == expected
    conn.close()
