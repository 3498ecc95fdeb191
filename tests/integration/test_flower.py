"""Flower on the Redis broker, started by the CLI with basic auth (issue 4): its HTTP API
lists the test worker and shows a finished compaction task with its outcome."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import httpx
import pytest
from shared import CASES, load
from stack import ROOT, free_port, split_turns, wait_for

pytestmark = pytest.mark.usefixtures("stub")


def test_flower_lists_the_worker_and_a_finished_compaction(stacks):
    stack = stacks.get(
        "sqlite", SUMMARIZATION_THRESHOLD_CHARS="30000", SUMMARIZATION_KEEP_CHARS="10000"
    )
    port = free_port()
    env = {**stack.env, "FLOWER_BASIC_AUTH": "ops:s3cret", "FLOWER_PORT": str(port)}
    log = open(stack.tmp / f"flower-{port}.log", "wb")
    flower = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "flower"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        auth = ("ops", "s3cret")
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)

        def up():
            try:
                return client.get("/api/workers", auth=auth).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(up, timeout=30, interval=0.2)
        assert client.get("/api/workers").status_code == 401, "basic auth is not enforced"
        workers = wait_for(
            lambda: client.get("/api/workers", params={"refresh": 1}, auth=auth).json(),
            timeout=20,
            interval=0.5,
        )
        assert any(name.startswith(f"w-{stack.name}") for name in workers), workers

        session = f"flower-{uuid.uuid4().hex[:8]}"
        for turn in split_turns(
            load(next(p for p in CASES if p.stem == "summary-first"))["messages"]
        ):
            assert stack.post_turn(session, turn).status_code == 200
        jobs = stack.settle(session, True, 0)
        job_id = jobs[0]["job_id"]

        def task():
            r = client.get(f"/api/task/info/{job_id}", auth=auth)
            return r.json() if r.status_code == 200 and r.json().get("state") == "SUCCESS" else None

        info = wait_for(task, timeout=20, interval=0.3)
        assert info["name"] == "compact_session"
        assert "applied" in str(info["result"])
        assert info["args"] and session in str(info["args"])
    finally:
        os.killpg(flower.pid, signal.SIGTERM)
        try:
            flower.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(flower.pid, signal.SIGKILL)
        log.close()
        time.sleep(0)
