"""Benchmark 22, a chaos soak: the whole system under load for a long time while faults of
every kind come at random, then what it kept.

Everything is the soak's own: a PostgreSQL cluster (``initdb`` + ``pg_ctl``, on a link the
soak can slow and drop), a ``redis-server`` (locks, leases and the broker, as at the
defaults), the stub LLM (``tests/stub_llm.py``), an API (uvicorn), a Celery worker and
``offpath beat``, all at the default settings (threshold 60,000 chars, lease 30 s, reconcile
every 15 s...). Nothing touches the machine's own PostgreSQL or Redis.

* **Load**: ``sessions`` clients over HTTP with an API key, each on its own session: most
  import turns (``POST /sessions/{id}/turns``: a shared transcript or case, then synthetic
  turns of ~3,000 chars), ``chat_sessions`` of them chat (``POST /sessions/{id}/messages``,
  a run of the API's own agent on the stub LLM); each waits ``think_s`` between turns.
  Beside them, ``agent_runners`` threads run the user's own agent back to back: a
  ``create_agent`` with :class:`~offpath.OffPathCompaction`, a scripted model replaying a
  single-request transcript and a SQLite checkpointer of its own.
* **Faults**, one at a time, ``gap_s`` apart, each kind once per round in a shuffled order
  (:data:`KINDS`): SIGKILL of the worker, beat or API (started again after ``down_s``); Redis
  killed and started again empty; PostgreSQL restarted (``pg_ctl restart -m immediate``);
  a broker outage (Redis down for ``spell_s``); delay and loss on the database link
  (``tc netem`` on a veth pair into the network namespace PostgreSQL runs in; without
  ``ip netns``, a TCP proxy that delays and drops); a slow LLM (``slow_llm_s`` a call) and a
  failing one (500 or 429) for ``spell_s``.
* **Afterwards** (load stopped, the last fault healed at ``T``): job rows still queued or
  running at ``T + JOB_LEASE_S + 2 x RECONCILE_INTERVAL_S`` (stuck); API threads over their
  threshold at ``T + 60 s``; then, once every job row is at rest: every message a client
  was told was written is in its thread or the archive (or listed by a summary), usage
  events per job, and tool calls and results that pair with nothing.

``python -m bench.soak --minutes 60`` prints the table and exits 1 when a target is missed;
``python -m bench --only soak --update`` (``SOAK_MINUTES``, default 60) puts it in
BENCHMARKS.md. Needs root for the network namespace and to run PostgreSQL as ``postgres``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.common import ROOT, RUN_ID, Context, Result, StubServer, free_port, pct, wait
from bench.load import check_threads, final_sizes, log_errors, settle

NAME = "soak"

#: The fault kinds, as the report names them.
KINDS = (
    "worker SIGKILL",
    "beat SIGKILL",
    "API SIGKILL",
    "Redis restart",
    "PostgreSQL restart",
    "broker outage",
    "database link delay and loss",
    "slow LLM",
    "failing LLM",
)
#: chars of log in each synthetic turn's tool result
TURN_CHARS = 3_000
#: Seconds after the last fault at which threads over their threshold are counted.
OVER_AFTER_S = 60.0
#: The longest the API may go without answering ``/healthz`` (a SIGKILL and its restart, or
#: a dependency down for the longest spell, included).
SILENT_S = 120.0


@dataclass(frozen=True)
class Plan:
    """How long, how much load, how often and how long the faults. Seconds unless named."""

    minutes: float = 60.0
    sessions: int = 50
    chat_sessions: int = 10
    agent_runners: int = 1
    think_s: tuple[float, float] = (1.0, 4.0)
    gap_s: tuple[float, float] = (30.0, 90.0)
    down_s: tuple[float, float] = (2.0, 10.0)
    spell_s: tuple[float, float] = (20.0, 60.0)
    llm_delay_s: float = 0.5
    #: how long the own agent's scripted model takes per call
    agent_delay_s: float = 0.2
    slow_llm_s: float = 15.0
    netem: str = "delay 150ms 50ms loss 5%"
    seed: int = 0
    #: None: faults until the time is up; n: exactly n rounds of every kind (the load runs
    #: on for ``minutes`` at least)
    rounds: int | None = None

    @classmethod
    def short(cls, minutes: float = 4.0, seed: int = 0) -> Plan:
        """Every fault kind once, the load running for ``minutes`` at least: fewer sessions,
        shorter gaps and spells."""
        return cls(
            minutes=minutes,
            sessions=12,
            chat_sessions=3,
            think_s=(1.0, 3.0),
            gap_s=(3.0, 8.0),
            down_s=(1.0, 4.0),
            spell_s=(6.0, 12.0),
            slow_llm_s=8.0,
            agent_delay_s=0.05,
            seed=seed,
            rounds=1,
        )


# --- the soak's own PostgreSQL, behind a link it can impair ----------------------------------


def sh(cmd: list[str], timeout: float = 120) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {result.stderr.strip()[-2000:]}")
    return result.stdout


def netns_usable() -> bool:
    """``ip netns`` and ``tc netem`` work here (root, the capabilities they need, a kernel
    with ``sch_netem``)."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        return False
    name = f"soakprobe{os.getpid()}"
    try:
        sh(["ip", "netns", "add", name], timeout=10)
    except (RuntimeError, subprocess.TimeoutExpired):
        return False
    try:
        sh(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"])  # fmt: skip
        return True
    except (RuntimeError, subprocess.TimeoutExpired):
        return False
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


class NetnsLink:
    """A network namespace joined to this one by a veth pair: PostgreSQL runs inside and is
    reached at :attr:`host`; :meth:`impair` puts ``tc netem`` on both ends of the pair (both
    directions), :meth:`clear` takes it off."""

    kind = "tc netem on a veth pair into a network namespace"

    def __init__(self) -> None:
        r = random.Random()
        tag = f"{os.getpid() % 10_000:04d}{r.randrange(100):02d}"
        self.ns = f"soak{tag}"
        self.outer, self.inner = f"sk{tag}h", f"sk{tag}n"
        net = f"10.{r.randrange(64, 250)}.{r.randrange(256)}"
        self.host = f"{net}.2"
        sh(["ip", "netns", "add", self.ns])
        try:
            sh(["ip", "link", "add", self.outer, "type", "veth", "peer", "name", self.inner])
            sh(["ip", "link", "set", self.inner, "netns", self.ns])
            sh(["ip", "addr", "add", f"{net}.1/24", "dev", self.outer])
            sh(["ip", "link", "set", self.outer, "up"])
            for cmd in (
                ["ip", "addr", "add", f"{self.host}/24", "dev", self.inner],
                ["ip", "link", "set", self.inner, "up"],
                ["ip", "link", "set", "lo", "up"],
            ):
                sh(self.prefix() + cmd)
        except BaseException:
            self.close()
            raise

    def prefix(self) -> list[str]:
        """What runs a command inside the namespace."""
        return ["ip", "netns", "exec", self.ns]

    def target(self, port: int) -> tuple[str, int]:
        return self.host, port

    def impair(self, netem: str) -> None:
        args = netem.split()
        sh(["tc", "qdisc", "replace", "dev", self.outer, "root", "netem", *args])
        sh(self.prefix() + ["tc", "qdisc", "replace", "dev", self.inner, "root", "netem", *args])

    def clear(self) -> None:
        for cmd in (
            ["tc", "qdisc", "del", "dev", self.outer, "root"],
            self.prefix() + ["tc", "qdisc", "del", "dev", self.inner, "root"],
        ):
            subprocess.run(cmd, capture_output=True, timeout=30)

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self.outer], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=30)


class ProxyLink:
    """A TCP proxy on 127.0.0.1 in front of PostgreSQL: :meth:`impair` makes it hold each
    chunk it forwards (the delay and jitter of the netem spec) and drop a connection with
    the loss probability per chunk (TCP retransmits lost packets, so what an application
    sees of heavy loss is stalls and dropped connections)."""

    kind = "a TCP proxy that delays and drops (tc netem is not available here)"

    def __init__(self) -> None:
        self.upstream = ("127.0.0.1", 0)
        self.delay_s = self.jitter_s = self.loss = 0.0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, name="soak-db-proxy", daemon=True).start()

    def prefix(self) -> list[str]:
        return []

    def target(self, port: int) -> tuple[str, int]:
        self.upstream = ("127.0.0.1", port)
        return "127.0.0.1", self.port

    def impair(self, netem: str) -> None:
        words = netem.split()
        ms = [float(w.removesuffix("ms")) for w in words if w.endswith("ms")]
        self.delay_s, self.jitter_s = (ms + [0.0, 0.0])[0] / 1000, (ms + [0.0, 0.0])[1] / 1000
        self.loss = next((float(w[:-1]) / 100 for w in words if w.endswith("%")), 0.0)

    def clear(self) -> None:
        self.delay_s = self.jitter_s = self.loss = 0.0

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            try:
                up = socket.create_connection(self.upstream, timeout=10)
            except OSError:  # PostgreSQL is down: so is the connection
                conn.close()
                continue
            up.settimeout(None)
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if self.loss and random.random() < self.loss:
                    break
                if self.delay_s:
                    time.sleep(max(0.0, random.gauss(self.delay_s, self.jitter_s)))
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):  # shut down first: the other direction's recv returns, and
            try:  # the client sees its connection end (close alone leaves it open)
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.closed = True
        self.sock.close()


class Postgres:
    """A PostgreSQL cluster of the soak's own (trust auth, ``fsync=off``; the machine's
    default of 100 connections) in a temporary folder its own user can reach, run as
    ``postgres`` when this is root, behind ``link``; :meth:`stop` removes it and leaves its
    log in ``folder``."""

    def __init__(self, folder: Path, link: NetnsLink | ProxyLink) -> None:
        self.link = link
        self.folder = folder
        bindir = Path(os.path.realpath(shutil.which("pg_ctl") or "/usr/bin/pg_ctl")).parent
        self.pg_ctl = str(bindir / "pg_ctl")
        self.home = Path(tempfile.mkdtemp(prefix=f"soak-pg-{RUN_ID}-"))
        self.home.chmod(0o755)
        self.data = self.home / "data"
        self.data.mkdir()
        self.as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_pg:
            shutil.chown(self.data, "postgres", "postgres")
        sh(self.as_pg + [str(bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"])  # fmt: skip
        with open(self.data / "pg_hba.conf", "a") as f:
            f.write("host all all 0.0.0.0/0 trust\n")
        inside = isinstance(link, NetnsLink)
        self.port = 5432 if inside else free_port()  # a namespace has its own ports
        listen = link.host if inside else "127.0.0.1"
        opts = (
            f"-p {self.port} -k {self.data} -c listen_addresses={listen} "
            "-c max_connections=100 -c fsync=off"
        )
        self.log = self.home / "postgres.log"
        if self.as_pg:
            self.log.touch()
            shutil.chown(self.log, "postgres", "postgres")
        self._ctl("start", "-o", opts, "-l", str(self.log))
        self.host, self.public_port = link.target(self.port)

    def _ctl(self, *args: str) -> None:
        sh(self.link.prefix() + self.as_pg + [self.pg_ctl, "-D", str(self.data), "-w", "-t", "120", *args])  # fmt: skip

    def url(self, db: str) -> str:
        return f"postgresql://postgres@{self.host}:{self.public_port}/{db}"

    def create(self, db: str) -> str:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{db}"')
        return self.url(db)

    def restart(self) -> None:
        """Crash and recovery: every backend ends at once, then the postmaster starts again."""
        self._ctl("restart", "-m", "immediate", "-l", str(self.log))

    def stop(self) -> None:
        try:
            self._ctl("stop", "-m", "immediate")
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        if self.log.exists():
            shutil.copy(self.log, self.folder / "postgres.log")
        shutil.rmtree(self.home, ignore_errors=True)


# --- the service's processes -------------------------------------------------------------


class Services:
    """The API, one worker and ``offpath beat`` with ``env``, each in a process group of its
    own; a process this did not kill that exits is counted and started again
    (:meth:`revive`)."""

    def __init__(self, env: dict[str, str], folder: Path) -> None:
        self.env = env
        self.folder = folder
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.port = free_port()
        self.starts = Counter[str]()
        self.unexpected: list[str] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self, name: str) -> Path:
        return self.folder / f"{name}.log"

    def start(self, name: str) -> None:
        log = self.log(name)
        offset = log.stat().st_size if log.exists() else 0
        self.starts[name] += 1
        if name == "api":
            cmd = [sys.executable, "-m", "uvicorn", "offpath.api.app:app", "--port", str(self.port), "--log-level", "warning"]  # fmt: skip
        elif name == "worker":
            worker = f"soak-{RUN_ID}-{self.starts[name]}@%h"
            cmd = [sys.executable, "-m", "celery", "-A", "offpath.worker.celery_app", "worker", "-l", "info", "--without-mingle", "--without-gossip", "-n", worker]  # fmt: skip
        else:
            cmd = [sys.executable, "-m", "offpath.cli.main", "beat"]
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.procs[name] = proc
        self._wait_up(name, proc, log, offset)

    def _wait_up(self, name: str, proc: subprocess.Popen[bytes], log: Path, offset: int) -> None:
        import httpx

        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                text = log.read_text(errors="replace")[offset:]
                if name == "api" and "address already in use" in text.lower():
                    self.port = free_port()  # another process took the port meanwhile
                    return self.start(name)
                raise RuntimeError(f"{name} exited at start:\n{text[-3000:]}")
            if name == "api":
                try:
                    if httpx.get(f"{self.url}/healthz", timeout=5).status_code in (200, 503):
                        return None
                except httpx.HTTPError:
                    pass
            else:
                ready = "ready." if name == "worker" else "beat: Starting"
                if ready in log.read_text(errors="replace")[offset:]:
                    return None
            time.sleep(0.2)
        raise RuntimeError(f"{name} did not start:\n{log.read_text(errors='replace')[-3000:]}")

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def revive(self) -> None:
        """Start again any process that exited on its own, and say so."""
        for name, proc in list(self.procs.items()):
            if proc.poll() is not None:
                tail = self.log(name).read_text(errors="replace")[-400:].strip().splitlines()
                self.unexpected.append(
                    f"{name} exited {proc.returncode}: {(tail or [''])[-1][:200]}"
                )
                self.start(name)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


# --- load ----------------------------------------------------------------------------------


@dataclass
class Session:
    """One client's session: the ids of the messages it was told were written (``posted``),
    turns accepted, refusals by answer, latencies (ms) and turns whose fate stayed unknown."""

    session_id: str
    chat: bool
    posted: list[str] = field(default_factory=list)
    turns: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    retried: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    uncertain: int = 0


def replay_docs() -> list[list[dict[str, Any]]]:
    """The shared transcripts and cases an API client replays turn by turn: several turns,
    each one complete (every call answered in it), none holding a summary, none over
    60,000 chars."""
    from shared import CASES, TRANSCRIPTS, load, marked_summary, messages_of, pairing_problems
    from stack import split_turns

    from offpath.compaction.accounting import total_chars
    from offpath.compaction.formats import to_messages

    docs = []
    for path in [*TRANSCRIPTS, *CASES]:
        doc = load(path)
        turns = split_turns(doc["messages"])
        msgs = messages_of(doc)
        if (
            len(turns) > 1
            and not any(marked_summary(m) for m in msgs)
            and all(not pairing_problems(to_messages(t)) for t in turns)
            and max(total_chars(to_messages(t)) for t in turns) <= 60_000
        ):
            docs.append(doc["messages"])
    return docs


def turns_of(k: int, session_id: str, docs: list[list[dict[str, Any]]]) -> Iterator[list[dict]]:
    """Session ``k``'s turns: shared document ``k`` (ids made the session's own), then
    synthetic turns for ever."""
    from stack import split_turns

    from bench.workloads import turn_messages

    for j, turn in enumerate(split_turns(docs[k % len(docs)])):
        yield [{**m, "id": f"{session_id}-d{j}-{n}"} for n, m in enumerate(turn)]
    for i in itertools.count():
        yield turn_messages(i, TURN_CHARS, k, f"{session_id}-x")


class Load:
    """The clients: :meth:`start` them, :meth:`stop` them (a turn whose answer was lost is
    asked again, as a client would, until its fate is known or ``settle_s`` passed)."""

    def __init__(self, plan: Plan, services: Services, key: str, settings: Any) -> None:
        self.plan = plan
        self.services = services
        self.headers = {"Authorization": f"Bearer {key}"}
        self.settings = settings
        self.stopping = threading.Event()
        self.give_up_at = float("inf")
        self.sessions = [
            Session(f"soak-{RUN_ID}-{k}", chat=k < plan.chat_sessions) for k in range(plan.sessions)
        ]
        self.runs: list[AgentRun] = []
        self.errors: list[str] = []
        self.threads: list[threading.Thread] = []
        #: the longest the API went without answering ``/healthz`` (s), and when (s after start)
        self.silent_s, self.silent_at = 0.0, 0.0

    def start(self) -> None:
        docs = replay_docs()
        for k, s in enumerate(self.sessions):
            target = self._chat if s.chat else self._turns
            args = (s,) if s.chat else (s, turns_of(k, s.session_id, docs))
            self.threads.append(threading.Thread(target=self._guard, args=(target, *args), daemon=True))  # fmt: skip
        for k in range(self.plan.agent_runners):
            self.threads.append(threading.Thread(target=self._guard, args=(self._agent, k), daemon=True))  # fmt: skip
        self.threads.append(threading.Thread(target=self._guard, args=(self._probe,), daemon=True))  # fmt: skip
        for t in self.threads:
            t.start()

    def stop(self, settle_s: float = 180.0) -> None:
        self.give_up_at = time.monotonic() + settle_s
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=settle_s + 600)

    def _guard(self, target: Any, *args: Any) -> None:
        try:
            target(*args)
        except Exception as exc:  # a client's own bug: reported, never hidden
            import traceback

            self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
            traceback.print_exc()

    def _probe(self) -> None:
        """``/healthz`` every 2 s (10 s to answer, 200 or 503): the longest silence."""
        import httpx

        began = time.monotonic()
        answered = began
        while not self.stopping.wait(2.0):
            try:
                if httpx.get(f"{self.services.url}/healthz", timeout=10).status_code in (200, 503):
                    answered = time.monotonic()
            except httpx.HTTPError:
                pass
            if (silent := time.monotonic() - answered) > self.silent_s:
                self.silent_s, self.silent_at = silent, answered - began

    def _sleep(self, r: random.Random) -> None:
        self.stopping.wait(r.uniform(*self.plan.think_s))

    def _turns(self, s: Session, turns: Iterator[list[dict]]) -> None:
        import httpx

        r = random.Random(f"{self.plan.seed}-{s.session_id}")
        with httpx.Client(timeout=60, headers=self.headers) as http:
            while not self.stopping.is_set():
                turn = next(turns)
                ids = [m["id"] for m in turn]
                began = time.perf_counter()
                while True:
                    try:
                        resp = http.post(
                            f"{self.services.url}/sessions/{s.session_id}/turns",
                            json={"messages": turn},
                        )
                        code, text = resp.status_code, resp.text
                    except httpx.HTTPError as exc:
                        code, text = 0, type(exc).__name__
                    if code == 200 or (code == 422 and "is already used" in text):
                        # 422 "already used": an earlier try wrote it, its answer was lost
                        s.posted += ids
                        s.turns += 1
                        s.latencies_ms.append((time.perf_counter() - began) * 1000)
                        break
                    if code in (0, 409, 429) or code >= 500:
                        s.retried[str(code or text)] += 1
                        if time.monotonic() > self.give_up_at:
                            s.uncertain += 1
                            break
                        time.sleep(0.2 if code == 409 else 1.0)
                        continue
                    s.refused[f"{code} {text[:120]}"] += 1  # nothing was written
                    break
                self._sleep(r)

    def _chat(self, s: Session) -> None:
        import httpx

        r = random.Random(f"{self.plan.seed}-{s.session_id}")
        with httpx.Client(timeout=120, headers=self.headers) as http:
            for i in itertools.count():
                if self.stopping.is_set():
                    return
                began = time.perf_counter()
                try:
                    resp = http.post(
                        f"{self.services.url}/sessions/{s.session_id}/messages",
                        json={"content": f"chat {i}: is checkout-api healthy now?"},
                    )
                except httpx.ConnectError:  # the API is down: nothing was sent
                    s.retried["ConnectError"] += 1
                    time.sleep(1.0)
                    continue
                except httpx.HTTPError as exc:
                    s.uncertain += 1  # a run may have been written: a new try is a new turn
                    s.retried[type(exc).__name__] += 1
                    time.sleep(1.0)
                    continue
                if resp.status_code == 200:
                    s.posted.append(resp.json()["reply"]["id"])
                    s.turns += 1
                    s.latencies_ms.append((time.perf_counter() - began) * 1000)
                else:  # 502 (the LLM failed), 503, 409: nothing of the turn is kept
                    s.refused[str(resp.status_code)] += 1
                self._sleep(r)

    def _agent(self, k: int) -> None:
        from agent_replay import TranscriptModel, replay_script
        from langchain.agents import create_agent
        from shared import CASES, TRANSCRIPTS, load, messages_of

        from offpath import OffPathCompaction
        from offpath.coordination.runtime import Client
        from offpath.stores.checkpoints import open_checkpoints_url

        paths = [
            p
            for p in [*TRANSCRIPTS, *CASES]
            if sum(m["type"] == "human" for m in load(p)["messages"]) == 1
            and sum(len(str(m.get("content", ""))) for m in load(p)["messages"]) > 60_000
        ]
        url = f"sqlite:///{self.services.folder / f'agent-{k}.db'}"
        client = Client.open(self.settings)
        try:
            with open_checkpoints_url(url, self.settings) as checkpoints:
                for n in itertools.count():
                    if self.stopping.is_set():
                        return
                    session = f"agent-{RUN_ID}-{k}-{n}"
                    script = replay_script(
                        messages_of(load(paths[n % len(paths)])), f"{session}-end"
                    )
                    model = TranscriptModel(replies=script.replies, delay_s=self.plan.agent_delay_s)
                    middleware = OffPathCompaction(
                        self.settings, checkpointer_url=url, client=client
                    )
                    agent = create_agent(
                        model,
                        script.tools,
                        system_prompt=script.system,
                        middleware=[middleware],
                        checkpointer=checkpoints.saver,
                    )
                    run = AgentRun(session, url)
                    config = {"configurable": {"thread_id": session}, "recursion_limit": 10_000}
                    try:
                        agent.invoke({"messages": [script.request]}, config)
                    except Exception as exc:
                        run.error = f"{type(exc).__name__}: {exc}"[:300]
                    run.calls = len(model.calls)
                    run.posted, run.orphaned_calls = sent_ids(model.calls)
                    self.runs.append(run)
        finally:
            client.close()


@dataclass
class AgentRun:
    """One run of the user's own agent: its thread, what its model was sent (ids, and calls
    whose messages paired badly), the error that ended it (None: it ran to its end)."""

    session_id: str
    checkpointer_url: str
    posted: list[str] = field(default_factory=list)
    calls: int = 0
    orphaned_calls: int = 0
    error: str | None = None


def sent_ids(calls: list[list[Any]]) -> tuple[list[str], int]:
    """The ids of the messages the model was sent over a run (not the system prompt nor a
    summary), and how many model calls held a call or result that paired with nothing."""
    from shared import marked_summary, pairing_problems

    seen: dict[str, None] = {}
    bad = 0
    for sent in calls:
        body = [m for m in sent if m.type != "system"]
        bad += bool(pairing_problems(body))
        for m in body:
            if not marked_summary(m):
                seen[str(m.id)] = None
    return list(seen), bad


# --- faults ------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    at_s: float
    took_s: float
    detail: str = ""


class Chaos:
    """Injects :data:`KINDS` one at a time, in shuffled rounds, until ``deadline``; each fault
    is healed before the next (a killed process started again, Redis and PostgreSQL back,
    the link and the LLM as before)."""

    def __init__(self, plan: Plan, services: Services, pg: Postgres, redis: Any, stub: StubServer) -> None:  # fmt: skip
        self.plan = plan
        self.services = services
        self.pg = pg
        self.redis = redis
        self.stub = stub
        self.r = random.Random(plan.seed)
        self.done: list[Fault] = []
        self.began = time.monotonic()
        self.last_healed = self.began

    def run(self, deadline: float) -> None:
        """Until the next fault could not be healed by ``deadline`` (monotonic), or until the
        plan's rounds are done."""
        kinds: list[str] = []
        rounds = self.plan.rounds
        while rounds is None or len(self.done) < rounds * len(KINDS):
            if not kinds:
                kinds = list(KINDS)
                self.r.shuffle(kinds)
            gap = self.r.uniform(*self.plan.gap_s)
            # the next fault must be healed by the deadline (a restart takes a while)
            if rounds is None and time.monotonic() + gap + self.plan.spell_s[1] + 30 > deadline:
                return
            time.sleep(gap)
            self.services.revive()
            kind = kinds.pop()
            t = time.monotonic()
            detail = self.inject(kind)
            self.last_healed = time.monotonic()
            self.done.append(Fault(kind, t - self.began, self.last_healed - t, detail))
            print(f"soak: {t - self.began:6.0f} s  {kind} ({detail}, {self.last_healed - t:.0f} s)", flush=True)  # fmt: skip
            self.stub.set_delay(self.plan.llm_delay_s)  # also drops the requests it kept

    def inject(self, kind: str) -> str:
        from stack import start_redis

        down = self.r.uniform(*self.plan.down_s)
        spell = self.r.uniform(*self.plan.spell_s)
        if kind.endswith("SIGKILL"):
            name = {"worker": "worker", "beat": "beat", "API": "api"}[kind.split()[0]]
            self.services.kill(name)
            time.sleep(down)
            self.services.start(name)
            return f"down {down:.0f} s"
        if kind in ("Redis restart", "broker outage"):
            gone = down if kind == "Redis restart" else spell
            port = self.redis.port
            self.redis.proc.kill()
            self.redis.proc.wait(timeout=30)
            time.sleep(gone)
            self.redis.proc = start_redis(port, self.redis.folder)
            return f"down {gone:.0f} s, restarted empty"
        if kind == "PostgreSQL restart":
            self.pg.restart()
            return "pg_ctl restart -m immediate"
        if kind == "database link delay and loss":
            self.pg.link.impair(self.plan.netem)
            time.sleep(spell)
            self.pg.link.clear()
            return f"{self.plan.netem} for {spell:.0f} s"
        if kind == "slow LLM":
            self.stub.control(mode="ok", delay_s=self.plan.slow_llm_s)
            time.sleep(spell)
            self.stub.control(mode="ok", delay_s=self.plan.llm_delay_s)
            return f"{self.plan.slow_llm_s:.0f} s a call for {spell:.0f} s"
        mode = self.r.choice(["500", "429"])
        self.stub.control(mode=mode)
        time.sleep(spell)
        self.stub.control(mode="ok", delay_s=self.plan.llm_delay_s)
        return f"answers {mode} for {spell:.0f} s"


@dataclass
class PrivateRedis:
    proc: subprocess.Popen[bytes]
    port: int
    folder: Path


# --- the figures -------------------------------------------------------------------------


@dataclass
class Figures:
    """What a soak found; :attr:`targets` are the judged rows."""

    plan: Plan
    minutes: float
    link: str
    faults: list[Fault]
    sessions: list[Session]
    runs: list[AgentRun]
    posted: int = 0
    found: int = 0
    stuck: list[str] = field(default_factory=list)
    twice: int = 0
    usage_mismatch: list[str] = field(default_factory=list)
    over: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    jobs: Counter[str] = field(default_factory=Counter)
    settled_s: float | None = None
    unexpected: list[str] = field(default_factory=list)
    client_errors: list[str] = field(default_factory=list)
    log_errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    silent_s: float = 0.0
    silent_at: float = 0.0

    @property
    def targets(self) -> list[tuple[str, str, str, bool]]:
        """(figure, measured, target, met)."""
        share = self.found / self.posted if self.posted else 0.0
        kinds = Counter(f.kind for f in self.faults)
        return [
            (
                "fault kinds injected",
                f"{len(kinds)} of {len(KINDS)} ({len(self.faults)} faults)",
                f"all {len(KINDS)}",
                len(kinds) == len(KINDS),
            ),  # fmt: skip
            ("messages posted", f"{self.posted:,}", "-", self.posted > 0),
            (
                "messages in thread or archive",
                f"{self.found:,} ({share:.2%})",
                "100%",
                self.posted > 0 and self.found == self.posted,
            ),  # fmt: skip
            (
                "job rows stuck non-final after the last fault + lease + 2 reconcile passes",
                str(len(self.stuck)),
                "0",
                not self.stuck,
            ),  # fmt: skip
            (
                "usage events counted twice",
                str(self.twice),
                "0",
                self.twice == 0 and not self.usage_mismatch,
            ),  # fmt: skip
            (
                f"threads over their threshold {OVER_AFTER_S:.0f} s after the last fault",
                str(len(self.over)),
                "0",
                not self.over,
            ),  # fmt: skip
            ("orphaned tool calls or results", str(len(self.orphans)), "0", not self.orphans),
            (
                "longest the API did not answer /healthz",
                f"{self.silent_s:.0f} s",
                f"<= {SILENT_S:.0f} s",
                self.silent_s <= SILENT_S,
            ),  # fmt: skip
        ]

    @property
    def met(self) -> bool:
        return all(row[3] for row in self.targets) and not self.client_errors

    def table(self) -> list[str]:
        lines = ["| figure | measured | target | |", "|---|---|---|---|"]
        for name, measured, target, met in self.targets:
            lines.append(f"| {name} | {measured} | {target} | {'met' if met else '**missed**'} |")
        return lines

    def details(self) -> list[str]:
        plan = self.plan
        turns = [s for s in self.sessions if not s.chat]
        chats = [s for s in self.sessions if s.chat]
        lat = [x for s in turns for x in s.latencies_ms]
        chat_lat = [x for s in chats for x in s.latencies_ms]
        kinds = Counter(f.kind for f in self.faults)

        def counts(c: Counter[str]) -> str:
            return ", ".join(f"{k} x {v}" for k, v in c.most_common()) or "none"

        runs_ok = [r for r in self.runs if r.error is None]
        lines = [
            f"{self.minutes:.1f} min of load and faults; {plan.sessions} sessions ({plan.sessions - plan.chat_sessions} "
            f"importing turns, {plan.chat_sessions} chatting with the API's agent), {plan.agent_runners} own-agent "
            f"runner(s) (model {plan.agent_delay_s:g} s a call); think time {plan.think_s[0]:g}-{plan.think_s[1]:g} s; stub LLM {plan.llm_delay_s:g} s a call; "
            "default settings; seed " + str(plan.seed),
            f"faults ({len(self.faults)}, {plan.gap_s[0]:g}-{plan.gap_s[1]:g} s apart): {counts(kinds)}; database link: {self.link}",
            f"imported turns: {sum(s.turns for s in turns):,} accepted, p50 {pct(lat, 50):.0f} ms, p99 {pct(lat, 99):.0f} ms"
            if lat
            else "imported turns: none accepted",
            f"retried (answer lost, 409, 429, 5xx): {counts(sum((s.retried for s in turns), Counter()))}; "
            f"refused: {counts(sum((s.refused for s in turns), Counter()))}; fate unknown: {sum(s.uncertain for s in turns)}",
            f"chat turns: {sum(s.turns for s in chats):,} answered"
            + (f", p50 {pct(chat_lat, 50):.0f} ms" if chat_lat else "")
            + f"; not kept: {counts(sum((s.refused for s in chats), Counter()))}; answer lost: {sum(s.uncertain for s in chats)}",
            f"own-agent runs: {len(runs_ok)} ran to their end, {len(self.runs) - len(runs_ok)} ended by an error"
            + (
                ""
                if len(runs_ok) == len(self.runs)
                else f" ({counts(Counter(r.error or '' for r in self.runs if r.error))})"
            )
            + f"; {sum(r.calls for r in self.runs):,} model calls",
            f"job rows: {counts(self.jobs)}"
            + (
                f"; all at rest {self.settled_s:.0f} s after the last fault"
                if self.settled_s is not None
                else "; **not all at rest**"
            ),
            f"processes that exited on their own (started again): {len(self.unexpected)}"
            + (f" ({'; '.join(self.unexpected[:5])})" if self.unexpected else ""),
            f"errors in the API, worker and beat logs: {len(self.log_errors)}"
            + (f" (first: {' / '.join(self.log_errors[:3])})" if self.log_errors else ""),
        ]
        if self.lost:
            lines.append(f"messages lost: {len(self.lost)} (first: {'; '.join(self.lost[:5])})")
        if self.stuck:
            lines.append(f"stuck rows: {'; '.join(self.stuck[:5])}")
        if self.usage_mismatch:
            lines.append(
                f"usage rows not one per applied job: {'; '.join(self.usage_mismatch[:5])}"
            )
        if self.over:
            lines.append(f"threads over their threshold: {'; '.join(self.over[:5])}")
        if self.orphans:
            lines.append(f"orphans: {'; '.join(self.orphans[:5])}")
        if self.silent_s > SILENT_S:
            lines.append(f"the API answered no /healthz for {self.silent_s:.0f} s from {self.silent_at:.0f} s into the soak")  # fmt: skip
        if self.client_errors:
            lines.append(f"**the soak's clients failed**: {'; '.join(self.client_errors[:3])}")
        return lines + self.notes


def agent_found(
    runs: list[AgentRun], engine: Any, settings: Any
) -> tuple[int, list[str], list[str]]:
    """For the own-agent runs that ran to their end: how many of the ids their model was
    sent are in the final thread, the archive or a summary's list; the lost ones; the
    threads whose calls and results do not pair."""
    from shared import marked_summary, pairing_problems

    from offpath.stores import archive
    from offpath.stores.checkpoints import open_checkpoints_url

    found, lost, orphans = 0, [], []
    by_url: dict[str, list[AgentRun]] = {}
    for r in runs:
        if r.error is None:
            by_url.setdefault(r.checkpointer_url, []).append(r)
        if r.orphaned_calls:
            orphans.append(f"{r.session_id}: {r.orphaned_calls} model calls sent orphans")
    for url, group in by_url.items():
        with open_checkpoints_url(url, settings) as checkpoints:
            for r in group:
                config = {"configurable": {"thread_id": r.session_id}}
                tup = checkpoints.saver.get_tuple(config)
                final = list(
                    (tup.checkpoint["channel_values"].get("messages") if tup else None) or []
                )
                present = {str(m.id) for m in final}
                replaced: set[str] = set()
                for m in final:
                    if marked_summary(m):
                        replaced.update(str(i) for i in m.additional_kwargs.get("summary", {}).get("replaced_ids", []))  # fmt: skip
                rows, _ = archive.read(engine, r.session_id, limit=1_000_000)
                replaced.update(str(row["message_id"]) for row in rows)
                missing = [i for i in r.posted if i not in present and i not in replaced]
                found += len(r.posted) - len(missing)
                lost += [f"{r.session_id}: {i}" for i in missing]
                if problems := pairing_problems(final):
                    orphans.append(f"{r.session_id}: {sorted(problems)[:3]}")
    return found, lost, orphans


def api_orphans(settings: Any, sids: list[str]) -> list[str]:
    """API threads whose tool calls and results do not pair."""
    from shared import pairing_problems

    from offpath.agent.graph import open_runtime
    from offpath.stores.checkpoints import thread_config

    rt = open_runtime(settings, run_migrations=False)
    out = []
    try:
        for s in sids:
            final = rt.graph.get_state(thread_config(s)).values.get("messages", [])
            if problems := pairing_problems(final):
                out.append(f"{s}: {sorted(problems)[:3]}")
    finally:
        rt.close()
    return out


def wait_db(url: str, timeout: float = 120) -> None:
    """Until the database answers (after a restart or on a lossy link)."""
    import psycopg

    def answers() -> bool:
        try:
            with psycopg.connect(url, connect_timeout=5) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    wait(answers, timeout, 0.5)


def soak(plan: Plan, folder: Path | None = None) -> Figures:
    """Run the soak of ``plan`` (its processes' logs in ``folder``) and measure it."""
    import httpx
    import sqlalchemy as sa
    from stack import start_redis

    from bench.common import api_key
    from offpath.compaction.settings import Settings
    from offpath.config import load_settings

    folder = folder or Path(tempfile.mkdtemp(prefix=f"soak-{RUN_ID}-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"soak: {plan.minutes:g} min, logs in {folder}", flush=True)
    link: NetnsLink | ProxyLink = NetnsLink() if netns_usable() else ProxyLink()
    pg = redis_ = stub = services = load = engine = None
    try:
        pg = Postgres(folder, link)
        pg_url = pg.create("offpath")
        redis_port = free_port()
        redis_ = PrivateRedis(start_redis(redis_port, folder), redis_port, folder)
        stub = StubServer()
        stub.set_delay(plan.llm_delay_s)
        queue = f"soak-{RUN_ID}"
        env = {k: v for k, v in os.environ.items() if k.lower() not in Settings.model_fields}
        env.update(
            OFFPATH_ENV_FILE="",
            DATABASE_URL=pg_url,
            REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
            CELERY_QUEUE=queue,
            REDIS_KEY_PREFIX=queue,
            OPENAI_BASE_URL=stub.base_url,
            DATA_DIR=str(folder / "data"),
            LOG_LEVEL="INFO",
            WORKER_METRICS_PORT="0",
        )
        settings = load_settings(
            database_url=pg_url, redis_url=env["REDIS_URL"], celery_queue=queue,
            redis_key_prefix=queue, openai_base_url=stub.base_url,
        )  # fmt: skip
        services = Services(env, folder)
        services.start("api")  # migrates the database
        key = api_key(env, "soak")
        services.start("worker")
        services.start("beat")
        load = Load(plan, services, key, settings)
        began = time.monotonic()
        load.start()
        chaos = Chaos(plan, services, pg, redis_, stub)
        chaos.run(began + plan.minutes * 60)
        time.sleep(max(0.0, began + plan.minutes * 60 - time.monotonic()))
        services.revive()
        load.stop()
        minutes = (time.monotonic() - began) / 60
        last = max(chaos.last_healed, time.monotonic())  # load stopped after the last fault
        print(f"soak: load stopped after {minutes:.1f} min; measuring", flush=True)

        engine = sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://"))
        sids = [s.session_id for s in load.sessions]
        all_sids = sids + [r.session_id for r in load.runs]
        time.sleep(max(0.0, last + OVER_AFTER_S - time.monotonic()))
        sizes = final_sizes(settings, [s.session_id for s in load.sessions])
        threshold = settings.summarization_threshold_chars
        over = [f"{s}: {n:,} chars" for s, n in sizes.items() if n > threshold]
        time.sleep(max(0.0, last + settings.job_lease_s + 2 * settings.reconcile_interval_s - time.monotonic()))  # fmt: skip
        with engine.connect() as conn:
            stuck = [
                f"{r.job_id[:8]} {r.status} ({r.session_id})"
                for r in conn.execute(
                    sa.text(
                        "SELECT job_id, session_id, status FROM compaction_jobs WHERE status IN ('queued', 'running')"
                    )  # fmt: skip
                )
            ]
        rows, changed = settle(engine, all_sids, settings.reconcile_interval_s + 2, timeout=600)
        services.revive()
        at_rest = all(r["status"] in ("applied", "skipped", "failed", "reverted", "prepared") for r in rows)  # fmt: skip
        with engine.connect() as conn:
            twice = int(
                conn.execute(
                    sa.text(
                        "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM usage_events "
                        "WHERE job_id IS NOT NULL GROUP BY job_id HAVING count(*) > 1) AS t"
                    )
                ).scalar()
            )
        problems, where = check_threads(settings, load.sessions, engine)
        a_found, a_lost, a_orphans = agent_found(load.runs, engine, settings)
        lost = [f"{s}: {p}" for s, ps in problems.items() for p in ps if "lost" in p]
        mismatch = [f"{s}: {p}" for s, ps in problems.items() for p in ps if "usage rows" in p]
        other = [f"{s}: {p}" for s, ps in problems.items() for p in ps if "lost" not in p and "usage rows" not in p]  # fmt: skip
        api_posted = sum(len(s.posted) for s in load.sessions)
        figures = Figures(
            plan=plan,
            minutes=minutes,
            link=link.kind,
            faults=chaos.done,
            sessions=load.sessions,
            runs=load.runs,
            posted=api_posted + sum(len(r.posted) for r in load.runs if r.error is None),
            found=api_posted - where["lost"] + a_found,
            stuck=stuck,
            twice=twice,
            usage_mismatch=mismatch,
            over=over,
            orphans=api_orphans(settings, sids) + a_orphans,
            lost=lost + a_lost,
            jobs=Counter(r["status"] for r in rows),
            settled_s=max(0.0, changed - last) if at_rest else None,
            unexpected=services.unexpected,
            client_errors=load.errors,
            log_errors=log_errors([services.log(n) for n in ("api", "worker", "beat")]),
            silent_s=load.silent_s,
            silent_at=load.silent_at,
        )
        if other:
            figures.notes.append(f"other thread problems: {'; '.join(other[:5])}")
        with httpx.Client(timeout=10) as http:  # the stack still answers
            figures.notes.append(
                f"/healthz at the end: {http.get(f'{services.url}/healthz').status_code}"
            )
        return figures
    finally:
        if load is not None and not load.stopping.is_set():
            load.stop(settle_s=0)
        if engine is not None:
            engine.dispose()
        if services is not None:
            services.stop()
        if stub is not None:
            stub.shutdown()
        if redis_ is not None:
            redis_.proc.kill()
            redis_.proc.wait(timeout=30)
        if pg is not None:
            pg.stop()
        link.clear()
        link.close()
        for db in folder.glob("agent-*.db*"):  # the own agent's checkpoints: a GB an hour
            db.unlink()


def result(figures: Figures, command: str) -> Result:
    return Result(
        "22. Chaos soak",
        "every posted message in its thread or archive; 0 job rows stuck, 0 usage events counted "
        "twice, 0 threads over their threshold 60 s after the last fault, 0 orphaned calls",
        f"{figures.minutes:.0f} min, {len(figures.faults)} faults: {figures.found:,}/{figures.posted:,} messages kept; "
        f"{len(figures.stuck)} stuck; {figures.twice} counted twice; {len(figures.over)} over; "
        f"{len(figures.orphans)} orphans",
        figures.met,
        [f"`{command}`", *figures.details()],
        table=figures.table(),
    )


def run(ctx: Context) -> Result:
    """``python -m bench --only soak``: ``SOAK_MINUTES`` (default 60; ``--quick``: the short plan)."""
    minutes = float(os.environ.get("SOAK_MINUTES", "4" if ctx.quick else "60"))
    plan = Plan.short(minutes) if ctx.quick else replace(Plan(), minutes=minutes)
    command = f"SOAK_MINUTES={minutes:g} python -m bench --only soak" + (
        " --quick" if ctx.quick else ""
    )
    return result(soak(plan), command)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument(
        "--short", action="store_true", help="the short plan (12 sessions, faults seconds apart)"
    )
    parser.add_argument("--sessions", type=int, help="how many client sessions (default 50)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--logs", type=Path, help="folder for the processes' logs (default: a new temporary one)"
    )
    args = parser.parse_args()
    plan = (
        Plan.short(args.minutes, args.seed)
        if args.short
        else Plan(minutes=args.minutes, seed=args.seed)
    )
    if args.sessions:
        plan = replace(
            plan, sessions=args.sessions, chat_sessions=min(plan.chat_sessions, args.sessions)
        )
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    figures = soak(plan, args.logs)
    command = "python -m bench.soak " + " ".join(sys.argv[1:])
    r = result(figures, command.strip())
    print("\n".join(["", *figures.table(), "", *[f"- {d}" for d in r.details]]))
    sys.exit(0 if figures.met else 1)


if __name__ == "__main__":
    main()
