"""A failed chat run taken back (``offpath/coordination/undo.py``), in process on the real
stores (SQLite checkpointer, Redis lock store): the thread reads as it did before the run,
including what the failed step's finished nodes wrote beside the checkpoint."""

from __future__ import annotations

import time
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from stack import small_runtime

from offpath.coordination.undo import finish_undo, run_span, undo_run
from offpath.stores.checkpoints import thread_config


class _State(TypedDict):
    messages: Annotated[list, add_messages]


def _failing_run(saver: Any, session_id: str, content: str) -> Any:
    """A run on ``session_id`` whose step has two nodes: one answers, the other raises. The
    request is in the run's first checkpoint; the answer is a pending write beside it.
    Returns the run's graph (its state shows the pending write)."""

    def answer(_: _State) -> dict[str, Any]:
        return {"messages": [AIMessage(f"answer to {content}", id=f"ai-{content}")]}

    def fail(_: _State) -> dict[str, Any]:
        raise RuntimeError("a tool raised")

    graph = StateGraph(_State)
    graph.add_node("answer", answer)
    graph.add_node("fail", fail)
    graph.add_edge(START, "answer")
    graph.add_edge(START, "fail")
    app = graph.compile(checkpointer=saver)
    try:
        app.invoke(
            {"messages": [HumanMessage(content, id=f"h-{content}")]}, thread_config(session_id)
        )
    except RuntimeError:
        pass
    return app


def _ids(graph: Any, session_id: str) -> list[str]:
    return [m.id for m in graph.get_state(thread_config(session_id)).values["messages"]]


def test_a_failed_run_is_taken_back_with_the_writes_of_its_failed_step(tmp_path):
    """The state after the failed run shows its request and the answer a finished node wrote
    (LangGraph's pending writes); removing that answer by id fails (an update never applies
    pending writes), so the take-back removes what the checkpoint holds and the new
    checkpoint leaves the pending writes behind: the thread is as before."""
    with small_runtime("sqlite", tmp_path, "test-undo") as rt:
        session = "inc-undo"
        rt.patch(
            session, {"messages": [HumanMessage("first", id="h-1"), AIMessage("ok", id="a-1")]}
        )
        before = set(_ids(rt.graph, session))
        run = _failing_run(rt.checkpoints.saver, session, "second")
        assert _ids(run, session) == ["h-1", "a-1", "h-second", "ai-second"]
        with rt.locks.turn(session, run=True):
            undo_run(rt, session, before, "h-second")
        for graph in (run, rt.graph):
            assert _ids(graph, session) == ["h-1", "a-1"]
        with rt.locks.turn(session):
            finish_undo(rt, session)  # nothing was kept for later: nothing changes
        assert _ids(run, session) == ["h-1", "a-1"]


def test_the_span_taken_back_is_the_runs_own_and_never_a_later_turns():
    """The failed run's request, its answer and tool round are taken back; a turn posted
    after it (while the lock store that keeps the take-back did not answer) stays, and so
    does a summary. Where a compaction folded the request in, the span starts at the first
    message the thread did not hold before."""
    before = {"h-1", "a-1"}
    run = [
        HumanMessage("second", id="h-2"),
        AIMessage("", id="a-2", tool_calls=[{"name": "logs", "args": {}, "id": "c-1"}]),
        ToolMessage("ok", tool_call_id="c-1", id="t-2"),
    ]
    later = [HumanMessage("third", id="h-3"), AIMessage("done", id="a-3")]
    thread = [HumanMessage("first", id="h-1"), AIMessage("ok", id="a-1"), *run, *later]
    assert run_span(thread, before, "h-2") == ["h-2", "a-2", "t-2"]
    summary = HumanMessage("summary", id="sum", additional_kwargs={"lc_source": "summarization"})
    folded = [summary, *run[1:], *later]
    assert run_span(folded, before, "h-2") == ["a-2", "t-2"]
    assert run_span(thread, {m.id for m in thread}, "h-9") == []  # nothing added


def test_a_turn_meeting_the_take_backs_retry_waits_for_it_and_lands_alone(tmp_path):
    """The take-back kept for later (its store did not answer) is retried on a thread of its
    own; a turn arriving while that retry writes waits for it (``LOCK_WAIT_S``), as a turn
    meeting a patch does, instead of answering 409, and lands on the thread as it was."""
    import json
    import threading

    from offpath.coordination import undo

    with small_runtime("sqlite", tmp_path, "test-undo-wait") as rt:
        session = "inc-undo-wait"
        rt.patch(
            session, {"messages": [HumanMessage("first", id="h-1"), AIMessage("ok", id="a-1")]}
        )
        before = set(_ids(rt.graph, session))
        _failing_run(rt.checkpoints.saver, session, "second")
        kept = json.dumps({"before": sorted(before), "request": "h-second"})
        rt.leases.store.swap(undo._undo_key(rt, session), None, kept, 60)
        writing, patch = threading.Event(), rt.patch

        def slow_patch(*args: Any, **kwargs: Any) -> Any:
            writing.set()
            time.sleep(1.0)  # the take-back's write, slow: the turn below arrives meanwhile
            return patch(*args, **kwargs)

        rt.patch = slow_patch  # type: ignore[method-assign]
        retry = threading.Thread(target=undo._retry_undo, args=(rt, session), daemon=True)
        retry.start()
        assert writing.wait(timeout=15)
        rt.patch = patch  # type: ignore[method-assign]
        with rt.locks.turn(session, run=True):  # waits for the retry; ThreadBusy would be a 409
            finish_undo(rt, session)
            assert _ids(rt.graph, session) == ["h-1", "a-1"]
        retry.join(timeout=15)
        assert rt.leases.store.get(undo._undo_key(rt, session)) is None
