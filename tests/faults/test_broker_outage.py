"""A broker outage with real processes: the broker is a ``redis-server`` of the test's own, killed
and started again (empty) a few seconds later, once while the worker is idle and once while it
holds a job. The worker process rides it out: it is the same process afterwards, its log has
no unrecoverable error, and it runs the next job."""

from __future__ import annotations

import re
import time
import uuid

import pytest
from shared import CASES, load
from stack import free_port, split_turns, start_redis, wait_for

pytestmark = pytest.mark.usefixtures("stub")

#: How long the broker stays down (seconds): longer than the worker's first reconnect attempts.
DOWN_S = 4
FAST = {
    "SUMMARIZATION_THRESHOLD_CHARS": "30000",
    "SUMMARIZATION_KEEP_CHARS": "10000",
    "JOB_LEASE_S": "3",
    "RECONCILE_INTERVAL_S": "2",
    "LOCK_TIMEOUT_S": "3",
    "LOCK_WAIT_S": "5",
    "JOB_MAX_RETRIES": "3",
    "SUMMARIZATION_TIMEOUT_S": "10",
}


def post_all(stack, session: str) -> None:
    doc = load(next(p for p in CASES if p.stem == "summary-first"))
    for turn in split_turns(doc["messages"]):
        r = stack.post_turn(session, turn)
        assert r.status_code == 200, r.text


def applied(stack, session: str) -> bool:
    return any(j["status"] == "applied" for j in stack.jobs(session))


def deliveries_ended(log: str) -> bool:
    """Every ``compact_session`` delivery the worker's log shows received has ended (succeeded,
    raised, failed, or rejected: one whose start found the lease store away and whose retry
    could not be sent either; the reconciler publishes its job again): a delivery taken
    before the outage acks through the lost connection."""
    received = re.findall(r"compact_session\[(\w+)\] received", log)
    ended = re.findall(r"compact_session\[(\w+)\] (?:succeeded|raised|failed|reject)", log)
    return all(received.count(t) <= ended.count(t) for t in set(received))


@pytest.mark.parametrize("holding", [False, True], ids=["idle", "holding-a-job"])
def test_the_worker_rides_out_a_broker_outage_and_runs_the_next_job(
    stacks, stub, tmp_path, holding
):
    port = free_port()
    broker = start_redis(port, tmp_path)  # the broker, locks and leases
    stack = stacks.get("sqlite", **FAST, REDIS_URL=f"redis://127.0.0.1:{port}/0")
    worker = stack.worker
    assert worker is not None
    offset = stack.worker_log.stat().st_size
    try:
        if holding:
            stub.state.delay_s = DOWN_S + 2.0  # the summarizer call outlasts the outage
            session = f"outage-held-{uuid.uuid4().hex[:6]}"
            post_all(stack, session)
            wait_for(lambda: any(j["status"] == "running" for j in stack.jobs(session)), timeout=30)
        broker.kill()
        broker.wait(timeout=10)
        time.sleep(DOWN_S)
        broker = start_redis(port, tmp_path)
        stub.state.delay_s = 0.0
        # the worker notices the loss on its next read, reconnects and consumes again
        wait_for(
            lambda: (
                "Connected to redis://" in stack.worker_log.read_text()[offset:]
                or worker.poll() is not None
            ),
            timeout=60,
            interval=0.2,
        )
        log = stack.worker_log.read_text(errors="replace")[offset:]
        assert worker.poll() is None, f"the worker exited ({worker.returncode}):\n{log[-4000:]}"
        assert "Unrecoverable error" not in log, log[-4000:]
        if holding:
            # the job held through the outage ends (re-published by the reconciler if lost)
            wait_for(lambda: applied(stack, session), timeout=90, interval=0.3)
        fresh = f"outage-after-{uuid.uuid4().hex[:6]}"
        post_all(stack, fresh)
        wait_for(lambda: applied(stack, fresh), timeout=60, interval=0.3)
        wait_for(
            lambda: deliveries_ended(stack.worker_log.read_text(errors="replace")[offset:]),
            timeout=60,
            interval=0.3,
        )
        log = stack.worker_log.read_text(errors="replace")[offset:]
        assert stack.worker is worker and worker.poll() is None, log[-4000:]
        assert "Unrecoverable error" not in log, log[-4000:]
        # no traceback ends in an AttributeError (the close or a late ack on the lost link)
        assert not re.search(r"^AttributeError", log, re.MULTILINE), log[-4000:]
    finally:
        broker.kill()
        broker.wait(timeout=10)
        stacks.discard(stack)
