"""One apply contract, run on both writers of a compaction (DESIGN.md invariant 21), as
LangGraph's checkpoint conformance suite runs one set of checks on every saver: the worker's
and the post-turn hook's :class:`~offpath.coordination.writers.CheckpointWriter` (patches the
checkpoint of offpath's own thread) and the middleware's
:class:`~offpath.coordination.writers.StateUpdateWriter` (returns the run's state update,
which the run then applies and records). Both go through
:meth:`offpath.coordination.jobs.Jobs.apply`, on the real stores: the checkpointer and the
usage tables on SQLite and PostgreSQL, claims on Redis.

The contract: nothing is lost (every message the patch removes or shortens is archived as
it was), the summary comes first (right after the system prompt), no tool call is left
without its result, an apply of a compaction that landed already changes nothing, a stale
one is refused (the job ends ``skipped: stale``, the thread as it was), and the usage event
is recorded once. The thread's claim ends ``d:<job>`` (applied) or free (stale)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pytest
import sqlalchemy as sa
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_from_dict,
    messages_to_dict,
)
from langgraph.graph.message import add_messages
from stack import small_runtime

from offpath.compaction.accounting import total_chars
from offpath.compaction.pairing import new_unpaired
from offpath.compaction.patch import Fitted, Prepared, Stale
from offpath.compaction.planner import Skip, plan_compaction
from offpath.compaction.summary import is_summary
from offpath.coordination.jobs import JobOptions, Landed
from offpath.coordination.runtime import Runtime
from offpath.coordination.writers import CheckpointWriter, StateUpdate, StateUpdateWriter
from offpath.stores import archive
from offpath.stores.checkpoints import read_thread
from offpath.stores.db.job_queries import job_row
from offpath.stores.db.tables import EVENTS, JOBS, JobStatus
from offpath.stores.db.transitions import create_job, store_result
from offpath.stores.leases.claims import Leases, State


@pytest.fixture(params=["sqlite", "postgres"])
def rt(request, tmp_path):
    with small_runtime(request.param, tmp_path, "test-writers", worker=True) as runtime:
        yield runtime


def turn(k: int) -> list[BaseMessage]:
    """One turn: a question, a call, its result (with facts), an answer."""
    call = {"id": f"c{k}", "name": "kubectl", "args": {"cmd": f"logs ledger-db-shard-{k}"}}
    return [
        HumanMessage(id=f"h{k}", content=f"check shard {k} (ticket OPS-{900 + k})"),
        AIMessage(id=f"a{k}", content="", tool_calls=[call]),
        ToolMessage(
            id=f"t{k}",
            tool_call_id=f"c{k}",
            content=f"ledger-db-shard-{k}: lag {k * 10}s\n" + "ok\n" * 600,
        ),
        AIMessage(id=f"r{k}", content=f"Shard {k} lags {k * 10}s."),
    ]


THREAD = [SystemMessage(id="sys", content="You are an SRE agent."), *turn(0), *turn(1)]
THREAD += [*turn(2), *turn(3), *turn(4)]


class CheckpointThread:
    """offpath's own thread: in its checkpointer, written by :class:`CheckpointWriter` under
    the thread's lock (as the worker and the post-turn hook write it)."""

    def __init__(self, rt: Runtime, session: str, messages: Sequence[BaseMessage]) -> None:
        self.rt, self.session = rt, session
        rt.patch(session, {"messages": list(messages)})

    def messages(self) -> list[BaseMessage]:
        return read_thread(self.rt.checkpoints.saver, self.session).messages

    def replace(self, message: BaseMessage) -> None:
        self.rt.patch(self.session, {"messages": [message]})

    def apply(self, job: str) -> object:
        with self.rt.locks.patch(self.session):
            thread = read_thread(self.rt.checkpoints.saver, self.session)
            result = job_row(self.rt.engine, job)["result"]
            return self.rt.jobs.apply(
                CheckpointWriter(self.rt, thread.base),
                self.session,
                job,
                result,
                thread.messages,
                force=False,
                outside=0,
                settings=self.rt.settings,
            )


class StateUpdateThread:
    """A run's state (a user's own agent's, whose checkpoint offpath never writes): the
    :class:`StateUpdateWriter`'s update applied as the run applies it, then recorded as the
    middleware records it once the summary is in the state."""

    def __init__(self, rt: Runtime, session: str, messages: Sequence[BaseMessage]) -> None:
        self.rt, self.session = rt, session
        self.state = list(messages)

    def messages(self) -> list[BaseMessage]:
        return list(self.state)

    def replace(self, message: BaseMessage) -> None:
        self.state = add_messages(self.state, [message])

    def apply(self, job: str) -> object:
        result = job_row(self.rt.engine, job)["result"]
        done = self.rt.jobs.apply(
            StateUpdateWriter(),
            self.session,
            job,
            result,
            self.state,
            force=False,
            outside=0,
            settings=self.rt.settings,
        )
        if isinstance(done, StateUpdate):
            self.state = add_messages(self.state, done.fitted.patch)
            self.rt.jobs.record(self.session, job, holding=State.PREPARED)
            return done.fitted
        return done


@pytest.fixture(params=[CheckpointThread, StateUpdateThread], ids=["checkpoint", "state_update"])
def thread(request, rt):
    return request.param(rt, f"s-{uuid.uuid4().hex[:8]}", THREAD)


def prepared_job(rt: Runtime, session: str, messages: Sequence[BaseMessage]) -> str:
    """A job with a compaction prepared on ``messages`` (as the worker leaves it: its row
    ``prepared``, the thread's claim ``p:<job>``); its id."""
    job = uuid.uuid4().hex
    plan = plan_compaction(messages, rt.settings, force=True)
    assert not isinstance(plan, Skip), plan
    create_job(rt.engine, job, session, total_chars(messages), options=JobOptions().to_json())
    prepared = Prepared.from_plan(
        plan,
        job_id=job,
        summary_text="Shards 0-2 checked; OPS-900 open.",
        summarizer="t",
        model="m",
    )
    usage = {"input_tokens": 10, "output_tokens": 5, "latency_ms": 7}
    stored = {"prepared": prepared.to_json(), "usage": usage}
    store_result(rt.engine, job, stored, JobStatus.PREPARED)
    assert rt.leases.set_from(session, None, Leases.after(job, State.PREPARED))
    return job


def usage_events(rt: Runtime, job: str) -> int:
    with rt.engine.connect() as conn:
        query = sa.select(sa.func.count()).select_from(EVENTS).where(EVENTS.c.job_id == job)
        return conn.execute(query).scalar_one()


def test_an_apply_loses_nothing_puts_the_summary_first_and_orphans_no_call(rt, thread):
    before = thread.messages()
    job = prepared_job(rt, thread.session, before)
    fitted = thread.apply(job)
    assert isinstance(fitted, Fitted), fitted
    after = thread.messages()
    assert after[0].id == "sys"
    assert is_summary(after[1]) and after[1].id == fitted.summary.id
    assert total_chars(after) < total_chars(before)
    assert not new_unpaired(before, after)
    # nothing lost: every original that is not in the thread as it was is archived as it was
    archived = {
        r["message_id"]: r["message"] for r in archive.job_rows(rt.engine, thread.session, job)
    }
    now = {m.id: messages_to_dict([m])[0] for m in after}
    for m in before:
        original = messages_to_dict([m])[0]
        if now.get(m.id) != original:
            assert archived.get(m.id) == original, m.id
            (back,) = messages_from_dict([archived[m.id]])
            assert back.content == m.content
    assert job_row(rt.engine, job)["status"] == JobStatus.APPLIED
    assert rt.leases.holder(thread.session).raw == f"d:{job}"
    assert usage_events(rt, job) == 1


def test_an_apply_of_a_compaction_that_landed_changes_nothing_and_records_once(rt, thread):
    job = prepared_job(rt, thread.session, thread.messages())
    assert isinstance(thread.apply(job), Fitted)
    once = messages_to_dict(thread.messages())
    # the job row prepared again, as a redelivery or a crashed run's successor finds it
    with rt.engine.begin() as conn:
        conn.execute(
            sa.update(JOBS).where(JOBS.c.job_id == job).values(status=JobStatus.PREPARED.value)
        )
    assert rt.leases.set_from(
        thread.session, rt.leases.holder(thread.session), Leases.after(job, State.PREPARED)
    )
    again = thread.apply(job)
    assert isinstance(again, Landed), again
    assert messages_to_dict(thread.messages()) == once
    assert usage_events(rt, job) == 1
    assert rt.leases.holder(thread.session).raw == f"d:{job}"


def test_a_stale_compaction_is_refused_and_leaves_the_thread_as_it_is(rt, thread):
    job = prepared_job(rt, thread.session, thread.messages())
    thread.replace(AIMessage(id="r0", content="Shard 0 lags 10s; rechecked, 0s now."))
    before = messages_to_dict(thread.messages())
    stale = thread.apply(job)
    assert isinstance(stale, Stale), stale
    assert messages_to_dict(thread.messages()) == before
    row = job_row(rt.engine, job)
    assert (row["status"], row["reason_code"]) == (JobStatus.SKIPPED, "stale")
    assert rt.leases.holder(thread.session) is None
    assert usage_events(rt, job) == 0
    assert archive.job_rows(rt.engine, thread.session, job) == []


def test_a_late_apply_lists_what_a_message_shortened_since_the_plan_said(rt, thread):
    """The thread grew after the plan, and a model call over the threshold shortened the
    agent's newer answers in place (originals archived): the apply takes them too, and its
    summary lists what they said, read from the archive, not from the 200-char stubs."""
    from offpath.compaction.facts.sections import SINCE_HEADING
    from offpath.compaction.shorten import MIN_OLDER_CHARS, shorten

    job = prepared_job(rt, thread.session, thread.messages())
    said: dict[str, str] = {}
    for k in range(5, 9):
        *rest, answer = turn(k)
        original = AIMessage(
            id=answer.id,
            content=f"Shard {k} checked.\n{'z' * 1_200}\nThe pool `ledger_pool_{k}` is exhausted.",
        )
        short = shorten(original, MIN_OLDER_CHARS, floor=MIN_OLDER_CHARS)
        assert f"ledger_pool_{k}" not in str(short.content)
        archive.store_shortened(rt.engine, thread.session, [(len(THREAD) + 4 * k, original)])
        said[answer.id] = f"ledger_pool_{k}"
        for m in (*rest, short):
            thread.replace(m)
    fitted = thread.apply(job)
    assert isinstance(fitted, Fitted), fitted
    assert fitted.record["since_summary"] > 0
    moved = [i for i in fitted.removed if i in said]
    assert moved, fitted.removed
    summary = str(fitted.summary.content)
    since = summary[summary.index(SINCE_HEADING) :]
    assert all(said[i] in since for i in moved), since
