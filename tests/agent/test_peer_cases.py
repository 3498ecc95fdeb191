"""Cases other summarization middlewares were caught on (LangChain's ``SummarizationMiddleware``,
deepagents', LangGraph's message reducer, their users' issues), run against ``OffPathCompaction``
in a team's own agent: each a ``create_agent`` with scripted replies on a real SQLite
checkpointer, its compaction jobs run by the worker's own task (``compact_session``, applied by
Celery in this process, the offline summarizer) on the usage tables of ``LOCK_BACKEND=database``.

Every model call is checked as it is made: each tool call the model sees is answered by a
result after it and each result answers a call before it, the call is under the hard limit,
and at the end every message the run produced is in the thread or archived."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import pytest
import sqlalchemy as sa
from conformance.harness import Script, ScriptedModel, filler, is_summary
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, RemoveMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, StructuredTool
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.types import Command
from shared import pairing_problems, turn_problems

from offpath import OffPathCompaction
from offpath.agent.graph import open_thread_writer
from offpath.compaction.accounting import message_chars
from offpath.compaction.settings import Settings
from offpath.compaction.summarizers.offline import OfflineSummarizer
from offpath.config import load_settings
from offpath.coordination.runtime import Client
from offpath.stores import archive
from offpath.stores.checkpoints import open_checkpoints_url

RESULT = 1_100  # chars of a typical tool result


class InProcessWorker:
    """The worker's ``compact_session`` task, applied by Celery in this process (on a thread
    of its own, as a worker would take it from the queue) with the worker's runtime on the
    test's settings and the offline summarizer."""

    def __init__(self, settings: Settings) -> None:
        import offpath.worker.tasks as tasks

        self.tasks = tasks
        self.runtime = open_thread_writer(settings, publish=self.publish)
        self.threads: list[threading.Thread] = []

    def publish(self, session_id: str, job_id: str, options: dict[str, Any] | None) -> None:
        task = self.tasks.compact_session
        run = threading.Thread(
            target=task.apply, kwargs={"args": (session_id, options), "task_id": job_id}
        )
        run.start()  # started before it is listed: drain() on another thread joins only started ones
        self.threads.append(run)

    def drain(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for t in list(self.threads):
            t.join(max(0.0, deadline - time.monotonic()))


@dataclass
class Agent:
    """A run's parts: the agent, its middleware, its model(s), the checkpointer's URL."""

    settings: Settings
    url: str
    saver: Any
    middleware: OffPathCompaction
    client: Client
    worker: InProcessWorker
    models: list[ScriptedModel] = field(default_factory=list)
    thread_id: str = field(default_factory=lambda: f"peer-{uuid.uuid4().hex[:8]}")

    @property
    def config(self) -> dict[str, Any]:
        return {"configurable": {"thread_id": self.thread_id}, "recursion_limit": 500}

    def model(self, replies: Sequence[AIMessage], delay_s: float = 0.0) -> ScriptedModel:
        """Scripted ``replies``; each answer waits until the thread's job has ended, so that
        compactions land at the same steps at every run."""
        mw, sid = self.middleware, self.thread_id

        def gate() -> None:
            session = mw.places.session_of_run() or sid
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and mw.busy(session):
                time.sleep(0.02)

        model = ScriptedModel(
            name=f"m{len(self.models)}",
            replies=list(replies),
            calls=[],
            produced=[],
            gate=gate,
            delay_s=delay_s,
        )
        self.models.append(model)
        return model

    def messages(self) -> list[BaseMessage]:
        snap = self.saver.get_tuple(self.config)
        return list(snap.checkpoint["channel_values"].get("messages", [])) if snap else []

    def archived_ids(self) -> set[str]:
        return {str(m.id) for m in self.archived()}

    def archived(self) -> list[BaseMessage]:
        from langchain_core.messages import messages_from_dict

        rows, _ = archive.read(self.client.engine, self.thread_id, limit=100_000)
        return messages_from_dict([r["message"] for r in rows])


@pytest.fixture
def agent_parts(tmp_path: Path, monkeypatch) -> Iterator[Agent]:
    settings = load_settings(
        data_dir=str(tmp_path),
        lock_backend="database",
        summarization_threshold_chars=6_000,
        summarization_keep_chars=2_000,
    )
    worker = InProcessWorker(settings)
    monkeypatch.setattr(worker.tasks, "_runtime", (worker.runtime, OfflineSummarizer()))
    client = Client.open(settings, publish=worker.publish)
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    with open_checkpoints_url(url, settings) as checkpoints:
        mw = OffPathCompaction(settings, checkpointer_url=url, client=client, recall=False)
        parts = Agent(settings, url, checkpoints.saver, mw, client, worker)
        try:
            yield parts
        finally:
            worker.drain()
    worker.runtime.close()
    client.close()


#: what the logs tools returned, by page: each is in the thread or archived, as returned
RETURNED: dict[str, str] = {}


def logs_tool(name: str = "fetch_logs") -> StructuredTool:
    def fetch(page: str, chars: int) -> str:
        RETURNED[page] = filler(page, chars)
        return RETURNED[page]

    return StructuredTool.from_function(fetch, name=name, description="Read a page of logs.")


# --- what every call and every run keeps -------------------------------------------------------


def check_calls(parts: Agent) -> None:
    """Every model call's input: paired, under the hard limit, at most one summary."""
    limit = parts.settings.hard_limit_chars
    for model in parts.models:
        for k, sent in enumerate(model.calls):
            where = f"{model.name} call {k}"
            assert not pairing_problems(sent), (where, sorted(pairing_problems(sent)))
            chars = sum(message_chars(m) for m in sent)
            assert chars <= limit, (where, chars, limit)
            assert sum(1 for m in sent if is_summary(m)) <= 1, where


def check_kept(parts: Agent, inputs: Sequence[BaseMessage] = ()) -> None:
    """Every reply the models produced and every input sent is in the thread or archived,
    and no request of a finished turn is kept without its answer (nor an answer without its
    request)."""
    now = {m.id for m in parts.messages()}
    archived = parts.archived_ids()
    produced = [m for model in parts.models for m in model.produced]
    lost = [m.id for m in [*inputs, *produced] if m.id not in now and m.id not in archived]
    assert not lost, lost
    assert not turn_problems(parts.messages()), sorted(turn_problems(parts.messages()))


def check_results_whole(parts: Agent, pages: Sequence[str]) -> None:
    """The text each of ``pages`` returned is whole in the thread or in the archive."""
    texts = {str(m.content) for m in [*parts.messages(), *parts.archived()] if m.type == "tool"}
    missing = [page for page in pages if RETURNED[page] not in texts]
    assert not missing, missing


def compactions(parts: Agent) -> int:
    return sum(1 for m in parts.messages() if is_summary(m))


def jobs_of(parts: Agent) -> list[tuple[str, str]]:
    from offpath.stores.db.tables import JOBS

    with parts.client.engine.connect() as conn:
        return [
            (r[0], r[1])
            for r in conn.execute(
                sa.select(JOBS.c.status, JOBS.c.reason).where(JOBS.c.session_id == parts.thread_id)
            )
        ]


def turns(script: Script, n: int, steps: Sequence[int | Sequence[int]], text: str = "Check"):
    for k in range(n):
        script.turn(f"{text} the checkout latency, part {k}", steps)


# --- the cases ---------------------------------------------------------------------------------


def test_a_plain_run_compacts_and_every_call_is_paired(agent_parts):
    """The baseline every other case departs from: three turns of five reads compact."""
    p = agent_parts
    script = Script(f"{p.thread_id}-s")
    turns(script, 3, [RESULT] * 5)
    agent = create_agent(
        p.model(script.replies), [logs_tool()], middleware=[p.middleware], checkpointer=p.saver
    )
    for request in script.requests:
        agent.invoke({"messages": [request]}, p.config)
    check_calls(p)
    check_kept(p, script.requests)
    assert compactions(p) == 1, jobs_of(p)


def call(mid: str, *calls: tuple[str, str, dict[str, Any]], content: Any = "") -> AIMessage:
    """An AI reply ``mid`` making ``calls`` (id, tool, args)."""
    return AIMessage(
        id=mid,
        content=content,
        tool_calls=[{"id": c, "name": n, "args": a, "type": "tool_call"} for c, n, a in calls],
    )


def page(k: int | str, chars: int = RESULT) -> dict[str, Any]:
    return {"page": f"p{k}", "chars": chars}


def run_turns(p: Agent, agent: Any, requests: Sequence[HumanMessage], ainvoke: bool = False):
    import asyncio

    for request in requests:
        if ainvoke:
            asyncio.run(agent.ainvoke({"messages": [request]}, p.config))
        else:
            agent.invoke({"messages": [request]}, p.config)


def reads(tag: str, n: int, call_id=lambda tag, k: f"{tag}-c{k}", chars: int = RESULT):
    """``n`` replies of one read each and a closing answer."""
    replies = [
        call(f"{tag}-a{k}", (call_id(tag, k), "fetch_logs", page(f"{tag}{k}", chars)))
        for k in range(n)
    ]
    return [*replies, AIMessage(id=f"{tag}-done", content=f"{tag}: nothing new.")]


def requests_of(p: Agent, n: int) -> list[HumanMessage]:
    return [HumanMessage(id=f"{p.thread_id}-h{k}", content=f"Check part {k}") for k in range(n)]


def run_checked(p: Agent, agent: Any, turns: int) -> list[HumanMessage]:
    """``turns`` requests run through ``agent``, every model call's request checked for
    pairing and the hard limit, and every request kept with its answer; the requests."""
    requests = requests_of(p, turns)
    run_turns(p, agent, requests)
    check_calls(p)
    check_kept(p, requests)
    return requests


def test_call_ids_reused_by_every_response_still_pair_after_each_compaction(agent_parts):
    """Ollama and some vLLM servers number calls per response: every reply's call is
    ``fetch_logs:0``. A cut that pairs by id alone keeps a result whose call it removed."""
    p = agent_parts
    replies = [m for t in range(3) for m in reads(f"t{t}", 5, lambda tag, k: "fetch_logs:0")]
    agent = create_agent(
        p.model(replies), [logs_tool()], middleware=[p.middleware], checkpointer=p.saver
    )
    run_checked(p, agent, 3)
    assert compactions(p) == 1 and not pairing_problems(p.messages())


def test_empty_call_ids_are_answered_and_nothing_is_dropped(agent_parts):
    """A provider that sends ``"id": ""`` for each call: the tool node answers each with
    ``tool_call_id=""``; no result may be dropped as an orphan, nor a call left open."""
    p = agent_parts
    replies = [m for t in range(3) for m in reads(f"t{t}", 5, lambda tag, k: "")]
    agent = create_agent(
        p.model(replies), [logs_tool()], middleware=[p.middleware], checkpointer=p.saver
    )
    run_checked(p, agent, 3)
    for model in p.models:  # every result the model was given is in what it was sent
        for sent in model.calls:
            results = [m for m in sent if m.type == "tool"]
            calls = [c for m in sent if m.type == "ai" for c in m.tool_calls]
            assert len(results) == len(calls)


def test_a_result_answering_an_empty_call_id_pairs_with_it():
    """The thread's running size and the planner's pairer treat ``""`` as an id."""
    from offpath.compaction.pairing import pair_messages
    from offpath.compaction.tracking import ThreadSize

    empty = [{"id": "", "name": "fetch_logs", "args": {}, "type": "tool_call"}]
    msgs = [
        HumanMessage(id="h", content="check"),
        AIMessage(id="a", content="", tool_calls=empty),
        ToolMessage(id="t", content="r", tool_call_id=""),
        ToolMessage(id="t2", content="again", tool_call_id=""),  # a second answer: an orphan
    ]
    size = ThreadSize().advance(msgs)
    assert size.orphans == ("t2",) and not size.open
    paired = pair_messages(msgs)
    assert paired.pairs == ((1, 2),) and paired.orphans == (3,)


def test_parallel_calls_split_by_every_cut_stay_whole(agent_parts):
    """Four calls per reply, each result 450 chars: every cut lands among batches."""
    p = agent_parts
    replies = []
    for t in range(3):
        for k in range(4):
            replies.append(
                call(
                    f"t{t}-a{k}",
                    *[(f"t{t}-c{k}-{j}", "fetch_logs", page(f"t{t}{k}{j}", 450)) for j in range(4)],
                )
            )
        replies.append(AIMessage(id=f"t{t}-done", content="done"))
    agent = create_agent(
        p.model(replies), [logs_tool()], middleware=[p.middleware], checkpointer=p.saver
    )
    run_checked(p, agent, 3)
    assert compactions(p) == 1


def content_blocks_tool(name: str = "fetch_logs") -> StructuredTool:
    """A tool that answers with content blocks (text parts), as MCP tools do."""

    def fetch(page: str, chars: int) -> list[dict[str, Any]]:
        half = filler(page, chars // 2)
        return [
            {"type": "text", "text": half},
            {"type": "text", "text": filler(page + "b", chars // 2)},
        ]

    return StructuredTool.from_function(fetch, name=name, description="Read a page of logs.")


@pytest.mark.parametrize("chars", [RESULT, 9_000])
def test_tool_results_as_content_blocks_are_sized_shortened_and_compacted(agent_parts, chars):
    """MCP-style results: a list of text parts. Over TOOL_RESULT_MAX_CHARS (9,000 here) they
    are shortened as they arrive; either way the calls stay bounded and paired."""
    p = agent_parts
    replies = [m for t in range(3) for m in reads(f"t{t}", 5, chars=chars)]
    agent = create_agent(
        p.model(replies), [content_blocks_tool()], middleware=[p.middleware], checkpointer=p.saver
    )
    run_checked(p, agent, 3)
    assert compactions(p) == 1


def image_tool(name: str = "screenshot") -> StructuredTool:
    """A tool that answers with a caption and a base64 PNG (about 40,000 chars)."""
    import base64

    def shot(page: str, chars: int) -> list[dict[str, Any]]:
        data = base64.b64encode(filler(page, 30_000).encode()).decode()
        return [
            {"type": "text", "text": filler(page, chars)},
            {"type": "image", "source_type": "base64", "mime_type": "image/png", "data": data},
        ]

    return StructuredTool.from_function(shot, name=name, description="Screenshot a dashboard.")


def test_tool_results_with_images_keep_their_pairs_and_the_bound(agent_parts):
    p = agent_parts
    replies = []
    for t in range(3):
        for k in range(5):
            replies.append(call(f"t{t}-a{k}", (f"t{t}-c{k}", "screenshot", page(f"{t}{k}"))))
        replies.append(AIMessage(id=f"t{t}-done", content="done"))
    agent = create_agent(
        p.model(replies), [image_tool()], middleware=[p.middleware], checkpointer=p.saver
    )
    run_checked(p, agent, 3)


def reasoning_reply(mid: str, cid: str, k: str) -> AIMessage:
    """An Anthropic-style reply: a thinking block, text, and the call as a ``tool_use`` part."""
    args = page(k)
    return AIMessage(
        id=mid,
        content=[
            {"type": "thinking", "thinking": filler(f"think{k}", 300), "signature": "sig" * 20},
            {"type": "text", "text": f"Reading page {k}."},
            {"type": "tool_use", "id": cid, "name": "fetch_logs", "input": args},
        ],
        tool_calls=[{"id": cid, "name": "fetch_logs", "args": args, "type": "tool_call"}],
    )


def test_replies_with_reasoning_and_tool_use_blocks_compact_and_pair(agent_parts):
    p = agent_parts
    replies = []
    for t in range(3):
        replies += [reasoning_reply(f"t{t}-a{k}", f"toolu_{t}{k}", f"{t}{k}") for k in range(5)]
        replies.append(AIMessage(id=f"t{t}-done", content=[{"type": "text", "text": "done"}]))
    agent = create_agent(
        p.model(replies), [logs_tool()], middleware=[p.middleware], checkpointer=p.saver
    )
    run_checked(p, agent, 3)
    for model in p.models:  # a tool_use part is sent only with its call
        for sent in model.calls:
            for m in sent:
                if m.type == "ai" and isinstance(m.content, list):
                    uses = {
                        b["id"]
                        for b in m.content
                        if isinstance(b, dict) and b.get("type") == "tool_use"
                    }
                    assert uses <= {c["id"] for c in m.tool_calls}, m.id
    assert compactions(p) == 1


def pages_of(replies: Sequence[AIMessage]) -> list[str]:
    return [c["args"]["page"] for m in replies for c in m.tool_calls if "page" in c["args"]]


def test_context_editing_outside_offpath_lets_compactions_apply_and_stores_no_cleared_copy(
    agent_parts,
):
    """LangChain's ``ContextEditingMiddleware`` clears old tool results in each call's copy
    only. Placed before offpath (its handler is offpath's), offpath is given the cleared
    copies: every prepared compaction went stale on them ("message changed since the
    summary was prepared") and none applied. offpath compacts the thread's own messages,
    and what it stores and archives are those, never the copies."""
    from langchain.agents.middleware import ClearToolUsesEdit, ContextEditingMiddleware

    p = agent_parts
    replies = [m for t in range(3) for m in reads(f"t{t}", 5)]
    editing = ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=800, keep=1)])
    agent = create_agent(
        p.model(replies), [logs_tool()], middleware=[editing, p.middleware], checkpointer=p.saver
    )
    run_checked(p, agent, 3)
    check_results_whole(p, pages_of(replies))
    assert compactions(p) == 1, jobs_of(p)


def test_a_reminder_without_an_id_added_outside_offpath_is_never_stored(agent_parts):
    """A middleware before offpath adds a message without an id to each call's copy (a
    to-do list or a date, as dynamic-context middlewares do). offpath must not write it to
    the thread (``add_messages`` would append it anew at every call) nor lose the rest."""
    from langchain.agents.middleware import AgentMiddleware

    class Reminder(AgentMiddleware):
        def wrap_model_call(self, request, handler):
            note = HumanMessage(content="Reminder: keep the on-call channel posted. " * 5)
            return handler(request.override(messages=[*request.messages, note]))

    p = agent_parts
    replies = [m for t in range(3) for m in reads(f"t{t}", 5)]
    agent = create_agent(
        p.model(replies),
        [logs_tool()],
        middleware=[Reminder(), p.middleware],
        checkpointer=p.saver,
    )
    run_checked(p, agent, 3)
    check_results_whole(p, pages_of(replies))
    stored = [m for m in p.messages() if str(m.content).startswith("Reminder:")]
    assert not stored, len(stored)
    assert compactions(p) == 1, jobs_of(p)


def test_a_tool_that_removes_all_messages_mid_run_leaves_a_paired_thread(agent_parts):
    """A tool that restarts the conversation (``Command`` with
    ``RemoveMessage(REMOVE_ALL_MESSAGES)`` and a fresh brief) while a compaction of the old
    messages is prepared: nothing of the old thread may come back, the call's result pairs."""

    def restart(reason: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
        """Start over with a short brief."""
        brief = HumanMessage(id="brief", content=f"Brief: {reason}")
        again = call("restart-call", (tool_call_id, "restart", {"reason": reason}))
        done = ToolMessage(id="restart-done", content="restarted", tool_call_id=tool_call_id)
        return Command(
            update={"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), brief, again, done]}
        )

    p = agent_parts
    replies = [*reads("t0", 6)[:-1], call("t0-rs", ("rs", "restart", {"reason": "fresh"}))]
    replies += reads("t1", 5)
    agent = create_agent(
        p.model(replies),
        [logs_tool(), StructuredTool.from_function(restart)],
        middleware=[p.middleware],
        checkpointer=p.saver,
    )
    run_turns(p, agent, requests_of(p, 1))
    check_calls(p)
    after = p.messages()
    assert not pairing_problems(after)
    assert not any(m.id.startswith("t0-") for m in after if not is_summary(m)), [
        m.id for m in after
    ]


def test_an_overlay_makes_the_copys_edits_again_on_a_compacted_thread():
    """The copy a middleware before offpath made (a result cleared, a reminder after a
    message, a system note at the head, a message left out), made again on the thread as a
    compaction left it: a reminder whose message was removed comes where it stood."""
    from offpath.agent.middleware.state import Overlay

    h, a, t, a2, t2 = (
        HumanMessage(id="h", content="check"),
        call("a", ("c", "fetch_logs", page(1))),
        ToolMessage(id="t", content="x" * 500, tool_call_id="c"),
        call("a2", ("c2", "fetch_logs", page(2))),
        ToolMessage(id="t2", content="y" * 500, tool_call_id="c2"),
    )
    thread = [h, a, t, a2, t2]
    cleared = t2.model_copy(update={"content": "[cleared]"})
    note, head = HumanMessage(content="reminder"), HumanMessage(content="date: today")
    overlay = Overlay({"t2": cleared}, frozenset({"h"}), ((None, head), ("t", note)))
    assert overlay.over(thread, thread) == [head, a, t, note, a2, cleared]
    summary = HumanMessage(id="sum", content="summary")
    short = t2.model_copy(update={"content": "y" * 100})
    assert overlay.over([summary, a2, short], thread) == [head, summary, note, a2, short]


def test_human_approval_of_a_parallel_batch_over_the_threshold_pairs_every_call(agent_parts):
    """LangChain's ``HumanInTheLoopMiddleware`` stops a batch of three parallel calls for
    review once the thread is over its threshold with a compaction prepared; one call is
    approved, one rejected, one edited. Every call of the batch is answered in what the
    model sees next, and nothing of the batch is lost."""
    from langchain.agents.middleware import HumanInTheLoopMiddleware

    p = agent_parts
    replies = reads("t0", 6)[:-1]
    batch = call(
        "t0-batch",
        ("b0", "restart_pod", {"pod": "a"}),
        ("b1", "restart_pod", {"pod": "b"}),
        ("b2", "restart_pod", {"pod": "c"}),
    )
    replies += [batch, *reads("t1", 3)]

    def restart_pod(pod: str) -> str:
        """Restart a pod."""
        return f"restarted {pod} " + filler(pod, 600)

    review = HumanInTheLoopMiddleware(interrupt_on={"restart_pod": True})
    agent = create_agent(
        p.model(replies),
        [logs_tool(), StructuredTool.from_function(restart_pod)],
        middleware=[p.middleware, review],
        checkpointer=p.saver,
    )
    first = requests_of(p, 1)
    agent.invoke({"messages": first}, p.config)
    state = agent.get_state(p.config)
    assert state.interrupts, "the batch waits for review"
    decisions = [
        {"type": "approve"},
        {"type": "reject", "message": "not pod b"},
        {"type": "edit", "edited_action": {"name": "restart_pod", "args": {"pod": "d"}}},
    ]
    agent.invoke(Command(resume={"decisions": decisions}), p.config)
    check_calls(p)
    check_kept(p, first)
    assert not pairing_problems(p.messages())


def test_a_tool_whose_command_adds_messages_besides_its_result_keeps_them(agent_parts):
    """A tool returns ``Command(update={"messages": [its result, a note]})``: the note (a
    human message the tool adds) is a message of the thread like any other."""
    p = agent_parts

    def escalate(team: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
        """Escalate to a team."""
        result = ToolMessage(content=f"paged {team}", tool_call_id=tool_call_id)
        note = HumanMessage(content=f"[system note] {team} was paged; " + filler(team, 800))
        return Command(update={"messages": [result, note]})

    replies = []
    for t in range(3):
        replies += reads(f"t{t}", 3)[:-1]
        replies.append(call(f"t{t}-e", (f"t{t}-esc", "escalate", {"team": f"team{t}"})))
        replies += reads(f"t{t}x", 1)
    agent = create_agent(
        p.model(replies),
        [logs_tool(), StructuredTool.from_function(escalate)],
        middleware=[p.middleware],
        checkpointer=p.saver,
    )
    run_checked(p, agent, 3)
    notes = [
        m
        for m in [*p.messages(), *p.archived()]
        if str(m.content).startswith("[system note]") and not is_summary(m)
    ]
    assert len({m.id for m in notes}) == 3


def test_a_call_left_unanswered_by_a_tool_that_raised_is_not_made_worse(agent_parts):
    """A tool raised (the run ended, its call never answered), then the user asks again:
    the thread holds an abandoned call. Compactions go on, nothing is lost, and no result
    is dropped from what the model sees."""
    p = agent_parts

    def deploy(version: str) -> str:
        """Deploy a version."""
        raise RuntimeError("deploys are frozen")

    replies = [*reads("t0", 4)[:-1], call("t0-d", ("t0-dep", "deploy", {"version": "v2"}))]
    replies += [m for t in (1, 2) for m in reads(f"t{t}", 5)]
    agent = create_agent(
        p.model(replies),
        [logs_tool(), StructuredTool.from_function(deploy)],
        middleware=[p.middleware],
        checkpointer=p.saver,
    )
    requests = requests_of(p, 3)
    with pytest.raises(RuntimeError, match="frozen"):
        agent.invoke({"messages": [requests[0]]}, p.config)
    run_turns(p, agent, requests[1:])
    check_kept(p, requests)
    for model in p.models:
        for sent in model.calls:
            problems = pairing_problems(sent)
            assert problems <= {"call:t0-d:t0-dep"}, problems
    assert compactions(p) == 1, jobs_of(p)


def test_langchains_own_summarization_beside_offpath_leaves_a_paired_thread(agent_parts):
    """A team that kept LangChain's ``SummarizationMiddleware`` beside offpath: it rewrites
    the thread (``RemoveMessage(REMOVE_ALL_MESSAGES)``, its summary, the kept messages)
    before model calls, while offpath's compactions are prepared from the thread it had.
    Every call stays paired and bounded; offpath applies nothing stale."""
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    p = agent_parts
    summarizer = GenericFakeChatModel(
        messages=iter([AIMessage(content=f"summary {k}") for k in range(100)])
    )
    theirs = SummarizationMiddleware(summarizer, trigger=("tokens", 2_500), keep=("messages", 6))
    replies = [m for t in range(3) for m in reads(f"t{t}", 5)]
    agent = create_agent(
        p.model(replies),
        [logs_tool()],
        middleware=[theirs, p.middleware],
        checkpointer=p.saver,
    )
    run_turns(p, agent, requests_of(p, 3))
    check_calls(p)
    assert not pairing_problems(p.messages())


@pytest.mark.parametrize("kind", ["text", "blocks"])
def test_one_result_larger_than_the_hard_limit_is_shortened_as_it_arrives(agent_parts, kind):
    """A single read of 60,000 chars (over the 18,000-char hard limit alone), as a string or
    as text parts: the call that first sees it is bounded, and the original is archived."""
    p = agent_parts
    replies = [*reads("t0", 2), *reads("t1", 1, chars=60_000), *reads("t2", 3)]
    tool = logs_tool() if kind == "text" else content_blocks_tool()
    agent = create_agent(p.model(replies), [tool], middleware=[p.middleware], checkpointer=p.saver)
    run_checked(p, agent, 3)
    if kind == "text":
        check_results_whole(p, pages_of(replies))


def test_a_copy_cut_short_before_offpath_never_sends_a_result_without_its_call(agent_parts):
    """A middleware before offpath sends only the last messages (a naive trim, as some
    teams do): the cut may leave a result whose call it dropped (deepagents#270). offpath
    leaves such a result out of what it sends, as it does for the thread's own orphans."""
    from langchain.agents.middleware import AgentMiddleware

    class LastSeven(AgentMiddleware):
        def wrap_model_call(self, request, handler):
            msgs = list(request.messages)
            return handler(request.override(messages=[msgs[0], *msgs[1:][-7:]]))

    p = agent_parts
    replies = [m for t in range(2) for m in reads(f"t{t}", 6)]
    replies[1] = call(
        "t0-a1", ("t0-c1a", "fetch_logs", page("x1")), ("t0-c1b", "fetch_logs", page("x2"))
    )
    replies[8] = call(
        "t1-a1", ("t1-c1a", "fetch_logs", page("y1")), ("t1-c1b", "fetch_logs", page("y2"))
    )
    agent = create_agent(
        p.model(replies),
        [logs_tool()],
        middleware=[LastSeven(), p.middleware],
        checkpointer=p.saver,
    )
    run_checked(p, agent, 2)


def test_a_long_history_given_as_dicts_without_ids_is_bounded_paired_and_compacted(agent_parts):
    """A team imports a conversation: 36 OpenAI-style dicts without ids (calls, results,
    answers; about 24,000 chars, over the hard limit) as the first input. LangGraph gives
    them ids; the first call is bounded and paired, later turns compact, nothing is lost."""
    p = agent_parts
    history: list[dict[str, Any]] = []
    for k in range(9):
        history.append({"role": "user", "content": f"Old question {k}"})
        history.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": f"old-{k}",
                        "type": "function",
                        "function": {"name": "fetch_logs", "arguments": f'{{"page": "o{k}"}}'},
                    }
                ],
            }
        )
        history.append(
            {"role": "tool", "tool_call_id": f"old-{k}", "content": filler(f"o{k}", 2_600)}
        )
        history.append({"role": "assistant", "content": f"Old answer {k}"})
    replies = [m for t in range(2) for m in reads(f"t{t}", 4)]
    agent = create_agent(
        p.model(replies), [logs_tool()], middleware=[p.middleware], checkpointer=p.saver
    )
    requests = requests_of(p, 2)
    agent.invoke({"messages": [*history, requests[0]]}, p.config)
    agent.invoke({"messages": [requests[1]]}, p.config)
    check_calls(p)
    check_kept(p, requests)
    texts = {str(m.content) for m in [*p.messages(), *p.archived()] if m.type == "tool"}
    assert all(filler(f"o{k}", 2_600) in texts for k in range(9))
    assert compactions(p) == 1, jobs_of(p)


def test_one_middleware_serving_threads_at_once_keeps_each_thread_its_own(agent_parts):
    """One ``OffPathCompaction`` in an agent that serves three threads at the same time
    (a web service's workers): each thread compacts on its own, no message crosses."""
    from concurrent.futures import ThreadPoolExecutor

    p = agent_parts
    runs = []
    for n in range(3):
        tid = f"{p.thread_id}-{n}"
        replies = [m for t in range(2) for m in reads(f"{tid}-t{t}", 5)]
        model = p.model(replies)
        agent = create_agent(model, [logs_tool()], middleware=[p.middleware], checkpointer=p.saver)
        requests = [HumanMessage(id=f"{tid}-h{k}", content=f"Check part {k}") for k in range(2)]
        runs.append((tid, agent, requests))

    def drive(tid: str, agent: Any, requests: list[HumanMessage]) -> list[BaseMessage]:
        config = {"configurable": {"thread_id": tid}, "recursion_limit": 500}
        for r in requests:
            agent.invoke({"messages": [r]}, config)
        return agent.get_state(config).values["messages"]

    with ThreadPoolExecutor(3) as pool:
        finals = list(pool.map(lambda r: drive(*r), runs))
    check_calls(p)
    for (tid, _, _), final in zip(runs, finals, strict=True):
        strangers = [
            m.id
            for m in final
            if m.id and not is_summary(m) and not str(m.id).startswith(tid) and m.type != "tool"
        ]
        assert not strangers, (tid, strangers)
        assert not pairing_problems(final)
        assert sum(1 for m in final if is_summary(m)) == 1, tid


class Flaky(Exception):
    """What the model's provider raises on every call's first attempt (a 429, a 500)."""


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_model_call_that_fails_and_is_retried_loses_no_compaction_nor_message(agent_parts, where):
    """The provider fails every call's first attempt and LangChain's ``ModelRetryMiddleware``
    retries it, listed before offpath (each retry runs offpath's hook again) or after it (the
    retry happens inside offpath's call). A compaction applied at a failed attempt is applied
    at a later call or stays prepared for the next one; nothing is lost or orphaned. Listed
    before offpath, a failed attempt's apply archived the originals of the results it kept
    shortened under its job; the retry, shortening the same results, found those rows and
    archived nothing, and the job's next apply rewrote its rows from the shortened thread:
    the originals were gone."""
    from langchain.agents.middleware import ModelRetryMiddleware

    p = agent_parts
    replies = [m for t in range(3) for m in reads(f"t{t}", 5)]
    model = p.model(replies)
    attempts = {"n": 0}

    def fail_first(messages: list[BaseMessage]) -> None:
        attempts["n"] += 1
        if attempts["n"] % 2:
            raise Flaky("provider overloaded")

    model.on_call = fail_first
    retry = ModelRetryMiddleware(max_retries=2, initial_delay=0.0, jitter=False)
    stack = [retry, p.middleware] if where == "before" else [p.middleware, retry]
    agent = create_agent(model, [logs_tool()], middleware=stack, checkpointer=p.saver)
    requests = requests_of(p, 3)
    run_turns(p, agent, requests)
    model.calls = model.calls[1::2]  # the attempts that were answered
    check_calls(p)
    check_kept(p, requests)
    check_results_whole(p, pages_of(replies))
    assert compactions(p) <= 1
    p.worker.drain()  # a job the last call queued has run (on a loaded machine it may not yet)
    assert {status for status, _ in jobs_of(p)} <= {"applied", "prepared"}, jobs_of(p)


def test_an_original_archived_only_under_a_job_not_applied_is_archived_again(agent_parts):
    """``store_shortened`` keeps a result's first row, but only a row that stays counts: the
    rows of a job not applied are rewritten at its apply (or never shown)."""
    from offpath.stores.db.transitions import create_job

    p = agent_parts
    engine, sid = p.client.engine, p.thread_id
    original = ToolMessage(id="r1", content=filler("r1", 2_000), tool_call_id="c1")
    create_job(engine, "job-x", sid, 5_000)
    rows = archive.rows_for(sid, "job-x", "sum-x", [original], [], ["r1"])
    archive.store_record(engine, "job-x", {"prepared": {}}, rows)
    assert "r1" not in p.archived_ids()  # the job is not applied: its rows are not shown
    archive.store_shortened(engine, sid, [(0, original)])
    (shown,) = [m for m in p.archived() if m.id == "r1"]
    assert shown.content == original.content
    archive.store_shortened(engine, sid, [(0, original.model_copy(update={"content": "x"}))])
    assert [m.content for m in p.archived() if m.id == "r1"] == [original.content]


def test_an_async_run_with_a_middleware_before_offpath_compacts_and_pairs(agent_parts):
    """``ainvoke`` (offpath's ``awrap_model_call``) under LangChain's
    ``ContextEditingMiddleware`` with reasoning replies: the same rules as a sync run."""
    import asyncio

    from langchain.agents.middleware import ClearToolUsesEdit, ContextEditingMiddleware
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    p = agent_parts
    replies = []
    for t in range(3):
        replies += [reasoning_reply(f"t{t}-a{k}", f"toolu_{t}{k}", f"{t}{k}") for k in range(5)]
        replies.append(AIMessage(id=f"t{t}-done", content="done"))
    editing = ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=800, keep=1)])
    model = p.model(replies)
    requests = requests_of(p, 3)

    async def main() -> None:
        async with AsyncSqliteSaver.from_conn_string(p.url.removeprefix("sqlite:///")) as saver:
            agent = create_agent(
                model, [logs_tool()], middleware=[editing, p.middleware], checkpointer=saver
            )
            for request in requests:
                await agent.ainvoke({"messages": [request]}, p.config)

    asyncio.run(main())
    check_calls(p)
    check_kept(p, requests)
    check_results_whole(p, pages_of(replies))
    assert compactions(p) == 1, jobs_of(p)


def lagging(saver: Any, lag_s: float) -> Any:
    """``saver`` with each checkpoint written ``lag_s`` late (LangGraph writes a run's
    checkpoints in the background, one after another: on a loaded database they fall seconds
    behind the run)."""
    put = saver.put

    def late(*args: Any, **kw: Any) -> Any:
        time.sleep(lag_s)
        return put(*args, **kw)

    saver.put = late
    return saver


def test_a_checkpoint_that_lags_the_run_never_makes_a_prepared_compaction_stale(
    agent_parts, monkeypatch
):
    """The run's checkpoints fall behind it (each written 0.3 s late) further than a job waits
    for them: a job planned on what the checkpoint held then was prepared on a thread the run
    no longer had (the summary of the compaction it applied meanwhile at the same id), found
    stale at the swap, or on one still under its threshold (skipped), and the thread stayed
    over its threshold until another was prepared. A job queued by the run plans on the
    thread the run had when it queued it."""
    import offpath.worker.jobs as jobs
    from offpath.stores.db.tables import JobStatus

    monkeypatch.setattr(jobs, "CHECKPOINT_LAG_S", 0.05)
    p = agent_parts
    saver = lagging(p.saver, 0.3)
    replies = [m for t in range(3) for m in reads(f"t{t}", 6)]
    agent = create_agent(p.model(replies), [logs_tool()], middleware=[p.middleware],
                         checkpointer=saver)  # fmt: skip
    run_checked(p, agent, 3)
    statuses = jobs_of(p)
    # nor one planned on a checkpoint that did not hold the run's messages yet
    wasted = [r for _, r in statuses if (r or "").startswith(("stale", "under_threshold"))]
    assert not wasted, statuses
    assert sum(s == JobStatus.APPLIED for s, _ in statuses) >= 2, statuses


def test_a_call_that_drops_a_stale_compaction_knows_the_freed_claim_at_once(tmp_path, monkeypatch):
    """A model call over the threshold finds the prepared compaction stale: the job ends
    and hands the thread on (free). The call knows it at once, not at a later call's
    background read, so that the same call queues the next job: the thread waits one summary
    for it, not a call more."""
    import offpath.agent.middleware.applying as applying
    from offpath.compaction.patch import Stale
    from offpath.stores.db.tables import JobStatus

    settings = load_settings(
        data_dir=str(tmp_path),
        lock_backend="database",
        summarization_threshold_chars=6_000,
        summarization_keep_chars=2_000,
    )
    client = Client.open(settings, publish=lambda *_: None)
    try:
        mw = OffPathCompaction(settings, client=client, recall=False)
        sid = "t-stale"
        assert client.leases.claim(sid, "job1") is None  # queued, then prepared
        assert client.leases.store.swap(client.leases.key(sid), "q:job1", "p:job1", 60)
        holder = client.leases.holder(sid)
        mw.claims.read_claim(sid)  # as the background read gives it to the call
        assert mw.claims.claim_of(sid) == (True, holder)
        row = {"status": JobStatus.PREPARED, "result": {"prepared": {}}, "options": {}}
        monkeypatch.setattr(applying, "job_row", lambda *_: row)

        def stale(writer: Any, session_id: str, job_id: str, *_: Any, **__: Any) -> Stale:
            client.leases.settle(session_id, job_id, None)  # ended skipped (stale): freed
            return Stale("message h changed since the summary was prepared")

        monkeypatch.setattr(client.jobs, "apply", stale)
        messages: list[BaseMessage] = [HumanMessage(id="h", content="x" * 7_000)]
        after, _ = mw.applying.apply_now(sid, holder, messages, {}, 7_000)
        assert after is messages
        assert mw.claims.claim_of(sid) == (True, None)  # as the call's queueing step asks
    finally:
        client.close()


def test_a_jobs_message_carries_the_runs_messages_and_its_row_does_not():
    """The run's messages travel with the job's message (the worker plans on them), shortened
    results with their marks, so that their digests are the run's; the job's row keeps the
    options alone (a job published again reads the checkpoint); a message JSON cannot carry,
    or more than the broker message's bound of them, leaves them out."""
    from offpath.compaction.shorten import digest, shorten
    from offpath.coordination.jobs import JOB_MESSAGES_MAX_BYTES, JobOptions

    long = ToolMessage(id="t", content="line of log\n" * 400, tool_call_id="c")
    thread = [HumanMessage(id="h", content="why?"), call("a", ("c", "fetch_logs", {})),
              shorten(long, 600)]  # fmt: skip
    options = JobOptions(patch=False, messages=tuple(thread))
    assert "messages" not in options.to_json()
    sent = JobOptions.from_json(options.to_message())
    assert sent.messages is not None
    assert [(m.id, digest(m)) for m in sent.messages] == [(m.id, digest(m)) for m in thread]
    odd = HumanMessage(id="x", content="x", additional_kwargs={"seen": object()})
    assert JobOptions.from_json(JobOptions(messages=(odd,)).to_message()).messages is None
    assert JobOptions.from_json(options.to_json()).messages is None
    big = HumanMessage(id="b", content="x" * (JOB_MESSAGES_MAX_BYTES + 1))
    assert "messages" not in JobOptions(messages=(big,)).to_message()
