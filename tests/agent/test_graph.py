"""A patch through the API's own graph, or through the worker's thread graph (the same state
and nodes, nothing to run), keeps the thread's other state keys (DESIGN.md invariant 1); a
narrower graph would drop them. Real SqliteSaver and PostgresSaver."""

from __future__ import annotations

from typing import Annotated, TypedDict

import pytest
from langchain_core.messages import AnyMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from shared import CASES, load, messages_of
from stack import create_pg_database, drop_pg_database

from offpath.agent.graph import build_graph, end_node, thread_graph
from offpath.agent.middleware.hooks import OffPathCompaction
from offpath.compaction.pipeline import compact
from offpath.compaction.summarizers.offline import OfflineSummarizer
from offpath.config import load_settings
from offpath.stores.checkpoints import open_checkpoints, thread_config


class MessagesOnly(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def narrow_graph(saver):
    g = StateGraph(MessagesOnly)
    g.add_node("agent", lambda s: {})
    g.add_edge(START, "agent")
    g.add_edge("agent", END)
    return g.compile(checkpointer=saver)


@pytest.fixture(params=["sqlite", "postgres"])
def checkpoints(request, tmp_path):
    if request.param == "postgres":
        url = create_pg_database()
        cp = open_checkpoints(load_settings(database_url=url, data_dir=str(tmp_path)))
        yield cp
        cp.close()
        drop_pg_database(url)
    else:
        cp = open_checkpoints(load_settings(data_dir=str(tmp_path)))
        yield cp
        cp.close()


def _patch(checkpoints, patcher_of, session):
    doc = load(next(p for p in CASES if p.stem == "summary-first"))
    settings = load_settings(summarization_threshold_chars=30_000, summarization_keep_chars=10_000)
    graph = build_graph(checkpoints.saver, OffPathCompaction(settings, patch=True))
    config = thread_config(session)
    node = end_node(graph)
    graph.update_state(config, {"messages": messages_of(doc), "context": CONTEXT}, as_node=node)
    outcome = compact(graph.get_state(config).values["messages"], settings, OfflineSummarizer())
    patcher, last = patcher_of(graph)
    patcher.update_state(config, {"messages": outcome.patch}, as_node=last)
    values = graph.get_state(config).values
    assert graph.get_state(config).next == ()  # the thread still reads as finished
    assert values["messages"][1].id == outcome.summary.id
    return values


CONTEXT = {"incident_id": "INC-1", "notes": ["a", {"b": 2}]}


def test_patch_through_the_shared_graph_keeps_other_state_keys(checkpoints):
    values = _patch(checkpoints, lambda graph: (graph, end_node(graph)), "shared")
    assert values["context"] == CONTEXT


class _Holder:
    """What :func:`thread_graph` reads off a runtime: its checkpointer."""

    def __init__(self, checkpoints):
        self.checkpoints = checkpoints


def test_patch_through_the_worker_thread_graph_keeps_other_state_keys(checkpoints):
    values = _patch(checkpoints, lambda graph: thread_graph(_Holder(checkpoints)), "worker")
    assert values["context"] == CONTEXT


def test_patch_through_a_narrower_graph_drops_them_on_sqlite(tmp_path):
    """Why the worker uses the shared graph: with SqliteSaver a messages-only graph
    writes a checkpoint without the keys it does not know."""
    with open_checkpoints(load_settings(data_dir=str(tmp_path))) as cp:
        values = _patch(cp, lambda graph: (narrow_graph(cp.saver), "agent"), "narrow")
    assert "context" not in values


def test_a_patch_from_the_checkpoint_read_writes_once_and_keeps_other_keys(checkpoints):
    """A job reads the thread once and patches from that read (issue 13): the write matches
    one that reads again, every other key survives, and a write in between is seen by one
    look-up of the latest checkpoint id."""
    from offpath.stores.checkpoints import Preloaded, read_thread

    doc = load(next(p for p in CASES if p.stem == "summary-first"))
    settings = load_settings(summarization_threshold_chars=30_000, summarization_keep_chars=10_000)
    graph = build_graph(checkpoints.saver, OffPathCompaction(settings, patch=True))
    node, config = end_node(graph), thread_config("once")
    graph.update_state(config, {"messages": messages_of(doc), "context": CONTEXT}, as_node=node)
    thread = read_thread(checkpoints.saver, "once")
    assert not checkpoints.changed_since("once", thread.checkpoint_id)
    assert checkpoints.changed_since("once", None)
    outcome = compact(thread.messages, settings, OfflineSummarizer())
    reads = []
    saver = Preloaded(checkpoints.saver, thread.base)
    real = saver.saver.get_tuple
    saver.saver.get_tuple = lambda c: reads.append(c) or real(c)  # type: ignore[method-assign]
    lent = {"configurable": {**config["configurable"], "__pregel_checkpointer": saver}}
    graph.update_state(lent, {"messages": outcome.patch}, as_node=node)
    del saver.saver.get_tuple
    assert reads == []  # no second read of the thread
    assert checkpoints.changed_since("once", thread.checkpoint_id)
    values = graph.get_state(config).values
    assert values["context"] == CONTEXT
    assert [m.id for m in values["messages"]] == [
        m.id for m in add_messages(thread.messages, outcome.patch)
    ]
    assert graph.get_state(config).next == ()


def test_pruning_never_deletes_a_checkpoint_another_process_wrote_meanwhile(tmp_path):
    """Issue 18, item 7: the API prunes a thread's old checkpoints after each turn, outside the
    thread's lock, while a worker may be writing a compaction patch to the same SQLite file.
    Pruning read the latest checkpoint id, then deleted "all but it": a patch committed
    between the two was deleted, and the thread read as before the patch (the job recorded
    applied, the thread holding its originals again). Here a second connection (the worker)
    holds SQLite's write lock with a newer checkpoint written; the prune's DELETE is let run
    only once that write commits (sqlite3's trace callback tells when it is about to)."""
    import sqlite3
    import threading

    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.base.id import uuid6

    settings = load_settings(data_dir=str(tmp_path))
    session = "prune-race"
    with open_checkpoints(settings) as cp:
        graph = narrow_graph(cp.saver)
        config = {"configurable": {"thread_id": session}}
        for k in range(4):
            graph.update_state(config, {"messages": [HumanMessage(f"turn {k}", id=f"h{k}")]})
        before = cp.saver.get_tuple(config).checkpoint["id"]

        # the "worker": another connection to the same file, writing a newer checkpoint and
        # holding the write lock until the prune is about to delete
        worker = sqlite3.connect(tmp_path / "checkpoints.db", timeout=30, isolation_level=None)
        worker.execute("BEGIN IMMEDIATE")
        newest = str(uuid6(clock_seq=99))  # a later id, as a worker's patch would write
        assert newest > before
        worker.execute(
            "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, "
            "parent_checkpoint_id, type, checkpoint, metadata) SELECT thread_id, checkpoint_ns, "
            "?, checkpoint_id, type, checkpoint, metadata FROM checkpoints "
            "WHERE thread_id = ? AND checkpoint_id = ?",
            (newest, session, before),
        )
        deleting = threading.Event()
        cp._closer.set_trace_callback(lambda sql: sql.startswith("DELETE") and deleting.set())
        pruner = threading.Thread(target=cp.prune, args=(session, 1))
        pruner.start()
        assert deleting.wait(30), "the prune never reached its DELETE"
        worker.execute("COMMIT")  # the patch lands while the prune is deleting
        pruner.join(30)
        cp._closer.set_trace_callback(None)
        worker.close()
        ids = [
            row[0]
            for row in cp._closer.execute(
                "SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? ORDER BY checkpoint_id",
                (session,),
            )
        ]
    assert newest in ids, f"the checkpoint written during the prune was deleted: {ids}"
    assert ids[-1] == newest


@pytest.mark.parametrize(
    ("given", "error", "named"),
    [
        ({"checkpointer_url": "mysql://root@db/x"}, "SettingsError", "checkpointer_url"),
        ({"checkpointer_url": 123}, "SettingsError", "checkpointer_url"),
        ({"tenant": "bad tenant!"}, "SettingsError", "tenant"),
        ({"tenant": "a\x00b"}, "SettingsError", "tenant"),
        ({"tenant": "ops\n"}, "SettingsError", "tenant"),
        ({"on_compaction": 5}, "TypeError", "on_compaction"),
    ],
)
def test_the_middleware_refuses_a_bad_argument_as_the_agent_is_built(tmp_path, given, error, named):
    # each was taken, then read at the first run as an outage of the database, a job failed
    # as an internal error, threads no key could see, or a TypeError at every update
    settings = load_settings(data_dir=str(tmp_path), summarization_enabled=False)
    with pytest.raises(Exception) as raised:
        OffPathCompaction(settings, **given)
    assert type(raised.value).__name__ == error and named in str(raised.value)
    fine = {"checkpointer_url": f"sqlite:///{tmp_path}/c.db", "tenant": "team.sre-1"}
    assert OffPathCompaction(settings, on_compaction=print, **fine).tenant == "team.sre-1"
