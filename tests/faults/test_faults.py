"""Fault injection with real processes (issue 5). ``FAULT_N`` sets how often each fault is
injected (2 in CI; ``FAULT_N=20`` for a longer run, whose results ``make bench`` records).

After every fault: no message lost, each applied compaction recorded exactly once,
no thread with two summaries, and the thread either fully patched or untouched.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import uuid
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from shared import CASES, check_compacted, from_api, load, marked_summary, messages_of
from stack import PG_ADMIN, Stack, free_port, split_turns, start_redis, wait_for

pytestmark = pytest.mark.usefixtures("stub")

# fast redelivery: Redis hands an unacknowledged job to a new worker after 6 s
FAST = {
    "SUMMARIZATION_THRESHOLD_CHARS": "30000",
    "SUMMARIZATION_KEEP_CHARS": "10000",
    "CELERY_VISIBILITY_TIMEOUT_S": "6",
    "JOB_TIME_LIMIT_S": "5",
    "JOB_SOFT_TIME_LIMIT_S": "4",
    "LOCK_TIMEOUT_S": "3",
    "LOCK_WAIT_S": "5",
    "JOB_MAX_RETRIES": "3",
}
RESULTS = Path(os.environ.get("FAULT_RESULTS", "")) if os.environ.get("FAULT_RESULTS") else None


def record(name: str, runs: int, ok: int, note: str = "") -> None:
    """Append one line of results for BENCHMARKS.md (when FAULT_RESULTS names a file)."""
    if RESULTS:
        with RESULTS.open("a") as f:
            f.write(json.dumps({"fault": name, "runs": runs, "ok": ok, "note": note}) + "\n")


def case_doc() -> dict:
    return load(next(p for p in CASES if p.stem == "summary-first"))


def post_all(stack: Stack, session: str, doc: dict) -> None:
    for turn in split_turns(doc["messages"]):
        r = stack.post_turn(session, turn)
        assert r.status_code == 200, r.text


def usage_count(stack: Stack, session: str) -> int:
    engine = sa.create_engine(stack.db_url())
    with engine.connect() as conn:
        n = conn.execute(
            sa.text("SELECT count(*) FROM usage_events WHERE session_id = :s"), {"s": session}
        ).scalar()
    engine.dispose()
    return int(n)


def assert_consistent(stack: Stack, session: str, posted: list) -> bool:
    """Fully patched (one summary, invariants, one usage row per applied job) or untouched."""
    final = from_api(stack.messages(session))
    applied = [j for j in stack.jobs(session) if j["status"] == "applied"]
    if any(marked_summary(m) for m in final):
        check_compacted(posted, final)
        assert usage_count(stack, session) == len(applied) == 1, (
            usage_count(stack, session),
            applied,
        )
        return True
    assert final == posted, "a thread without a summary changed"
    assert usage_count(stack, session) == 0
    return False


@pytest.mark.parametrize("point", ["llm_call", "before_lock", "in_patch", "after_patch"])
def test_worker_killed_mid_job_loses_nothing(stacks, stub, fault_n, point):
    stack = stacks.get("postgres", **FAST)
    doc = case_doc()
    posted = messages_of(doc)
    ok = 0
    for _ in range(fault_n):
        session = f"kill-{point}-{uuid.uuid4().hex[:6]}"
        stack.kill_worker()
        if point == "llm_call":
            stub.state.delay_s = 2.0
            stack.start_worker()
            post_all(stack, session, doc)
            wait_for(
                lambda s=session: any(j["status"] == "running" for j in stack.jobs(s)), timeout=20
            )
            time.sleep(random.uniform(0.2, 1.5))  # somewhere inside the 2 s LLM call
        else:
            stack.start_worker(env={"OFFPATH_FAILPOINTS": point})
            post_all(stack, session, doc)
        wait_for(lambda: stack.worker.poll() is not None or point == "llm_call", timeout=30)
        if stack.worker.poll() is None:
            stack.kill_worker()
        stub.state.delay_s = 0.0
        stack.start_worker()  # the job is redelivered once the visibility timeout passes
        jobs = stack.settle(session, True, 0, timeout=90)
        assert [j["status"] for j in jobs] == ["applied"], jobs
        assert assert_consistent(stack, session, posted)
        ok += 1
    record(f"worker SIGKILL at {point}", fault_n, ok)


def test_broker_restart_while_turns_and_jobs_flow(stacks, stub, tmp_path, fault_n):
    port = free_port()

    def start_redis_here() -> subprocess.Popen:
        return start_redis(port, tmp_path, persist=True)

    redis_proc = start_redis_here()
    stack = stacks.get("sqlite", **{**FAST, "REDIS_URL": f"redis://127.0.0.1:{port}/0"})
    # as in production, the worker runs under `offpath worker`, which restarts it if it dies
    stack.kill_worker()
    stack.start_worker(supervised=True)
    doc = case_doc()
    turns = split_turns(doc["messages"])
    stub.state.delay_s = 1.0
    ok = 0
    try:
        for _ in range(fault_n):
            sessions = [f"brk-{uuid.uuid4().hex[:6]}" for _ in range(3)]
            for s in sessions[:2]:  # these queue jobs before the outage
                post_all(stack, s, doc)
            redis_proc.send_signal(signal.SIGTERM)
            redis_proc.wait(timeout=10)
            for turn in turns:  # turns during the outage: all answered, fast
                started = time.monotonic()
                assert stack.post_turn(sessions[2], turn).status_code == 200
                assert time.monotonic() - started < 1.5
            redis_proc = start_redis_here()
            # the next turn on each thread queues what the outage could not
            for s in sessions:
                assert (
                    stack.post_turn(
                        s,
                        [
                            {"type": "human", "content": "status?"},
                            {"type": "ai", "content": "checking"},
                        ],
                    ).status_code
                    == 200
                )
            for s in sessions:
                wait_for(
                    lambda s=s: any(j["status"] == "applied" for j in stack.jobs(s)),
                    timeout=90,
                    interval=0.3,
                )
                final = from_api(stack.messages(s))
                assert sum(marked_summary(m) for m in final) == 1
                extra = messages_of(
                    {
                        "messages": [
                            {"type": "human", "content": "status?"},
                            {"type": "ai", "content": "checking"},
                        ]
                    }
                )
                assert len(final) >= len(extra)
            ok += 1
    finally:
        redis_proc.kill()
    record("broker stopped and restarted", fault_n, ok)


def test_postgres_connections_dropped_mid_job(stacks, stub, fault_n):
    stack = stacks.get("postgres", **FAST)
    dbname = stack.pg_url.rsplit("/", 1)[1]
    doc = case_doc()
    posted = messages_of(doc)
    ok = patched = 0
    for _ in range(fault_n):
        session = f"pgdrop-{uuid.uuid4().hex[:6]}"
        stub.state.delay_s = 1.5
        post_all(stack, session, doc)
        wait_for(lambda s=session: any(j["status"] == "running" for j in stack.jobs(s)), timeout=20)
        time.sleep(random.uniform(0.1, 1.4))
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (dbname,),
            )
        stub.state.delay_s = 0.0
        jobs = stack.settle(session, True, 0, timeout=90)
        assert len(jobs) == 1 and jobs[0]["status"] in ("applied", "failed"), jobs
        patched += assert_consistent(stack, session, posted)
        ok += 1
    record(
        "PostgreSQL backends terminated mid-job",
        fault_n,
        ok,
        f"{patched} patched after retry, {ok - patched} untouched",
    )


@pytest.mark.parametrize("mode", ["429", "500", "timeout", "empty", "malformed"])
def test_llm_faults_bounded_retries_thread_untouched(stacks, stub, fault_n, mode):
    stack = stacks.get("sqlite", **{**FAST, "JOB_MAX_RETRIES": "1", "SUMMARIZATION_TIMEOUT_S": "2"})
    doc = case_doc()
    posted = messages_of(doc)
    ok = 0
    for _ in range(fault_n):
        session = f"llm-{mode}-{uuid.uuid4().hex[:6]}"
        stub.state.mode = mode
        post_all(stack, session, doc)
        jobs = stack.settle(session, True, 0, timeout=60)
        assert jobs and all(j["status"] == "failed" and j["attempts"] <= 2 for j in jobs), jobs
        assert not assert_consistent(stack, session, posted)
        final = stack.messages(session)
        assert not any(
            "error" in str(m.get("content", "")).lower() and "stub" in str(m.get("content", ""))
            for m in final
        )
        ok += 1
    stub.state.mode = "ok"
    record(f"LLM answers {mode}", fault_n, ok, "job failed after bounded retries, thread untouched")
