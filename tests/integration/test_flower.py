"""Flower on the Redis broker, started by the CLI with basic auth (issue 4): its HTTP API
lists the test worker and shows a finished compaction task with its outcome."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from shared import CASES, load
from stack import ROOT, free_port, split_turns, stop_group, wait_for

from offpath.coordination.broker import bindings, forget_queue

pytestmark = pytest.mark.usefixtures("stub")

#: Exchanges Flower binds queues of its own to: events, and replies to its inspect calls.
FLOWER_EXCHANGES = {"celeryev", "reply.celery.pidbox"}


@contextmanager
def running_flower(stack, basic_auth: str) -> Iterator[httpx.Client]:
    """``offpath flower`` on ``stack``'s broker with ``FLOWER_BASIC_AUTH=basic_auth``, once
    it answers ``/api/workers`` with that user and password (none when empty); stopped, and
    the queues it bound forgotten, on exit."""
    port = free_port()
    env = {**stack.env, "FLOWER_BASIC_AUTH": basic_auth, "FLOWER_PORT": str(port)}
    before = {b.member for b in bindings(stack.env["REDIS_URL"])}
    log = open(stack.tmp / f"flower-{port}.log", "wb")
    flower = subprocess.Popen(
        [sys.executable, "-m", "offpath.cli.main", "flower"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        user, _, password = basic_auth.partition(":")
        client = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            timeout=10,
            auth=(user, password) if basic_auth else None,
        )

        def up():
            try:
                return client.get("/api/workers").status_code == 200
            except httpx.TransportError:
                return False

        wait_for(
            up,
            timeout=30,
            interval=0.2,
            what=lambda: (stack.tmp / f"flower-{port}.log").read_text(),
        )
        yield client
    finally:
        stop_group(flower, timeout=10)
        log.close()
        # Flower's event receiver (celeryev.<uuid>) and remote-control reply queues stay
        # bound after it stops (issue 8, item 12)
        for b in bindings(stack.env["REDIS_URL"]):
            if b.member not in before and b.exchange in FLOWER_EXCHANGES:
                forget_queue(stack.env["REDIS_URL"], b.queue)


def test_flower_without_a_password_answers_on_127_0_0_1(stacks):
    """``FLOWER_BASIC_AUTH`` empty (as ``.env.example`` ships it): Flower, bound to
    127.0.0.1 only, answers without a password as the CLI's warning says, instead of a 401
    to every request (Flower takes a set but empty variable for basic auth on)."""
    stack = stacks.get("sqlite")
    with running_flower(stack, "") as client:
        assert client.get("/api/workers").status_code == 200
        assert client.get("/").status_code == 200


def test_flower_lists_the_worker_and_a_finished_compaction(stacks, stub):
    stack = stacks.get(
        "sqlite", SUMMARIZATION_THRESHOLD_CHARS="30000", SUMMARIZATION_KEEP_CHARS="10000"
    )
    with running_flower(stack, "ops:s3cret") as client:
        auth = ("ops", "s3cret")
        assert httpx.get(client.base_url.join("/api/workers"), timeout=10).status_code == 401, (
            "basic auth is not enforced"
        )
        workers = wait_for(
            lambda: client.get("/api/workers", params={"refresh": 1}, auth=auth).json(),
            timeout=20,
            interval=0.5,
        )
        assert any(name.startswith(f"w-{stack.name}") for name in workers), workers

        # the whole conversation at once (35k chars, over the 30k threshold): its job applies
        # the compaction itself. Posted turn by turn, a job queued past the prepare point
        # could run before the crossing turn came and end `prepared` (the hook applies it)
        session = f"flower-{uuid.uuid4().hex[:8]}"
        whole = load(next(p for p in CASES if p.stem == "summary-first"))["messages"]
        assert stack.post_turn(session, whole).status_code == 200
        jobs = stack.settle(session, True, 0)
        job_id = jobs[0]["job_id"]

        def task(job, state):
            r = client.get(f"/api/task/info/{job}", auth=auth)
            return r.json() if r.status_code == 200 and r.json().get("state") == state else None

        info = wait_for(lambda: task(job_id, "SUCCESS"), timeout=20, interval=0.3)
        assert info["name"] == "compact_session"
        assert "applied" in str(info["result"])
        assert info["args"] and session in str(info["args"])

        # a job that ends failed is a failed task for Celery and Flower (issue 8, item 6)
        failing = f"flower-fail-{uuid.uuid4().hex[:8]}"
        stub.state.mode = "empty"  # fails at once, no retry
        for turn in split_turns(
            load(next(p for p in CASES if p.stem == "summary-first"))["messages"]
        ):
            assert stack.post_turn(failing, turn).status_code == 200
        (failed,) = stack.settle(failing, True, 0)[:1]
        assert failed["status"] == "failed"
        info = wait_for(lambda: task(failed["job_id"], "FAILURE"), timeout=20, interval=0.3)
        assert "JobFailed" in str(info.get("exception")), info
