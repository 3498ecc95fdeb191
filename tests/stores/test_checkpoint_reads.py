"""The worker, the reconciler and the API read a thread straight from its checkpoint
(``read_thread``, no graph). deepagents' ``create_deep_agent`` keeps its messages in a
LangGraph ``DeltaChannel``, which stores only a snapshot every few updates and nothing in
between: the read must give the thread the agent's own graph gives (``get_state``), after
appends, replacements in place, removals (one of an id no longer there among them) and a
``REMOVE_ALL``, before and after a snapshot. A real deep agent on SqliteSaver and
PostgresSaver (``test_checkpoint_messages.py`` has a hand-made graph on each channel)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agent_replay import TranscriptModel
from deepagents import create_deep_agent
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from stack import create_pg_database, drop_pg_database

from offpath.config import load_settings
from offpath.stores.checkpoints import open_checkpoints_url, read_thread


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path) -> Iterator[str]:
    if request.param == "postgres":
        url = create_pg_database()
        yield url
        drop_pg_database(url)
    else:
        yield f"sqlite:///{tmp_path / 'deep.db'}"


def as_read(messages) -> list[tuple]:
    return [(m.type, m.id, m.content) for m in messages]


def test_a_deep_agents_thread_reads_as_its_graph_has_it(store):
    replies = [AIMessage(id=f"r{i}", content=f"answer {i}") for i in range(3)]
    with open_checkpoints_url(store, load_settings()) as checkpoints:
        saver = checkpoints.saver
        agent = create_deep_agent(model=TranscriptModel(replies=replies), checkpointer=saver)
        config = {"configurable": {"thread_id": "deep"}}

        def same() -> None:
            graph = agent.get_state(config).values["messages"]
            assert as_read(read_thread(saver, "deep").messages) == as_read(graph)

        agent.invoke({"messages": [HumanMessage(id="h0", content="first")]}, config)
        agent.invoke({"messages": [HumanMessage(id="h1", content="second")]}, config)
        assert len(read_thread(saver, "deep").messages) == 4
        same()
        # a compaction's update, as the middleware returns it: the summary in the first
        # removed message's place, the rest removed
        summary = HumanMessage(id="h0", content="summary of the first turn")
        agent.update_state(config, {"messages": [summary, RemoveMessage(id="r0")]})
        same()
        # a removal of an id no longer there: deepagents' reducer skips it (add_messages
        # would raise ValueError)
        agent.update_state(config, {"messages": [RemoveMessage(id="gone-already")]})
        same()
        agent.update_state(
            config,
            {
                "messages": [
                    RemoveMessage(id=REMOVE_ALL_MESSAGES),
                    HumanMessage(id="n", content="new"),
                ]
            },
        )
        same()
        for k in range(60):  # past the channel's snapshot (every 50 updates)
            agent.update_state(config, {"messages": [HumanMessage(id=f"m{k}", content=str(k))]})
            if k in (48, 49, 50, 59):
                same()
        agent.invoke({"messages": [HumanMessage(id="h2", content="third")]}, config)
        same()
        assert as_read(read_thread(saver, "deep").messages)[-2:] == [
            ("human", "h2", "third"),
            ("ai", "r2", "answer 2"),
        ]
