"""A call the provider refuses as over its context length is a compaction trigger, not the end
of the run (issue 30, item 5): the middleware makes the call smaller and retries it once;
only a second refusal ends the run, with :class:`ContextRefused` saying so.

The agent's model is ``ChatOpenAI`` over real HTTP at the stub LLM, which refuses in OpenAI's
shape, Anthropic's, or llama.cpp's server's (one ``langchain_openai`` does not convert), once
or always. The thread is grown by earlier runs to about 30,000 chars, under the 40,000-char
threshold and its 32,000-char prepare floor: the model's window (70% of what it was sent, the
stub says) is below what the thresholds let through. Without a worker on its queue nothing is
prepared, so the retry shortens older results in the thread (originals archived) and masks
the rest for that call; with the stack's worker, the compaction it prepared is applied.
After each run the thread keeps DESIGN.md invariants 3, 12 and 13.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import httpx
import pytest
import sqlalchemy as sa
from langchain.agents import create_agent
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    messages_from_dict,
)
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from shared import marked_summary, pairing_problems, shortened_from
from stack import REDIS_URL, forget_broker_queue, wait_for

from offpath import OffPathCompaction
from offpath.agent.middleware.refusals import ContextRefused
from offpath.compaction.settings import Settings
from offpath.config import load_settings
from offpath.stores import archive
from offpath.stores.checkpoints import open_checkpoints_url
from offpath.stores.db.engine import make_engine, migrate

THRESHOLD, KEEP = 40_000, 10_000
#: Earlier runs, each adding a request, a tool call, its 3,500-char result and an answer.
RUNS = 8
SHAPES = ["context_openai", "context_anthropic", "context_llamacpp"]
#: What the stub says the model's window is, as a share of what it was sent.
WINDOW = 0.7


@pytest.fixture
def own(tmp_path) -> Iterator[Settings]:
    """Settings of a team's agent on Redis (database 13) and a SQLite usage DB, whose queue no
    worker consumes: nothing is ever prepared."""
    name = f"test-refusal-{uuid.uuid4().hex[:8]}"
    settings = load_settings(
        redis_url=REDIS_URL,
        celery_queue=name,
        redis_key_prefix=name,
        data_dir=str(tmp_path / "data"),
        summarization_threshold_chars=THRESHOLD,
        summarization_keep_chars=KEEP,
    )
    migrate(settings)
    yield settings
    forget_broker_queue({"REDIS_URL": REDIS_URL, "CELERY_QUEUE": name})


def refuse(stub, mode: str, needle: str, times: int | None) -> None:
    with stub.state.lock:
        stub.state.mode, stub.state.times, stub.state.needle = mode, times, needle


def model(stub) -> ChatOpenAI:
    """The agent's model at the stub; an async client of its own (the default one is shared
    by the process, and its pooled connections belong to the event loop of an earlier test)."""
    return ChatOpenAI(
        model="stub",
        api_key="k",
        base_url=stub.base_url,
        max_retries=0,
        http_async_client=httpx.AsyncClient(),
    )


def grow(agent, config: dict) -> list[BaseMessage]:
    """:data:`RUNS` runs, each a request, a call and its result the model answers; the thread."""
    for k in range(RUNS):
        lines = (f"{k}:{i} GET /cart 200 {i % 97} ms pod-{i % 7}" for i in range(2_000))
        call = {"id": f"c-{k}", "name": "get_logs", "args": {"service": "cart", "page": k}}
        step = [
            HumanMessage(f"look at page {k} of the cart logs", id=f"h-{k}"),
            AIMessage("", tool_calls=[call], id=f"a-{k}"),
            ToolMessage("\n".join(lines)[:3_500], tool_call_id=f"c-{k}", id=f"t-{k}"),
        ]
        agent.invoke({"messages": step}, config)
    return list(agent.get_state(config).values["messages"])


def agent_calls(stub, needle: str) -> list[list[dict]]:
    """The agent's requests (not a summarizer's) that name ``needle``, in order."""
    with stub.state.lock:
        found = [r["messages"] for r in stub.state.requests if needle in json.dumps(r["messages"])]
    return [ms for ms in found if not str(ms[0].get("content", "")).startswith("You compact")]


def sent(stub, needle: str) -> list[int]:
    """The sizes (JSON chars, as the stub counts its tokens) of the agent's calls naming
    ``needle``."""
    return [len(json.dumps(ms)) for ms in agent_calls(stub, needle)]


def content_chars(stub, needle: str) -> list[int]:
    return [sum(len(str(m.get("content") or "")) for m in ms) for ms in agent_calls(stub, needle)]


def check_kept(settings: Settings, session: str, before: list, after: list) -> None:
    """Invariants 3 and 12 on the thread after a retry: no orphan; every earlier message still
    there, byte for byte, or shortened in place with its original archived."""
    assert not pairing_problems(after), pairing_problems(after)
    now = {m.id: m for m in after}
    engine = make_engine(settings)
    try:
        for m in before:
            if m.id in now and now[m.id] == m:
                continue
            stored = archive.original(engine, session, str(m.id))
            assert stored is not None, f"{m.id} left the thread and is not archived"
            (original,) = messages_from_dict([stored])
            assert original.content == m.content, f"{m.id}'s archived original differs"
            if m.id in now and not marked_summary(now[m.id]):
                assert shortened_from(now[m.id], m), f"{m.id} changed but is not shortened"
    finally:
        engine.dispose()


@pytest.mark.parametrize("shape", SHAPES)
def test_a_refusal_is_retried_once_smaller_and_the_run_goes_on(stub, own, shape):
    middleware = OffPathCompaction(own)
    agent = create_agent(model(stub), [], middleware=[middleware], checkpointer=InMemorySaver())
    session = f"refused-{uuid.uuid4().hex[:8]}"
    config = {"configurable": {"thread_id": session}}
    before = grow(agent, config)
    assert KEEP < sum(len(str(m.content)) for m in before) < own.prepare_floor_chars

    needle = f"REFUSE-{uuid.uuid4().hex[:8]}"
    refuse(stub, shape, needle, times=1)
    agent.invoke({"messages": [HumanMessage(f"and now? {needle}", id="h-now")]}, config)
    after = list(agent.get_state(config).values["messages"])

    refused, retried = sent(stub, needle)  # exactly two calls: the refusal and one retry
    assert retried < WINDOW * refused  # inside the window the provider named
    assert content_chars(stub, needle)[1] <= own.prepare_floor_chars  # invariant 13
    assert isinstance(after[-1], AIMessage) and after[-1].content.startswith("stub reply")
    check_kept(own, session, before, after)
    assert any(shortened_from(m, o) for m, o in zip(after, before, strict=False))


def test_a_refusal_is_retried_in_an_async_run_too(stub, own):
    middleware = OffPathCompaction(own)
    agent = create_agent(model(stub), [], middleware=[middleware], checkpointer=InMemorySaver())
    session = f"refused-a-{uuid.uuid4().hex[:8]}"
    config = {"configurable": {"thread_id": session}}
    before = grow(agent, config)
    needle = f"REFUSE-{uuid.uuid4().hex[:8]}"
    refuse(stub, "context_anthropic", needle, times=1)
    request = HumanMessage(f"and now? {needle}", id="h-now")
    asyncio.run(agent.ainvoke({"messages": [request]}, config))
    after = list(agent.get_state(config).values["messages"])
    refused, retried = sent(stub, needle)
    assert retried < WINDOW * refused
    assert after[-1].content.startswith("stub reply")
    check_kept(own, session, before, after)


@pytest.mark.parametrize("shape", ["context_openai", "context_anthropic"])
@pytest.mark.parametrize("run", ["invoke", "ainvoke"])
def test_a_second_refusal_ends_the_run_saying_so(stub, own, shape, run):
    middleware = OffPathCompaction(own)
    agent = create_agent(model(stub), [], middleware=[middleware], checkpointer=InMemorySaver())
    session = f"refused-2-{uuid.uuid4().hex[:8]}"
    config = {"configurable": {"thread_id": session}}
    before = grow(agent, config)
    needle = f"REFUSE-{uuid.uuid4().hex[:8]}"
    refuse(stub, shape, needle, times=None)  # every call naming it
    request = {"messages": [HumanMessage(f"and now? {needle}", id="h-now")]}
    with pytest.raises(ContextRefused) as refused:
        if run == "invoke":
            agent.invoke(request, config)
        else:
            asyncio.run(agent.ainvoke(request, config))
    text = str(refused.value)
    first, second = sent(stub, needle)  # one retry, no more
    assert second < first
    assert "refused this call as over its context length twice" in text
    assert "shortened" in text and "older message" in text  # what was tried
    words = "maximum context length" if shape == "context_openai" else "prompt is too long"
    assert text.count(words) == 2  # the provider's words, both times
    assert "SUMMARIZATION_THRESHOLD_CHARS (40,000)" in text
    # nothing lost: the thread has every earlier message as it was (the run's update never
    # landed; what the retry shortened is archived, and still whole in the thread)
    after = list(agent.get_state(config).values["messages"])
    assert [m for m in after if m.id != "h-now"] == before


def test_a_call_that_cannot_be_made_smaller_ends_the_run_at_once(stub, own):
    middleware = OffPathCompaction(own)
    agent = create_agent(model(stub), [], middleware=[middleware], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": f"tiny-{uuid.uuid4().hex[:8]}"}}
    needle = f"REFUSE-{uuid.uuid4().hex[:8]}"
    refuse(stub, "context_openai", needle, times=None)
    request = HumanMessage(f"{needle} " + "why is checkout slow? " * 200)  # the request alone
    with pytest.raises(ContextRefused, match="could make it no smaller"):
        agent.invoke({"messages": [request]}, config)
    assert len(sent(stub, needle)) == 1  # no retry of the same call


def test_another_error_is_not_retried(stub, own):
    middleware = OffPathCompaction(own)
    agent = create_agent(model(stub), [], middleware=[middleware], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": f"err-{uuid.uuid4().hex[:8]}"}}
    grow(agent, config)
    needle = f"FAIL-{uuid.uuid4().hex[:8]}"
    refuse(stub, "500", needle, times=1)
    with pytest.raises(Exception, match="internal error") as raised:
        agent.invoke({"messages": [HumanMessage(f"and now? {needle}")]}, config)
    assert not isinstance(raised.value, ContextRefused)
    assert len(sent(stub, needle)) == 1


def test_a_refusal_applies_the_compaction_the_worker_prepared(stacks, stub, tmp_path):
    stack = stacks.get(
        "sqlite",
        SUMMARIZATION_THRESHOLD_CHARS=str(THRESHOLD),
        SUMMARIZATION_KEEP_CHARS=str(KEEP),
        JOB_LEASE_S="3",
        RECONCILE_INTERVAL_S="2",
    )
    settings = stack.settings()
    store = f"sqlite:///{tmp_path / 'agent.db'}"
    middleware = OffPathCompaction(settings, checkpointer_url=store)
    session = f"refused-p-{uuid.uuid4().hex[:8]}"
    config = {"configurable": {"thread_id": session}}
    with open_checkpoints_url(store, settings) as checkpoints:
        agent = create_agent(
            model(stub), [], middleware=[middleware], checkpointer=checkpoints.saver
        )
        before = grow(agent, config)
        # past its prepare point, the thread's job is prepared by the worker (not applied:
        # the thread is under its threshold)
        prepared = wait_for(
            lambda: [j for j in stack.jobs(session) if j["status"] == "prepared"], timeout=60
        )
        needle = f"REFUSE-{uuid.uuid4().hex[:8]}"
        refuse(stub, "context_openai", needle, times=1)
        agent.invoke({"messages": [HumanMessage(f"and now? {needle}", id="h-now")]}, config)
        after = list(agent.get_state(config).values["messages"])

    refused, retried = sent(stub, needle)
    assert retried < WINDOW * refused
    summaries = [m for m in after if marked_summary(m)]
    assert len(summaries) == 1 and after[0] is summaries[0]  # the summary goes first
    check_kept(settings, session, before, after)
    job = prepared[0]["job_id"]
    applied = wait_for(
        lambda: [j for j in stack.jobs(session) if j["job_id"] == job and j["status"] == "applied"],
        timeout=30,
    )
    assert applied
    engine = sa.create_engine(stack.db_url())
    try:
        rows, _ = archive.read(engine, session, limit=1_000)
    finally:
        engine.dispose()
    assert {m.id for m in before} - {m.id for m in after} <= {r["message_id"] for r in rows}
