"""Readiness of two deployments on one broker (issue 34, item 6): their workers, each started
by ``offpath worker`` at its default node name, are told apart when ``/readyz`` asks the
broker which workers consume each queue. Real worker processes on the tests' Redis."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import uuid
from pathlib import Path

from stack import BIN, REDIS_URL, ROOT, forget_broker_queue, wait_for

from offpath.config import load_settings
from offpath.coordination.consumers import celery_asker, readiness


def start_worker(tmp_path: Path, queue: str) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """``offpath worker`` for ``queue`` with no ``--name``, as an operator starts it."""
    env = {
        **os.environ,
        "DATA_DIR": str(tmp_path / queue),
        "REDIS_URL": REDIS_URL,
        "CELERY_QUEUE": queue,
        "WORKER_METRICS_PORT": "0",
        "WORKER_CONCURRENCY": "2",
    }
    log = open(tmp_path / f"{queue}.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [str(BIN / "offpath"), "worker", "--processes", "1", "--no-restart"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, env


def test_two_deployments_on_one_broker_each_see_their_own_worker(tmp_path):
    """Both deployments' workers were ``celery@<host>``: they shared one remote-control
    mailbox, so each broadcast reached one of them, and ``/readyz`` of the other deployment
    answered 503 ("no worker consumes queue ..."). The default name is now the queue's:
    asked several times, each deployment hears its own worker, and only it."""
    queues = [f"test-ready-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    workers = [start_worker(tmp_path, q) for q in queues]
    host = socket.gethostname()
    try:
        for queue, (proc, _) in zip(queues, workers, strict=True):
            log = tmp_path / f"{queue}.log"
            wait_for(lambda log=log: "ready." in log.read_text(errors="replace"), timeout=120)
            assert proc.poll() is None, log.read_text()
        for queue, (_, env) in zip(queues, workers, strict=True):
            settings = load_settings(
                redis_url=env["REDIS_URL"], celery_queue=queue, data_dir=env["DATA_DIR"]
            )
            # a reply given time on a loaded host: what is asked is whose reply comes, not how fast
            ask = celery_asker(settings, timeout_s=2.5)
            for _ in range(4):  # a shared mailbox answered for one worker or the other
                ok, found, message = readiness(ask(), [queue], settings.broker_url)
                assert ok, message
                assert found[queue]["workers"] == [f"{queue}@{host}"], found
    finally:
        for proc, env in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
            forget_broker_queue(env, worker_names=[env["CELERY_QUEUE"]])
