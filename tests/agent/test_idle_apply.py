"""A compaction prepared for a run that stopped between its prepare floor and its threshold
is applied at the thread's next run once the thread was idle ``SUMMARIZATION_IDLE_APPLY_S``,
before that run's first model call sees the thread: through the middleware's one apply
path (the run's state update), with its invariants: the summary first, what it removes
archived, one usage row, no orphaned tool call. A user's own agent (``create_agent`` with
``OffPathCompaction`` and a checkpointer of its own), offpath's stores on SQLite and Redis,
the prepared job as the worker leaves it."""

from __future__ import annotations

import time
import uuid

import pytest
import sqlalchemy as sa
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from shared import pairing_problems
from stack import small_runtime

from offpath import OffPathCompaction
from offpath.compaction.accounting import total_chars
from offpath.compaction.patch import Prepared
from offpath.compaction.planner import Skip, plan_compaction
from offpath.compaction.summary import is_summary
from offpath.compaction.tracking import KEY
from offpath.coordination.jobs import JobOptions
from offpath.stores import archive
from offpath.stores.db.job_queries import job_row
from offpath.stores.db.tables import EVENTS, JobStatus
from offpath.stores.db.transitions import create_job, store_result
from offpath.stores.leases.claims import Leases, State


@pytest.fixture
def rt(tmp_path):
    with small_runtime("sqlite", tmp_path, "test-idle-apply") as runtime:
        yield runtime


def history(prefix: str) -> list[BaseMessage]:
    """A thread between the prepare floor (0.8 x the 6,000-char threshold) and the threshold."""
    messages: list[BaseMessage] = []
    for k in range(12):
        messages += [
            HumanMessage(id=f"{prefix}-h{k}", content=f"check shard {k}: " + "x" * 200),
            AIMessage(id=f"{prefix}-a{k}", content=f"shard {k} lags {k}s " + "y" * 200),
        ]
    return messages


def prepared_job(rt, session: str, messages: list[BaseMessage]) -> str:
    """A compaction prepared on ``messages``, as the worker leaves it (its row ``prepared``,
    the thread's claim ``p:<job>``); its id."""
    job = uuid.uuid4().hex
    plan = plan_compaction(messages, rt.settings, early=True)
    assert not isinstance(plan, Skip), plan
    create_job(rt.engine, job, session, total_chars(messages), options=JobOptions().to_json())
    prepared = Prepared.from_plan(
        plan, job_id=job, summary_text="Shards 0-8 checked.", summarizer="t", model="m"
    )
    usage = {"input_tokens": 10, "output_tokens": 5, "latency_ms": 7}
    store_result(
        rt.engine, job, {"prepared": prepared.to_json(), "usage": usage}, JobStatus.PREPARED
    )
    assert rt.leases.set_from(session, None, Leases.after(job, State.PREPARED))
    return job


def back_after(rt, idle_s: float, settings=None) -> tuple[list, str, str, list]:
    """A thread whose last model call was ``idle_s`` ago, over its prepare floor, with a
    compaction prepared; one more run on it. Returns what each model call was sent, the
    session, the job, and the thread's messages before the run."""
    seen: list = []

    class Model(GenericFakeChatModel):
        def bind_tools(self, tools, **kwargs):
            return self

        def _generate(self, messages, *args, **kwargs):
            seen.append(list(messages))
            return super()._generate(messages, *args, **kwargs)

    settings = settings or rt.settings
    session = f"idle-{uuid.uuid4().hex[:8]}"
    config = {"configurable": {"thread_id": session}}
    agent = create_agent(
        Model(messages=iter([AIMessage(content="Shard 3 caught up.")])),
        [],
        middleware=[OffPathCompaction(settings, client=rt)],
        checkpointer=InMemorySaver(),
    )
    before = history(session)
    size = total_chars(before)
    assert settings.prepare_floor_chars < size < settings.summarization_threshold_chars
    # the state the thread's last run left: its last model call noted ``idle_s`` ago
    last = {"rate": {"t": time.time() - idle_s, "chars": size}}
    agent.update_state(config, {"messages": before, KEY: last}, as_node="model")
    job = prepared_job(rt, session, before)
    request = HumanMessage(id=f"{session}-back", content="back: is shard 3 still lagging?")
    agent.invoke({"messages": [request]}, config)
    return seen, session, job, before


def usage_rows(rt, job: str) -> int:
    with rt.engine.connect() as conn:
        query = sa.select(sa.func.count()).select_from(EVENTS).where(EVENTS.c.job_id == job)
        return conn.execute(query).scalar_one()


def test_a_run_back_after_the_idle_time_has_its_prepared_compaction_applied_first(rt):
    seen, session, job, before = back_after(rt, rt.settings.summarization_idle_apply_s + 5)
    (sent,) = seen
    assert is_summary(sent[0]), [m.type for m in sent[:3]]  # before the model saw the thread
    assert sent[-1].id == f"{session}-back"
    assert total_chars(sent) < total_chars([*before, sent[-1]])
    assert not pairing_problems(sent)
    assert job_row(rt.engine, job)["status"] == JobStatus.APPLIED
    assert usage_rows(rt, job) == 1
    removed = {m.id for m in before} - {m.id for m in sent}
    rows, _ = archive.read(rt.engine, session, limit=1_000)
    assert removed and removed <= {r["message_id"] for r in rows}
    assert rt.leases.holder(session).state is not State.PREPARED


@pytest.mark.parametrize("case", ["short pause", "idle apply off"])
def test_a_run_back_sooner_or_with_idle_apply_off_leaves_the_compaction_prepared(rt, case):
    idle_s = rt.settings.summarization_idle_apply_s
    if case == "short pause":
        seen, _, job, before = back_after(rt, idle_s - 5)
    else:
        off = rt.settings.model_copy(update={"summarization_idle_apply_s": 0.0})
        seen, _, job, before = back_after(rt, 86_400.0, off)
    (sent,) = seen
    assert not any(is_summary(m) for m in sent)
    assert [m.id for m in sent[:-1]] == [m.id for m in before]
    assert job_row(rt.engine, job)["status"] == JobStatus.PREPARED
    assert usage_rows(rt, job) == 0
