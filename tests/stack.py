"""Real processes for integration tests: a Celery worker and the API (uvicorn), on the
machine's Redis and PostgreSQL or on SQLite, with a private queue and key prefix each.

A :class:`Stack` is one configuration of both processes; tests talk to it over HTTP.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

from offpath.compaction import formats

ROOT = Path(__file__).resolve().parents[1]
#: How long a test waits for a worker process to say it is ready (seconds).
WORKER_START_S = 120
BIN = Path(sys.executable).parent
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
PG_ADMIN = os.environ.get("TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


class PortTaken(RuntimeError):
    """A stack's API could not bind its port: another process took it first."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def create_pg_database(prefix: str = "offpath_test") -> str:
    """A fresh PostgreSQL database; returns its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return PG_ADMIN.rsplit("/", 1)[0] + "/" + name


def forget_broker_queue(env: dict[str, str], worker_names: Iterable[str] = ()) -> None:
    """Remove the queue ``env`` names, and kombu's bindings naming it or the workers, from
    the broker (:func:`offpath.coordination.broker.forget_queue`); a broker that is gone (a private
    redis-server stopped) took them with it."""
    import redis
    from kombu.exceptions import KombuError

    from offpath.coordination.broker import forget_queue

    try:
        forget_queue(
            env.get("CELERY_BROKER_URL") or env["REDIS_URL"],
            env["CELERY_QUEUE"],
            also_matching=worker_names,
        )
    except (redis.RedisError, KombuError, OSError):
        pass


def drop_pg_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def split_turns(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Transcript dicts cut into turns by :func:`compaction.formats.split_turns`, kept as the
    original dicts so that replays post the shared files' messages unchanged."""
    sizes = [len(t) for t in formats.split_turns(formats.to_messages(messages))]
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    return [messages[a : a + n] for a, n in zip(starts, sizes, strict=True)]


def start_redis(port: int, folder: Path, *, persist: bool = False) -> subprocess.Popen[bytes]:
    """A private redis-server on ``port`` (never the machine's own), answering when returned;
    ``persist``: append-only file in ``folder``, so queued jobs survive a restart."""
    import redis

    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed; .ci/run needs it")
    aof = "yes" if persist else "no"
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            aof,
            "--dir",
            str(folder),
        ],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)

    def pings() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    wait_for(pings, timeout=10)
    client.close()
    return proc


class Stack:
    """A worker and an API process sharing one configuration (env)."""

    def __init__(self, backend: str, tmp: Path, env: dict[str, str], beat: bool = True) -> None:
        self.backend = backend
        self.tmp = tmp
        self.name = uuid.uuid4().hex[:8]
        self.port = free_port()
        self.pg_url = create_pg_database() if backend == "postgres" else None
        base = {
            k: v for k, v in os.environ.items() if not k.startswith(("SUMMARIZATION_", "OPENAI_"))
        }
        self.env = {
            **base,
            "DATA_DIR": str(tmp / f"data-{self.name}"),
            "DATABASE_URL": self.pg_url or "",
            "REDIS_URL": REDIS_URL,
            "CELERY_QUEUE": f"test-{self.name}",
            "REDIS_KEY_PREFIX": f"test-{self.name}",
            "WORKER_CONCURRENCY": "8",
            "JOB_RETRY_BACKOFF_S": "1",
            "JOB_RETRY_BACKOFF_MAX_S": "2",
            "JOB_MAX_RETRIES": "1",
            "SUMMARIZATION_MAX_RETRIES": "0",
            "SUMMARIZATION_TIMEOUT_S": "3",
            "LOG_LEVEL": "INFO",
            "WORKER_METRICS_PORT": "0",  # a test that scrapes a worker gives it a free port
            **env,
        }
        self.worker_log = tmp / f"worker-{self.name}.log"
        self.api_log = tmp / f"api-{self.name}.log"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.clients: list[Any] = []
        self.worker: subprocess.Popen[bytes] | None = None
        self.beat_log = tmp / f"beat-{self.name}.log"
        self.http: httpx.Client | None = None
        try:
            self._start(beat)
        except BaseException:  # a stack that failed to start leaves no process behind
            self.stop()
            raise

    def _start(self, beat: bool) -> None:
        # the worker, beat and the API boot side by side (their imports are most of a
        # stack's start on a 2-core host); the worker is waited for once the API answers
        offset = self.start_worker(wait=False)
        # the reconciler's schedule, as in production: its own process (`offpath beat`)
        if beat:
            self._spawn([sys.executable, "-m", "offpath.cli.main", "beat"], self.beat_log)
        for attempt in range(3):
            self.api = self._spawn(
                [
                    str(BIN / "uvicorn"),
                    "offpath.api.app:app",
                    "--port",
                    str(self.port),
                    "--log-level",
                    "warning",
                ],
                self.api_log,
            )
            self.url = f"http://127.0.0.1:{self.port}"
            self.http = httpx.Client(base_url=self.url, timeout=30)
            try:
                self._wait_ready()
                break
            except PortTaken:  # another process took the free port first: another port
                self.http.close()
                self.port = free_port()
                if attempt == 2:
                    raise
        self._wait_worker(offset)
        # an admin key, as an operator would make one; every request of the tests sends it
        self.key = self.create_key("test", admin=True)
        self.http.headers["Authorization"] = f"Bearer {self.key}"

    def create_key(self, tenant: str, admin: bool = False) -> str:
        """A new API key for this stack's database, made in this process by what
        `offpath keys create` calls (the API has migrated the database by the time it
        answers); the command itself runs in test_compose.py."""
        from offpath.stores.db.engine import make_engine
        from offpath.stores.tenants import create_key

        engine = make_engine(self.settings())
        try:
            return create_key(engine, tenant, admin=admin)
        finally:
            engine.dispose()

    # --- processes ------------------------------------------------------------------------

    def _spawn(
        self, cmd: list[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        out = open(log, "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def start_worker(
        self, env: dict[str, str] | None = None, supervised: bool = False, wait: bool = True
    ) -> int:
        """Start (or restart) the worker; ``env`` adds variables for this process only.
        ``supervised``: through ``offpath worker``, which restarts a worker that dies.
        ``wait``: until it says it is ready (else :meth:`_wait_worker` with the returned
        offset of its log)."""
        offset = self.worker_log.stat().st_size if self.worker_log.exists() else 0
        name = f"w-{self.name}-{len(self.procs)}@%h"
        if supervised:
            cmd = [sys.executable, "-m", "offpath.cli.main", "worker", "--name", name]
        else:
            cmd = [
                str(BIN / "celery"),
                "-A",
                "offpath.worker.celery_app",
                "worker",
                "-l",
                "info",
                "--without-mingle",
                "--without-gossip",
                "-n",
                name,
            ]
        self.worker = self._spawn(cmd, self.worker_log, env)
        if wait:
            self._wait_worker(offset)
        return offset

    def _wait_worker(self, offset: int) -> None:
        assert self.worker is not None
        # a worker starts in a few seconds; on a loaded CI host (load average 10-29 seen) a
        # Celery worker's imports took over 30 s: wait for it generously, it says when it is up
        deadline = time.monotonic() + WORKER_START_S
        while "ready." not in self.worker_log.read_text(errors="replace")[offset:]:
            if self.worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "worker did not start:\n" + self.worker_log.read_text(errors="replace")[-3000:]
                )
            time.sleep(0.1)

    def kill_worker(self, sig: int = signal.SIGKILL) -> None:
        assert self.worker is not None
        os.killpg(self.worker.pid, sig)
        self.worker.wait(timeout=30)

    def _wait_ready(self) -> None:
        """Until this stack's API answers: on its port, from its own process (pytest-xdist's
        processes start stacks at once, and a free port can be taken by another's API before
        this one binds it: the tests then talked to that one, whose database knew no key of
        theirs: 401). Raises :class:`PortTaken` when the port was not free after all."""
        deadline = time.monotonic() + WORKER_START_S
        while time.monotonic() < deadline:
            if self.api.poll() is not None:
                log = self.api_log.read_text(errors="replace")
                if "address already in use" in log.lower():
                    raise PortTaken(self.port)
                raise RuntimeError("api exited:\n" + log[-3000:])
            try:
                if self.http.get("/healthz").status_code in (200, 503) and self._listening():
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(
            "api did not start:\n" + self.api_log.read_text(errors="replace")[-3000:]
        )

    def _listening(self) -> bool:
        """This stack's API process holds the listening socket of its port."""
        try:
            conns = psutil.Process(self.api.pid).net_connections(kind="tcp")
        except psutil.Error:
            return False
        return any(
            c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.port for c in conns
        )

    def stop(self) -> None:
        if self.http is not None:
            self.http.close()
        for client in self.clients:
            client.close()
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        forget_broker_queue(self.env, worker_names=[f"w-{self.name}-"])
        if self.pg_url:
            drop_pg_database(self.pg_url)

    def logs(self) -> str:
        return self.worker_log.read_text(errors="replace") + self.api_log.read_text(
            errors="replace"
        )

    # --- HTTP helpers ---------------------------------------------------------------------

    def messages(self, session: str) -> list[dict[str, Any]]:
        r = self.http.get(f"/sessions/{session}/messages")
        r.raise_for_status()
        return r.json()["messages"]

    def session(self, session: str) -> dict[str, Any]:
        r = self.http.get(f"/sessions/{session}/messages")
        r.raise_for_status()
        return r.json()

    def jobs(self, session: str) -> list[dict[str, Any]]:
        r = self.http.get(f"/sessions/{session}/compactions")
        if r.status_code == 404:  # no such session (yet)
            return []
        r.raise_for_status()
        return r.json()["jobs"]

    def post_turn(
        self, session: str, messages: list[dict[str, Any]], state: dict[str, Any] | None = None
    ) -> httpx.Response:
        body: dict[str, Any] = {"messages": messages}
        if state is not None:
            body["state"] = state
        return self.http.post(f"/sessions/{session}/turns", json=body)

    def settle(
        self,
        session: str,
        expect_new_job: bool,
        known: int,
        timeout: float = 60,
        final: str | None = None,
    ) -> list[dict[str, Any]]:
        """Wait until the thread's jobs are all settled (final, or prepared: a compaction
        prepared ahead waits for the thread to cross its threshold); when a new job is
        expected, until it appeared (the hook runs after the response); ``final``: until
        that job is final too."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            jobs = self.jobs(session)
            settled = all(j["status"] in SETTLED for j in jobs)
            ended = final is None or any(
                j["job_id"] == final and j["status"] in FINAL for j in jobs
            )
            if (not expect_new_job or len(jobs) > known) and settled and ended:
                return jobs
            time.sleep(0.05)
        raise AssertionError(f"jobs did not settle: {self.jobs(session)}\n{self.logs()[-4000:]}")

    def expect_after_turn(
        self, thread: list, jobs: list[dict[str, Any]], settings: Any
    ) -> tuple[bool, str | None]:
        """What the post-turn hook does after a turn that made ``thread`` (the jobs as they were
        before): ``(a new job is queued, the prepared job it applies)``."""
        from offpath.compaction.accounting import total_chars
        from offpath.compaction.planner import Skip, plan_compaction

        busy = [j for j in jobs if j["status"] in ("queued", "running")]
        prepared = [j["job_id"] for j in jobs if j["status"] == "prepared"]
        over = total_chars(thread) > settings.summarization_threshold_chars
        if prepared and over:
            return False, prepared[-1]
        plan = plan_compaction(thread, settings, early=True)
        return not busy and not prepared and not isinstance(plan, Skip), None

    def publish(self, session: str, job_id: str, options: dict | None = None) -> None:
        """Send a ``compact_session`` message straight to this stack's queue (a publisher for
        a :class:`~offpath.coordination.runtime.Client` in the test process)."""
        from celery import Celery

        app = Celery(broker=self.env.get("CELERY_BROKER_URL") or self.env["REDIS_URL"])
        app.send_task(
            "compact_session",
            args=[session],
            kwargs={"options": options} if options else {},
            task_id=job_id,
            queue=self.env["CELERY_QUEUE"],
        )
        app.close()

    def settings(self, **overrides: Any):
        """This stack's settings, for code run in the test process (a middleware, a hook)."""
        from offpath.compaction.settings import Settings
        from offpath.config import load_settings

        env = {k.lower(): v for k, v in self.env.items() if k.lower() in Settings.model_fields}
        return load_settings(**{**env, **overrides})

    def client(self, **overrides: Any):
        """A :class:`~offpath.coordination.runtime.Client` on this stack's usage DB and Redis, which
        publishes to its queue."""
        from offpath.coordination.runtime import Client

        client = Client.open(self.settings(**overrides), publish=self.publish)
        self.clients.append(client)
        return client

    def db_url(self) -> str:
        if self.pg_url:
            return self.pg_url.replace("postgresql://", "postgresql+psycopg://")
        return f"sqlite:///{self.env['DATA_DIR']}/usage.db"


FINAL = ("applied", "skipped", "failed", "reverted")
SETTLED = (*FINAL, "prepared")


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1)[:3000]


def stop_group(proc: subprocess.Popen, timeout: float = 15) -> None:
    """Stop the process group ``proc`` leads (started with ``start_new_session=True``):
    SIGTERM, then SIGKILL after ``timeout`` s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_for(predicate: Any, timeout: float = 30, interval: float = 0.05, what: Any = "") -> Any:
    """``predicate()``'s first truthy value, tried every ``interval`` s for ``timeout`` s;
    AssertionError naming ``what`` (a string, or a callable giving one when it fails; else
    the predicate's source line) and its last value."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    said = (what() if callable(what) else what) or _where(predicate)
    raise AssertionError(f"condition not met in {timeout:g}s: {said}; last {value!r:.300}")


def _where(predicate: Any) -> str:
    code = getattr(predicate, "__code__", None)
    if code is None:
        return repr(predicate)
    return f"{Path(code.co_filename).name}:{code.co_firstlineno}"


def ids(messages: Iterable[dict[str, Any]]) -> list[str]:
    return [m["id"] for m in messages]


@contextmanager
def chat_run_in_flight(stack: Stack, stub: Any, session: str) -> Iterator[None]:
    """While the block runs, a chat run of the API's own agent holds ``session``'s thread
    (its lock's token ``run:...``): the stub LLM (``stub``, a :class:`stub_llm.StubServer`)
    holds that session's model calls (mode ``held``, by a needle only its runs send) and
    answers every other request at once; a run that ends (the chat model's timeout) is
    followed by the next. Returns once the first run holds the thread."""
    import redis

    needle = f"hold the thread {uuid.uuid4().hex}"
    state = stub.state
    with state.lock:
        state.mode, state.needle, state.times = "held", needle, 1_000_000
    state.release.clear()
    stop = threading.Event()

    def runs() -> None:
        headers = {"Authorization": f"Bearer {stack.key}"}
        with httpx.Client(base_url=stack.url, timeout=120, headers=headers) as http:
            while not stop.is_set():
                try:
                    http.post(f"/sessions/{session}/messages", json={"content": needle})
                except httpx.HTTPError:
                    time.sleep(0.1)

    thread = threading.Thread(target=runs, name=f"chat run on {session}", daemon=True)
    thread.start()
    client = redis.Redis.from_url(stack.env["REDIS_URL"])
    key = f"{stack.env['REDIS_KEY_PREFIX']}:lock:thread:{session}"
    try:
        wait_for(lambda: (client.get(key) or b"").startswith(b"run:"), timeout=60)
        yield
    finally:
        stop.set()
        with state.lock:
            state.mode, state.needle, state.times = "ok", None, None
        state.release.set()
        thread.join(timeout=60)
        client.close()


@contextmanager
def small_runtime(
    backend: str, folder: Path, prefix: str, *, worker: bool = False
) -> Iterator[Any]:
    """An offpath runtime in this process on ``backend`` ("sqlite": under ``folder``;
    "postgres": a scratch database, dropped after), Redis keys under ``prefix``-<random>, at
    a 6,000 / 2,000-char threshold / keep window, publishing nowhere. ``worker``: the
    worker's runtime (patches through the thread graph); else the API's (its agent graph)."""
    from offpath.agent.graph import open_runtime, open_thread_writer
    from offpath.config import load_settings

    url = create_pg_database() if backend == "postgres" else ""
    settings = load_settings(
        data_dir=str(folder),
        database_url=url,
        redis_url=REDIS_URL,
        redis_key_prefix=f"{prefix}-{uuid.uuid4().hex[:8]}",
        summarization_threshold_chars=6_000,
        summarization_keep_chars=2_000,
    )
    opener = open_thread_writer if worker else open_runtime
    runtime = opener(settings, publish=lambda *a: None)
    try:
        yield runtime
    finally:
        runtime.close()
        if url:
            drop_pg_database(url)


def migrated_engine(folder: Path, backend: str) -> Iterator[Any]:
    """A migrated usage database's engine on ``backend`` ("sqlite": under ``folder``;
    "postgres": a scratch database, dropped after); for a generator fixture."""
    from offpath.config import load_settings
    from offpath.stores.db.engine import make_engine, migrate

    url = create_pg_database() if backend == "postgres" else ""
    settings = load_settings(data_dir=str(folder), database_url=url)
    migrate(settings)
    engine = make_engine(settings)
    yield engine
    engine.dispose()
    if url:
        drop_pg_database(url)
