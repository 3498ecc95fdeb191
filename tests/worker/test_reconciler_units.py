"""The reconciler's pass (``worker/reconciler.py``) on a real Redis (claims) and a SQLite
usage database: a job requeued for a retry whose message never ran is re-published once
the retry is overdue, and left alone before."""

from __future__ import annotations

import uuid
from datetime import timedelta

import sqlalchemy as sa

from offpath.agent.graph import open_thread_writer
from offpath.config import load_settings
from offpath.stores.db.tables import JOBS, now_utc
from offpath.stores.db.transitions import create_job, start_job
from offpath.stores.leases.claims import State


def test_a_retry_whose_message_never_ran_is_republished_once_overdue(tmp_path):
    """A delivery that failed and requeued its job (claim ``q:<job>``, row ``running``); the
    retry's message is lost (its delivery failed on the database before it started, or the
    worker holding it died). The claim stays for the visibility timeout (an hour): the
    reconciler re-publishes the job once ``JOB_RETRY_BACKOFF_MAX_S + JOB_LEASE_S`` passed
    since the row last changed, not before."""
    from offpath.worker.reconciler import reconcile_once

    settings = load_settings(
        data_dir=str(tmp_path), redis_key_prefix=f"test-retry-{uuid.uuid4().hex[:8]}"
    )
    rt = open_thread_writer(settings)  # the worker's, as the reconciler runs in it
    sent: list[tuple] = []
    session, job = "inc-retry", uuid.uuid4().hex
    try:
        create_job(rt.engine, job, session, 100_000)
        assert rt.leases.claim(session, job) is None
        start_job(rt.engine, job, session)
        token = uuid.uuid4().hex[:12]
        rt.leases.start(session, job, token)
        assert rt.leases.requeue(session, job, token)  # the retry's message: never delivered

        def age(seconds: float) -> None:
            with rt.engine.begin() as conn:
                conn.execute(
                    sa.update(JOBS)
                    .where(JOBS.c.job_id == job)
                    .values(updated_at=now_utc() - timedelta(seconds=seconds))
                )

        bound = settings.job_retry_backoff_max_s + settings.job_lease_s
        age(bound - 5)  # quiet for a pass, the retry not overdue yet
        assert reconcile_once(rt, lambda *a: sent.append(a)) == {} and sent == []
        age(bound + 5)
        done = reconcile_once(rt, lambda *a: sent.append(a))
        assert done == {"republished": 1} and [(s, j) for s, j, _ in sent] == [(session, job)]
        holder = rt.leases.holder(session)
        assert holder is not None and (holder.state, holder.job_id) == (State.QUEUED, job)
        # the row changed: the next pass waits for the retry again
        assert reconcile_once(rt, lambda *a: sent.append(a)) == {} and len(sent) == 1
    finally:
        rt.close()
