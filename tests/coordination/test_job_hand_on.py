"""A delivery of a job hands its thread on once: a job that ends ``prepared`` swaps its running
lease for ``p:<job>`` in one compare-and-swap, and the task's ``let_go`` afterwards only
stops renewing it (a second swap with the same token would fail, silently). Run as
``compact_session`` runs a job: :meth:`Jobs.start`, :func:`run_job`, :meth:`Jobs.let_go`;
real Redis claims and SQLite tables and checkpoints, the worker's runtime."""

from __future__ import annotations

import uuid

import pytest
from langchain_core.messages import AIMessage, HumanMessage
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
    try:
        outcome = run_job(rt, OfflineSummarizer(), session, job, started.lease, started.stored)
    finally:
        rt.jobs.let_go(started.lease)
    assert str(outcome.status) == "prepared", job_row(rt.engine, job)
    assert swaps == [True]  # one hand-on, and it took
    holder = rt.leases.holder(session)
    assert holder is not None and holder.state is State.PREPARED and holder.job_id == job
