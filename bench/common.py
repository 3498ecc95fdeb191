"""What every benchmark shares: the stub LLM server, the result type, percentiles, the
environment, worker and API processes, broker purging and waits on the job rows.

Real Redis (db 14) and PostgreSQL (scratch databases), a local OpenAI-compatible stub
LLM with a set latency, real worker and API processes.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from stack import create_pg_database, drop_pg_database, free_port  # noqa: E402

__all__ = [
    "ROOT",
    "RUN_ID",
    "REDIS_URL",
    "Context",
    "Result",
    "StubServer",
    "api_key",
    "api_up",
    "applied",
    "base_env",
    "create_pg_database",
    "drop_pg_database",
    "finished",
    "free_port",
    "med",
    "pct",
    "purge_broker",
    "seed",
    "set_env",
    "start_api",
    "start_worker",
    "wait",
    "wait_for_log",
]

RUN_ID = uuid.uuid4().hex[:6]
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")


class StubServer:
    """The stub LLM (tests/stub_llm.py) in its own process, as a real LLM is on another host:
    its request parsing must not compete with the measured code for this process's GIL."""

    def __init__(self) -> None:
        import httpx

        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "stub_llm.py"), "--port", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10)
        wait(self._up, 30)

    def _up(self) -> bool:
        try:
            return self._http.get("/_requests").status_code == 200
        except Exception:
            return False

    def set_delay(self, seconds: float) -> None:
        self._http.post("/_control", json={"mode": "ok", "delay_s": seconds}).raise_for_status()
        self._http.delete("/_requests")  # the stub keeps every request: drop them between steps

    def control(self, **settings: Any) -> None:
        """Set the stub's behaviour (``POST /_control``: ``summary_chars``, ``mode``...)."""
        self._http.post("/_control", json=settings).raise_for_status()

    def requests(self) -> list[dict[str, Any]]:
        """The requests the stub answered since the last :meth:`set_delay` (their messages)."""
        return self._http.get("/_requests").json()

    def shutdown(self) -> None:
        self._http.close()
        self.proc.terminate()
        self.proc.wait(timeout=10)


@dataclass
class Context:
    """What a benchmark gets from the orchestrator: the stub LLM, the scratch database the
    environment points at (``DATABASE_URL``), and whether this is a quick (smoke) run. When
    only benchmarks that need neither run (``PURE`` in ``bench.__main__``), there is no stub
    (None) and no database (``""``)."""

    stub: StubServer | None
    pg_url: str
    quick: bool


@dataclass
class Result:
    """One benchmark's row of BENCHMARKS.md: ``met`` None means not judged."""

    name: str
    target: str
    measured: str
    met: bool | None
    details: list[str] = field(default_factory=list)
    limits: str = ""
    #: Markdown lines (a table) printed after the details, as they are.
    table: list[str] = field(default_factory=list)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def med(values: list[float]) -> float:
    return statistics.median(values)


def base_env(pg_url: str, queue: str, **extra: str) -> dict[str, str]:
    """Settings of a benchmark's processes: its database, Redis db 14, its own queue and
    key prefix."""
    return {
        "DATABASE_URL": pg_url,
        "REDIS_URL": REDIS_URL,
        "CELERY_QUEUE": queue,
        "REDIS_KEY_PREFIX": queue,
        "LOG_LEVEL": "WARNING",
        "WORKER_METRICS_PORT": "0",  # several workers at once: no port to share
        **extra,
    }


def set_env(env: dict[str, str]) -> None:
    """Settings are read from the environment: set it before the modules that read it load.
    A developer's ``.env`` is not read (as in the tests)."""
    for key in list(os.environ):
        if key.startswith(("SUMMARIZATION_", "OPENAI_")):
            del os.environ[key]
    os.environ["OFFPATH_ENV_FILE"] = ""
    os.environ.update(env)
    from offpath.config import get_settings

    get_settings.cache_clear()


def seed(rt: Any, session_id: str, messages: list[Any]) -> None:
    """Write ``messages`` as thread ``session_id`` (an imported turn, as ``/turns`` writes it)."""
    rt.patch(session_id, {"messages": messages})


def wait(pred: Callable[[], Any], timeout: float, interval: float = 0.1) -> None:
    """Return once ``pred()`` is true; RuntimeError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(interval)
    raise RuntimeError("timed out waiting")


def wait_for_log(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait until ``text`` appears in the log file ``path`` of ``proc`` (which must live)."""
    deadline = time.monotonic() + timeout
    while text not in path.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{path.name}: no {text!r} (exit {proc.poll()}):\n{tail}")
        time.sleep(0.1)


def start_worker(
    env: dict[str, str], name: str, out: Any, loglevel: str = "warning"
) -> subprocess.Popen[bytes]:
    """A Celery worker process of the project's app, named ``name``, with ``env`` (its pool
    and concurrency come from ``WORKER_POOL`` / ``WORKER_CONCURRENCY``)."""
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "offpath.worker.celery_app",
        "worker",
        "--without-mingle",
        "--without-gossip",
        "-l",
        loglevel,
        "-n",
        name,
    ]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def start_api(env: dict[str, str], port: int, out: Any) -> subprocess.Popen[bytes]:
    """The API (``uvicorn offpath.api.app:app``) on ``port``, with ``env``."""
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        "offpath.api.app:app",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def api_key(env: dict[str, str], tenant: str = "bench") -> str:
    """A new admin API key for the database of ``env`` (``offpath keys create``)."""
    result = subprocess.run(
        [sys.executable, "-m", "offpath.cli.main", "keys", "create", "--tenant", tenant, "--admin"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        raise RuntimeError(f"offpath keys create failed: {result.stderr[-2000:]}")
    return result.stdout.strip().splitlines()[-1]


def api_up(client: Any) -> bool:
    """The API answers ``/healthz`` (200, or 503 when a dependency is down)."""
    try:
        return client.get("/healthz").status_code in (200, 503)
    except Exception:
        return False


def purge_broker() -> None:
    """Empty the bench's Redis database: queued jobs no worker will take, job claims."""
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()


def _count(rt: Any, sids: list[str], statuses: tuple[str, ...]) -> int:
    import sqlalchemy as sa

    with rt.engine.connect() as conn:
        q = sa.text(
            "SELECT count(*) FROM compaction_jobs WHERE status = ANY(:st) AND session_id = ANY(:s)"
        )
        return int(conn.execute(q, {"st": list(statuses), "s": sids}).scalar())


def applied(rt: Any, sids: list[str]) -> int:
    """How many jobs of threads ``sids`` ended ``applied``."""
    return _count(rt, sids, ("applied",))


def finished(rt: Any, sids: list[str]) -> int:
    """How many jobs of threads ``sids`` are final."""
    return _count(rt, sids, ("applied", "skipped", "failed"))
