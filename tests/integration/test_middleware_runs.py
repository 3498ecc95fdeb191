"""The middleware in a user's own agent, during long tool loops (issue 9).

Each single-request transcript of ../shared/transcripts is replayed as a live run
of a LangChain ``create_agent`` agent: a scripted model returns the transcript's
AI messages in order and scripted tools return its tool results. The agent has
``OffPathCompaction`` and a checkpointer of its own (a PostgreSQL database or a
SQLite file that is not offpath's); a real worker on Redis prepares the
compactions, reading the thread by URL, and the middleware applies them inside
the run. At every model call the DESIGN invariants are checked on what the
model is sent, and no call goes over the hard limit.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence

import pytest
import sqlalchemy as sa
from agent_replay import TranscriptModel, scripted_tools
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from shared import TRANSCRIPTS, load, marked_summary, messages_of, pairing_problems
from stack import create_pg_database, drop_pg_database, wait_for

from offpath import OffPathCompaction
from offpath.compaction.accounting import total_chars
from offpath.stores import archive
from offpath.stores.checkpoints import open_checkpoints_url

pytestmark = pytest.mark.usefixtures("stub")

SINGLE_REQUEST = [
    p
    for p in TRANSCRIPTS
    if sum(m["type"] == "human" for m in load(p)["messages"]) == 1
    and sum(len(str(m.get("content", ""))) for m in load(p)["messages"]) > 60_000
]
#: The service's defaults, as a user would run it; a short lease keeps the suite quick.
ENV = {"JOB_LEASE_S": "3", "RECONCILE_INTERVAL_S": "2"}


@pytest.fixture(params=["postgres", "sqlite"])
def agent_store(request, tmp_path) -> Iterator[str]:
    """The user's own checkpointer: a database offpath does not use for itself."""
    if request.param == "postgres":
        url = create_pg_database("offpath_test_agent")
        yield url
        drop_pg_database(url)
    else:
        yield f"sqlite:///{tmp_path / 'agent-checkpoints.db'}"


def check_model_call(
    sent: Sequence[BaseMessage], system: SystemMessage | None, seen: set, covered: set, limit: int
) -> None:
    """The DESIGN invariants on what one model call is sent."""
    assert total_chars(sent) <= limit, f"a model call of {total_chars(sent)} chars > {limit}"
    body = list(sent)
    if system is not None:
        assert body[0] == system, "the system prompt moved or changed"
        body = body[1:]
    summaries = [m for m in body if marked_summary(m)]
    assert len(summaries) <= 1, "two summaries"
    if summaries:
        assert body[0] is summaries[0], "the summary is not first"
        covered.update(summaries[0].additional_kwargs["summary"]["replaced_ids"])
    assert not pairing_problems(body), f"orphans sent to the model: {pairing_problems(body)}"
    ids = {m.id for m in sent}
    lost = seen - ids - covered
    assert not lost, f"messages lost: {sorted(lost)[:5]}"
    seen.update(ids)


@pytest.mark.parametrize("path", SINGLE_REQUEST, ids=lambda p: p.stem)
def test_single_request_transcript_as_a_live_run(stacks, path, agent_store):
    stack = stacks.get("sqlite" if agent_store.startswith("sqlite") else "postgres", **ENV)
    doc = load(path)
    messages = messages_of(doc)
    system = messages[0] if isinstance(messages[0], SystemMessage) else None
    request = next(m for m in messages if isinstance(m, HumanMessage))
    replies = [m for m in messages if isinstance(m, AIMessage)]
    if replies[-1].tool_calls:  # the run ends with the submit command's result
        replies.append(AIMessage(id=f"{path.stem}-end", content="Submitted."))
    model = TranscriptModel(replies=replies, delay_s=0.05)
    middleware = OffPathCompaction(
        stack.settings(), checkpointer_url=agent_store, client=stack.client()
    )
    with open_checkpoints_url(agent_store, stack.settings()) as checkpoints:
        agent = create_agent(
            model,
            scripted_tools(messages),
            system_prompt=system,
            middleware=[middleware],
            checkpointer=checkpoints.saver,
        )
        session = f"run-{path.stem[:20]}-{uuid.uuid4().hex[:6]}"
        config = {"configurable": {"thread_id": session}, "recursion_limit": 10_000}
        agent.invoke({"messages": [request]}, config)
        final = agent.get_state(config).values["messages"]

    limit = stack.settings().hard_limit_chars
    seen: set = set()
    covered: set = set()
    for sent in model.calls:
        check_model_call(sent, system, seen, covered, limit)
    assert len(model.calls) == len(replies)
    assert final[-1].content == replies[-1].content  # the run went to its end
    # compactions happened during the run (the transcripts are 90k-290k chars)
    assert covered, "no compaction was applied during the run"
    jobs = wait_for(
        lambda: (
            (js := stack.jobs(session))
            and all(j["status"] in ("applied", "skipped", "failed", "prepared") for j in js)
            and js
        ),
        timeout=60,
    )
    applied = [j for j in jobs if j["status"] == "applied"]
    assert applied and not [j for j in jobs if j["status"] == "failed"], jobs
    # issue 19: the middleware records each compaction's loss report (made after the swap,
    # off the model call's path: it follows within moments); its thread (a team's own agent's
    # checkpoint, which offpath never writes) cannot be reverted from the API
    applied = wait_for(
        lambda: (
            (js := [j for j in stack.jobs(session) if j["status"] == "applied"])
            and all((j["loss"] or {}).get("messages_removed") == j["messages_removed"] for j in js)
            and js
        ),
        timeout=30,
    )
    r = stack.http.post(f"/sessions/{session}/compactions/{applied[-1]['job_id']}/revert")
    assert r.status_code == 409 and "never writes" in r.json()["detail"], r.text
    assert len([m for m in final if marked_summary(m)]) == 1
    # invariant 12: whatever the model was sent and the thread no longer holds is archived;
    # a compaction applied by the run's last step is recorded (its archive shown) by the
    # reconciler's next pass (RECONCILE_INTERVAL_S 2 s here)
    engine = sa.create_engine(stack.db_url())

    def unarchived() -> set:
        rows, _ = archive.read(engine, session, limit=1_000_000)
        gone = seen - {m.id for m in final} - {r["message_id"] for r in rows}
        gone.discard(system.id if system else None)  # the agent's system_prompt: not in its state
        return gone

    deadline = time.monotonic() + 15
    while (gone := unarchived()) and time.monotonic() < deadline:
        time.sleep(0.5)
    engine.dispose()
    assert not gone, f"removed but not archived: {sorted(gone)[:5]}"


def test_no_more_graph_steps_than_summarization_middleware(stacks, tmp_path):
    """Issue 21, item 5: an agent that ran 65 tool calls needed ~270 graph steps with
    offpath (GraphRecursionError at 150). The bookkeeping lives in ``wrap_model_call``, which
    adds no node: the run takes no more supersteps than with LangChain's own
    ``SummarizationMiddleware`` (one ``before_model`` node per model call), and it completes
    under the recursion limit that one needs, compactions included.

    Item 4 on the same run: ``on_compaction`` hears each compaction queued
    (``in_progress``) and then ``completed`` with its sizes, as the job rows have them."""
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langgraph.errors import GraphRecursionError

    stack = stacks.get("sqlite", **ENV)
    path = min(SINGLE_REQUEST, key=lambda p: len(load(p)["messages"]))
    messages = messages_of(load(path))
    system = messages[0] if isinstance(messages[0], SystemMessage) else None
    request = next(m for m in messages if isinstance(m, HumanMessage))
    replies = [m for m in messages if isinstance(m, AIMessage)]
    if replies[-1].tool_calls:
        replies.append(AIMessage(id=f"{path.stem}-end", content="Submitted."))
    threshold = stack.settings().summarization_threshold_chars

    events: list = []

    def steps(kind: str, limit: int = 10_000) -> tuple[int, int]:
        """(supersteps the run took, compactions seen by the model) for one middleware."""
        store = f"sqlite:///{tmp_path / f'{kind}-{limit}.db'}"
        model = TranscriptModel(replies=replies, delay_s=0.05)
        if kind == "offpath":
            middleware = [
                OffPathCompaction(
                    stack.settings(),
                    checkpointer_url=store,
                    client=stack.client(),
                    on_compaction=events.append if limit == 10_000 else None,
                )
            ]
        elif kind == "langchain":
            summary = GenericFakeChatModel(messages=iter([AIMessage("a summary")] * 1_000))
            middleware = [
                SummarizationMiddleware(
                    summary,
                    trigger=("tokens", threshold // 4),
                    keep=("tokens", stack.settings().summarization_keep_chars // 4),
                    token_counter=lambda ms: total_chars(list(ms)) // 4,
                )
            ]
        else:
            middleware = []
        with open_checkpoints_url(store, stack.settings()) as checkpoints:
            agent = create_agent(
                model,
                scripted_tools(messages),
                system_prompt=system,
                middleware=middleware,
                checkpointer=checkpoints.saver,
            )
            thread = f"steps-{kind}-{limit}-{uuid.uuid4().hex[:6]}"
            config = {"configurable": {"thread_id": thread}, "recursion_limit": limit}
            agent.invoke({"messages": [request]}, config)
            history = list(agent.get_state_history(config))
        # one checkpoint per superstep, and one for the input
        summaries = sum(any(marked_summary(m) for m in sent) for sent in model.calls)
        return len(history) - 1, summaries

    plain, _ = steps("none")
    theirs, _ = steps("langchain")
    ours, compacted = steps("offpath")
    assert compacted, "no compaction was applied during the run"
    # item 4: every completed compaction was heard queued first, with the job row's sizes
    (session,) = {e.session_id for e in events}
    applied = {j["job_id"]: j for j in stack.jobs(session) if j["status"] == "applied"}
    done = [e for e in events if e.status == "completed"]
    assert applied and {e.compaction_id for e in done} == set(applied), (events, applied)
    for e in done:
        queued = [q for q in events if q.compaction_id == e.compaction_id]
        assert queued[0].status == "in_progress" and queued[0].chars_before
        assert e.chars_after < e.chars_before
        assert e.to_acp()["sessionUpdate"] == "compaction_update"
        assert e.to_acp()["charsAfter"] == e.chars_after
    assert ours <= theirs, (ours, theirs, plain)
    assert ours <= plain + 2  # after_agent's node, once per run (and the input's step)
    # the recursion limit LangChain's middleware needs is enough for offpath
    steps("offpath", limit=theirs)
    with pytest.raises(GraphRecursionError):
        steps("offpath", limit=plain - 1)


def test_a_subagent_run_from_a_tool_compacts_its_own_messages_and_never_its_callers(
    stacks, tmp_path
):
    """DESIGN.md invariant 18, the shape of deepagents' ``task`` tool: a parent agent with a
    checkpointer and OffPathCompaction has a tool that runs a second agent with
    OffPathCompaction and no checkpointer of its own (LangGraph gives it the parent's
    checkpointer and thread id, under the namespace ``tools:<task id>``). The subagent runs
    a long single-request transcript and compacts in its run under a session of its own; the
    parent's thread keeps every message of its own (its requests, its ``task`` calls and
    their results), and no job of the subagent is the parent's."""
    stack = stacks.get("sqlite", **ENV)
    path = next(p for p in SINGLE_REQUEST if "pvlib" in p.stem)
    inner = messages_of(load(path))
    script_replies = [m for m in inner if isinstance(m, AIMessage)]
    if script_replies[-1].tool_calls:
        script_replies.append(AIMessage(id="sub-end", content="Submitted."))
    sub_model = TranscriptModel(replies=script_replies, delay_s=0.05)
    store = f"sqlite:///{tmp_path / 'agent-checkpoints.db'}"
    middleware = lambda: OffPathCompaction(  # noqa: E731
        stack.settings(), checkpointer_url=store, client=stack.client()
    )
    sub = create_agent(sub_model, scripted_tools(inner), middleware=[middleware()])
    request = next(m for m in inner if isinstance(m, HumanMessage))

    def task(description: str) -> str:
        """Run the subagent on a task and return its last answer."""
        result = sub.invoke({"messages": [HumanMessage(content=description)]})
        return str(result["messages"][-1].content)

    call = {"id": "task-0", "name": "task", "args": {"description": str(request.content)}}
    parent_model = TranscriptModel(
        replies=[
            AIMessage(id="p-call-0", content="", tool_calls=[call]),
            AIMessage(id="p-done-0", content="first task done"),
        ]
    )
    with open_checkpoints_url(store, stack.settings()) as checkpoints:
        parent = create_agent(
            parent_model, [task], middleware=[middleware()], checkpointer=checkpoints.saver
        )
        session = f"parent-{uuid.uuid4().hex[:6]}"
        config = {"configurable": {"thread_id": session}, "recursion_limit": 10_000}
        parent.invoke({"messages": [HumanMessage(id="p-req-0", content="investigate")]}, config)
        final = parent.get_state(config).values["messages"]
    ids = [m.id for m in final]
    assert ids[0] == "p-req-0" and "p-call-0" in ids and ids[-1] == "p-done-0", ids
    results = [m for m in final if m.type == "tool"]
    assert [m.tool_call_id for m in results] == ["task-0"]
    assert not any(marked_summary(m) for m in final), "the subagent's summary reached its caller"
    assert not pairing_problems(final)
    # the subagent did compact, in sessions of its own
    covered = [m for sent in sub_model.calls for m in sent if marked_summary(m)]
    assert covered, "the subagent never compacted"
    engine = sa.create_engine(stack.db_url())
    try:
        with engine.connect() as conn:
            sessions = {
                r[0]
                for r in conn.execute(sa.text("SELECT DISTINCT session_id FROM compaction_jobs"))
            }
    finally:
        engine.dispose()
    mine = {s for s in sessions if s.startswith(session)}
    assert mine and all(s.startswith(f"{session}|tools:") for s in mine), mine


def test_a_stream_in_messages_mode_shows_each_compaction(stacks, tmp_path):
    """Issue 35, item 4: a UI that renders an agent's stream in ``messages`` mode sees the
    history change. With ``stream_mode=["messages", "custom"]`` each compaction applied in the
    run comes as a custom event beside the model's messages, in the ACP shape (``completed``,
    its sizes, the job's id), in the order it happened: after the messages the thread held
    before it, before the run ends."""
    stack = stacks.get("sqlite", **ENV)
    path = min(SINGLE_REQUEST, key=lambda p: len(load(p)["messages"]))
    messages = messages_of(load(path))
    system = messages[0] if isinstance(messages[0], SystemMessage) else None
    request = next(m for m in messages if isinstance(m, HumanMessage))
    replies = [m for m in messages if isinstance(m, AIMessage)]
    if replies[-1].tool_calls:
        replies.append(AIMessage(id=f"{path.stem}-end", content="Submitted."))
    store = f"sqlite:///{tmp_path / 'streamed.db'}"
    thread = f"streamed-{uuid.uuid4().hex[:6]}"
    chunks: list[tuple[str, object]] = []
    with open_checkpoints_url(store, stack.settings()) as checkpoints:
        agent = create_agent(
            TranscriptModel(replies=replies, delay_s=0.05),
            scripted_tools(messages),
            system_prompt=system,
            middleware=[
                OffPathCompaction(stack.settings(), checkpointer_url=store, client=stack.client())
            ],
            checkpointer=checkpoints.saver,
        )
        config = {"configurable": {"thread_id": thread}, "recursion_limit": 10_000}
        for mode, chunk in agent.stream(
            {"messages": [request]}, config, stream_mode=["messages", "custom"]
        ):
            chunks.append((mode, chunk))
    updates = [chunk for mode, chunk in chunks if mode == "custom"]
    applied = {j["job_id"]: j for j in stack.jobs(thread) if j["status"] == "applied"}
    assert applied, "no compaction was applied during the run"
    done = [u for u in updates if u["status"] == "completed"]
    assert {u["compactionId"] for u in done} == set(applied), (updates, applied)
    for u in done:
        assert u["sessionUpdate"] == "compaction_update" and u["sessionId"] == thread
        assert u["charsAfter"] < u["charsBefore"], u
    # in the stream's order: some of the model's messages came before the first compaction
    first = next(i for i, (mode, c) in enumerate(chunks) if mode == "custom")
    assert any(mode == "messages" for mode, _ in chunks[:first])
    assert any(mode == "messages" for mode, _ in chunks[first:])


def _log_page(language: str, page: int, lines: int = 30) -> str:
    """One page of tool output: service log lines in ``language`` (``zh``, ``ja``, ``en``)."""
    text = {
        "zh": "结账服务 {k} 号请求等待数据库连接 {ms} 毫秒后失败，连接池已满，队列长度 {q}。",
        "ja": "チェックアウト {k} 番のリクエストは接続待ち {ms} ミリ秒で失敗、プールは満杯、待機 {q} 件。",
        "en": "checkout request {k} failed after waiting {ms} ms for a db connection, pool full, "
        "queue {q}.",
    }[language]
    return "\n".join(
        f"14:{(page + k) % 60:02d}:07 " + text.format(k=page * 100 + k, ms=1900 + k, q=k % 17)
        for k in range(lines)
    )


@pytest.mark.parametrize("language", ["zh", "ja", "en"])
def test_a_token_threshold_holds_for_cjk_tool_output(stacks, tmp_path, language):
    """Issue 35, item 3: with SUMMARIZATION_THRESHOLD_TOKENS=5000 the threshold became a
    20,000-char trigger (chars / 4); tool output in Chinese or Japanese runs 1.3-1.5 chars per
    token, and 35 of 37 model calls went over 5,000 tokens, up to 14,712. Each thread's sizes
    now scale by its own ratio (counted exactly for an OpenAI model): no call of a 37-call run
    sends more than the threshold in tokens, counted here in o200k_base, in any of the three
    languages, and the compactions land."""
    from offpath.compaction.tokens import TokenCounter

    stack = stacks.get(
        "sqlite", SUMMARIZATION_THRESHOLD_TOKENS="5000", SUMMARIZATION_KEEP_CHARS="6000", **ENV
    )
    settings = stack.settings()
    assert settings.summarization_threshold_tokens == 5000

    class OpenAIModel(TranscriptModel):
        model_name: str = "gpt-4o-mini"

    calls = 36
    replies = [
        AIMessage(
            id=f"cjk-{language}-{i}",
            content="",
            tool_calls=[{"id": f"c{i}", "name": "read_logs", "args": {"page": i}}],
        )
        for i in range(calls)
    ] + [
        AIMessage(id=f"cjk-{language}-end", content="The pool is exhausted."),
        AIMessage(id=f"cjk-{language}-next", content="The replica is healthy."),
    ]

    def read_logs(page: int) -> str:
        """Read a page of checkout-api's logs."""
        return _log_page(language, page)

    model = OpenAIModel(replies=replies, delay_s=0.05)
    store = f"sqlite:///{tmp_path / f'cjk-{language}.db'}"
    thread = f"cjk-{language}-{uuid.uuid4().hex[:6]}"
    with open_checkpoints_url(store, settings) as checkpoints:
        agent = create_agent(
            model,
            [read_logs],
            system_prompt="You are an SRE assistant.",
            middleware=[OffPathCompaction(settings, checkpointer_url=store, client=stack.client())],
            checkpointer=checkpoints.saver,
        )
        config = {"configurable": {"thread_id": thread}, "recursion_limit": 1_000}
        agent.invoke({"messages": [HumanMessage("Why does checkout fail?")]}, config)
        # the run lasts ~3 s: on a loaded machine its last job may still be queued when it
        # ends. Once the worker has prepared it, the next turn's first model call applies it.
        stack.settle(thread, expect_new_job=True, known=0)
        agent.invoke({"messages": [HumanMessage("And the replica?")]}, config)
    counter = TokenCounter("o200k_base")
    sent = [counter.count(call) for call in model.calls]
    assert len(sent) == calls + 2
    page = counter.text(_log_page(language, 1))
    assert page and 500 < page < 1_700, page  # a page is a tenth to a third of the threshold
    assert max(sent) <= 5_000, (language, sent)
    assert sum(sent) > 4 * 5_000  # the run produced several thresholds' worth
    wait_for(
        lambda: [j for j in stack.jobs(thread) if j["status"] == "applied"],
        what=lambda: f"no compaction applied: {stack.jobs(thread)}",
    )
