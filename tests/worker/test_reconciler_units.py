"""The reconciler's pass (``worker/reconciler.py``) on a real Redis (claims) and a SQLite
usage database: a job requeued for a retry whose message never ran is re-published once
the retry is overdue, and left alone before."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
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


@pytest.fixture
def queued(tmp_path):
    """A worker's runtime on its own Celery queue in the suite's Redis (the queue removed
    after), and a function that makes every job row quiet for a reconcile interval."""
    from stack import REDIS_URL

    from offpath.coordination.broker import forget_queue

    name = f"test-rec-{uuid.uuid4().hex[:8]}"
    settings = load_settings(
        data_dir=str(tmp_path), redis_url=REDIS_URL, celery_queue=name, redis_key_prefix=name
    )
    rt = open_thread_writer(settings)

    def quiet() -> None:
        with rt.engine.begin() as conn:
            conn.execute(
                sa.update(JOBS).values(
                    updated_at=now_utc() - timedelta(seconds=settings.reconcile_interval_s + 5)
                )
            )

    try:
        yield rt, quiet
    finally:
        rt.close()
        forget_queue(REDIS_URL, name)


def test_a_queued_job_whose_message_is_gone_is_republished_and_a_queued_message_left(queued):
    """Two published ``queued`` jobs holding their claims (``q:<job>``, kept for the visibility
    timeout). One's message was taken and acknowledged without the job starting (its
    delivery failed on the database before it marked the row running, and Celery acks a
    task that raised): it is in no queue and not unacknowledged, so nothing would ever run
    it. The reconciler re-publishes that one on its claim; the other's message still waits
    in the queue, and is left there. A message is found gone on two passes in a row before
    it is published again."""
    from kombu import Connection
    from stack import REDIS_URL

    from offpath.coordination.queue import publisher
    from offpath.worker.reconciler import reconcile_once

    rt, quiet = queued
    publish = publisher(rt.settings)
    sent: list[tuple] = []
    gone, waiting = ("inc-gone", uuid.uuid4().hex), ("inc-waiting", uuid.uuid4().hex)
    for session, job in (gone, waiting):
        create_job(rt.engine, job, session, 100_000)
        assert rt.leases.claim(session, job) is None
        publish(session, job, None)
    with Connection(REDIS_URL) as conn:
        consumer = conn.SimpleQueue(rt.settings.celery_queue)
        taken = consumer.get(timeout=5)
        assert taken.headers["id"] == gone[1]
        taken.ack()  # the delivery that raised before the job started
        consumer.close()
    quiet()
    # one pass marks it: a message a consumer is taking is in neither place for a moment
    assert reconcile_once(rt, lambda *a: sent.append(a)).get("republished", 0) == 0
    assert sent == []
    done = reconcile_once(rt, lambda *a: sent.append(a))
    assert done == {"republished": 1}
    assert [(s, j) for s, j, _ in sent] == [gone]
    for session, job in (gone, waiting):
        holder = rt.leases.holder(session)
        assert holder is not None and (holder.state, holder.job_id) == (State.QUEUED, job)


def test_a_message_a_consumer_is_taking_during_a_pass_is_not_published_again(queued):
    """A consumer pops a job's message from the queue's list, then writes it to kombu's
    unacknowledged hash: between the two a pass finds it nowhere. The next pass finds it
    held (here: back in the queue), so the job is never published a second time (a second
    message would be a second delivery, counted as a second attempt)."""
    import redis
    from stack import REDIS_URL

    from offpath.coordination.queue import publisher
    from offpath.worker.reconciler import reconcile_once

    rt, quiet = queued
    queue = rt.settings.celery_queue
    client = redis.Redis.from_url(REDIS_URL)
    sent: list[tuple] = []
    session, job = "inc-transit", uuid.uuid4().hex
    try:
        create_job(rt.engine, job, session, 100_000)
        assert rt.leases.claim(session, job) is None
        publisher(rt.settings)(session, job, None)
        quiet()
        raw = client.rpop(queue)  # taken, not yet in the unacknowledged hash
        assert raw is not None
        assert reconcile_once(rt, lambda *a: sent.append(a)).get("republished", 0) == 0
        client.rpush(queue, raw)  # held again by the next pass
        assert reconcile_once(rt, lambda *a: sent.append(a)).get("republished", 0) == 0
        assert sent == []
        client.rpop(queue)  # now gone for good: two passes in a row publish it once
        for _ in range(2):
            reconcile_once(rt, lambda *a: sent.append(a))
        assert [(s, j) for s, j, _ in sent] == [(session, job)]
    finally:
        client.close()


def test_a_duplicate_delivery_counts_no_attempt(tmp_path):
    """Two deliveries of one job (a message published again while the first was taken): the
    first runs it, the second finds it running and does nothing. ``attempts`` counts the
    deliveries that ran the job: 1, and 2 only when a second one runs it after the first
    one's lease lapsed."""
    from offpath.stores.db.job_queries import job_row

    settings = load_settings(
        data_dir=str(tmp_path), redis_key_prefix=f"test-dup-{uuid.uuid4().hex[:8]}"
    )
    rt = open_thread_writer(settings)
    session, job = "inc-dup", uuid.uuid4().hex
    try:
        create_job(rt.engine, job, session, 100_000)
        assert rt.leases.claim(session, job) is None
        first = rt.jobs.start(session, job)
        assert first.lease is not None
        second = rt.jobs.start(session, job)
        assert str(second.start) == "duplicate" and second.lease is None
        assert job_row(rt.engine, job)["attempts"] == 1
        rt.jobs.let_go(first.lease)
        rt.leases.store.swap(rt.leases.key(session), rt.leases.holder(session).raw, None, 0)
        third = rt.jobs.start(session, job)  # the lease lapsed: this delivery runs it again
        assert third.lease is not None and job_row(rt.engine, job)["attempts"] == 2
        rt.jobs.let_go(third.lease)
    finally:
        rt.close()
