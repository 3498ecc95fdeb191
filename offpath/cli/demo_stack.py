"""The processes ``offpath demo`` starts and the Redis it may use (:mod:`offpath.cli.demo`
runs the demo): a free port for the API, whether Redis answers, :class:`Processes` (the
worker and the API, each in its own process group, all stopped on exit), waiting for the
API's ``/healthz``, and removing the demo's queue and keys from the user's Redis."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import redis

from offpath.cli.common import CliError, cannot_listen
from offpath.coordination.broker import forget_queue

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    """Nothing listens on ``port`` of 127.0.0.1 (the demo's API may bind it)."""
    return cannot_listen("127.0.0.1", port) is None


def redis_answers(url: str) -> bool:
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
        client.ping()
        client.close()
        return True
    except (redis.RedisError, ValueError):
        return False


class Processes:
    """Child processes in their own process groups; all stopped on exit."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append((name, proc))
        return proc

    def check(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-1500:]
                raise CliError(
                    f"the {name} process exited ({proc.returncode}); its log ends:\n{tail}"
                )

    def stop(self) -> None:
        for _, proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for _, proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def forget_redis_keys(url: str, name: str) -> None:
    """Delete the demo's queue, kombu's bindings naming it or the demo worker (remote
    control), and the lock/claim keys from the user's Redis."""
    from kombu.exceptions import KombuError

    try:
        forget_queue(url, name, also_matching=[f"{name}@"])  # the worker is {name}@host
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)
        keys = [*client.scan_iter(f"{name}:*")]
        if keys:
            client.delete(*keys)
        client.close()
    except (redis.RedisError, KombuError, OSError):
        pass  # best effort: the keys are small and expire or are reused by nothing


def wait_healthy(client: httpx.Client, procs: Processes) -> None:
    """Wait up to 60 s for the API's ``/healthz`` to answer 200, checking that the demo's
    processes still run."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        procs.check()
        try:
            if client.get("/healthz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise CliError("the API did not become healthy within 60 s (see data/demo/logs)")
