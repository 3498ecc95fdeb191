"""A delivery of a job hands its thread on once: a job that ends ``prepared`` swaps its running
lease for ``p:<job>`` in one compare-and-swap, and the task's ``let_go`` afterwards only
stops renewing it (a second swap with the same token would fail, silently). Run as
``compact_session`` runs a job: :meth:`Jobs.start`, :func:`run_job`, :meth:`Jobs.let_go`;
real Redis claims and SQLite tables and checkpoints, the worker's runtime."""

from __future__ import annotations

import uuid

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from sqlalchemy import event
from stack import small_runtime

from offpath.compaction.summarizers.offline import OfflineSummarizer
from offpath.stores.db.job_queries import job_row
from offpath.stores.db.transitions import create_job
from offpath.stores.leases.claims import Start, State
from offpath.worker.jobs import run_job


@pytest.fixture
def rt(tmp_path):
    with small_runtime("sqlite", tmp_path, "test-hand-on", worker=True) as runtime:
        yield runtime


def under_but_near(prefix: str) -> list:
    """A thread between the prepare point (0.8 x the 6,000-char threshold) and the threshold:
    the job plans and summarizes it, and prepares (nothing to apply yet)."""
    messages = []
    for k in range(12):
        messages += [
            HumanMessage(id=f"{prefix}-h{k}", content=f"check shard {k}: " + "x" * 200),
            AIMessage(id=f"{prefix}-a{k}", content=f"shard {k} lags {k}s " + "y" * 200),
        ]
    return messages


def test_a_prepared_job_hands_its_lease_on_once(rt):
    session, job = f"s-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    rt.patch(session, {"messages": under_but_near(session)})
    assert rt.leases.claim(session, job) is None
    create_job(rt.engine, job, session, 5_000)
    swaps = []
    real_finish = rt.leases.finish

    def finish(*args):
        done = real_finish(*args)
        swaps.append(done)
        return done

    rt.leases.finish = finish
    started = rt.jobs.start(session, job)
    assert started.start is Start.OK
    outcome = deliver(rt, session, job, started)
    assert str(outcome.status) == "prepared", job_row(rt.engine, job)
    assert swaps == [True]  # one hand-on, and it took
    holder = rt.leases.holder(session)
    assert holder is not None and holder.state is State.PREPARED and holder.job_id == job


def run(rt, session: str, job: str, *, lose_lease: bool = False):
    """One delivery of ``job`` as ``compact_session`` runs it; ``lose_lease``: the lease is
    lost once the job started (the check under the thread's lock finds it)."""
    assert rt.leases.claim(session, job) is None
    create_job(rt.engine, job, session, 5_000)
    started = rt.jobs.start(session, job)
    assert started.start is Start.OK
    if lose_lease:
        started.lease.lost.set()
    return deliver(rt, session, job, started)


def deliver(rt, session: str, job: str, started):
    """Run the delivery ``started`` (of :meth:`Jobs.start`) as ``compact_session`` does, then
    stop renewing its lease."""
    try:
        summarizer = OfflineSummarizer()
        return run_job(
            rt, summarizer, session, job, started.lease, started.stored, others=started.others
        )
    finally:
        rt.jobs.let_go(started.lease)


def test_a_job_writes_what_its_summary_bought_once_with_the_transition_that_ends_its_run(rt):
    """The prepared compaction and the summarizer's usage go to the job's row with the
    transition that ends the run, in its statement: never stored first and then again."""
    session, job = f"s-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    rt.patch(session, {"messages": under_but_near(session)})
    writes: list[str] = []
    event.listen(
        rt.engine,
        "before_cursor_execute",
        lambda _c, _cur, sql, *_: writes.append(sql) if "result=" in sql else None,
    )
    assert str(run(rt, session, job).status) == "prepared"
    assert len(writes) == 1 and "status=" in writes[0], writes
    row = job_row(rt.engine, job)
    assert row is not None and row["result"]["prepared"]["job_id"] == job
    assert set(row["result"]["usage"]) >= {"input_tokens", "output_tokens", "latency_ms"}


def test_a_job_that_lost_its_lease_before_the_patch_keeps_what_its_summary_bought(rt):
    session, job = f"s-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    rt.patch(session, {"messages": under_but_near(session)})
    assert str(run(rt, session, job, lose_lease=True).status) == "failed"
    row = job_row(rt.engine, job)
    assert row is not None and (row["status"], row["reason_code"]) == ("failed", "lease_lost")
    assert row["result"]["prepared"]["job_id"] == job and "usage" in row["result"]
    assert rt.leases.holder(session).state is State.BACKOFF  # handed on: the failure backoff


def test_an_applied_job_records_the_threads_new_size_on_its_session(rt):
    """The session list's size of the thread (``sessions.messages``, ``.chars``) is the
    patched thread's, written with the job's usage row."""
    import sqlalchemy as sa

    from offpath.compaction.accounting import total_chars
    from offpath.stores.checkpoints import read_thread
    from offpath.stores.tenants import SESSIONS, take_session

    session, job = f"s-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    take_session(rt.engine, session, "team")
    rt.patch(session, {"messages": under_but_near(session) + under_but_near(f"{session}-2")})
    assert str(run(rt, session, job).status) == "applied", job_row(rt.engine, job)
    after = read_thread(rt.checkpoints.saver, session).messages
    with rt.engine.connect() as conn:
        row = conn.execute(
            sa.select(SESSIONS.c.messages, SESSIONS.c.chars).where(SESSIONS.c.session_id == session)
        ).one()
    assert (row.messages, row.chars) == (len(after), total_chars(after))
