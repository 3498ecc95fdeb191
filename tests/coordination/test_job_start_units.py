"""A job's start (:meth:`offpath.coordination.jobs.Jobs.start`) on a real Redis (claims) and
a SQLite usage database: it learns, in the statement that marks it running, whether its
thread has another open job; :meth:`Jobs.supersede_others` then ends those (dead: this job
holds the thread's claim); a start that found none says so (the job then ends none)."""

from __future__ import annotations

import uuid

from sqlalchemy import event

from offpath.agent.graph import open_thread_writer
from offpath.config import load_settings
from offpath.stores.db.job_queries import job_row
from offpath.stores.db.transitions import create_job, start_job
from offpath.stores.leases.claims import Start


def test_a_started_job_learns_whether_its_thread_has_dead_jobs_and_ends_them(tmp_path):
    settings = load_settings(
        data_dir=str(tmp_path), redis_key_prefix=f"test-start-{uuid.uuid4().hex[:8]}"
    )
    rt = open_thread_writer(settings)
    statements: list[str] = []
    event.listen(rt.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    try:
        # a thread whose earlier job died running (its lease lapsed): the new job ends it
        dead, job = uuid.uuid4().hex, uuid.uuid4().hex
        create_job(rt.engine, dead, "crowded", 100_000)
        start_job(rt.engine, dead, "crowded")
        create_job(rt.engine, job, "crowded", 100_000)
        assert rt.leases.claim("crowded", job) is None
        started = rt.jobs.start("crowded", job)
        assert started.start is Start.OK and started.lease is not None and started.others
        assert rt.jobs.supersede_others("crowded", job) == 1
        assert (job_row(rt.engine, dead) or {})["reason_code"] == "lease_lapsed"
        rt.jobs.let_go(started.lease)

        # a thread with no other job: the start says so, in the one statement that marks the
        # job running (no statement of its own asks)
        alone = uuid.uuid4().hex
        create_job(rt.engine, alone, "alone", 100_000)
        assert rt.leases.claim("alone", alone) is None
        statements.clear()
        started = rt.jobs.start("alone", alone)
        assert started.start is Start.OK and started.lease is not None
        assert started.others is False
        assert len([q for q in statements if "compaction_jobs" in q]) == 1, statements
        rt.jobs.let_go(started.lease)
    finally:
        rt.close()
