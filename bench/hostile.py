"""Hostile input (issue 20): what requests no client should be able to use against the API
cost it, on a real API process (PostgreSQL, the stub LLM).

* **unauthenticated bodies**: 4 clients at once each send a whole 64 MiB body with no key
  (raw sockets, no ``Expect: 100-continue``: every byte goes on the wire) while another
  polls ``/healthz``; target: the API's resident memory grows < 10 MB, ``/healthz`` p99
  < 100 ms;
* **authenticated shapes**: one request each, on a fresh API process (its memory is not
  what an earlier shape left): a 30 MB string, a 10,000-message turn, the issue's million-
  item list, 199,000 values in ``state``, 5,000 levels of nesting, 8 MB of ``[]``; targets:
  memory growth <= 3x the body, the event loop never wakes > 100 ms late (the API's
  ``offpath_api_event_loop_lag_seconds``; ``/healthz``, polled all along, is reported too);
* **injection**: ``tests/injection.py``'s variants through each channel (tool content, tool
  names, tool call arguments, additional_kwargs), summarized by the offline summarizer and
  by a model that copies every line it reads, each with the fact guard; target: 0 stated
  as plain text in any summary, pinned line or offline section;
* **schemathesis**: ``--checks all`` with a key against the API on each backend, for
  ``BENCH_FUZZ_SECONDS`` (default 1800; ``--quick``: 30); target: 0 x 5xx, 0 answers off
  the document.

The streaming parser measured against ours (``api/limits/``): ijson 3.6 (yajl2_c) fed a 30
MB string in 16 KiB chunks took 18 s and 15 M escapes 194 s (it re-scans its buffer at each
chunk); our scan takes ~10 ms and ~200 ms (2026-12-01, this host).
"""

from __future__ import annotations

import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.common import (
    ROOT,
    RUN_ID,
    Context,
    Result,
    api_key,
    api_up,
    free_port,
    start_api,
    start_worker,
    wait,
)

NAME = "hostile"
MB = 2**20
#: Targets (issue 20).
UNAUTH_GROWTH_MB = 10.0
HEALTHZ_P99_MS = 100.0
BODY_RATIO = 3.0
STALL_MS = 100.0


def loop_lags(url: str, key: str) -> dict[float, int]:
    """The API's ``offpath_api_event_loop_lag_seconds`` buckets: upper bound -> count."""
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {key}"}).text
    out = {}
    for line in text.splitlines():
        if line.startswith("offpath_api_event_loop_lag_seconds_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float("inf") if le == "+Inf" else float(le)] = int(float(line.rsplit(" ", 1)[1]))
    return out


@dataclass
class Watch:
    """Polls ``/healthz``, samples the API's resident memory and reads its event-loop lag
    (the API's own ``offpath_api_event_loop_lag_seconds``, sampled every 50 ms) while
    something runs."""

    url: str
    pid: int
    key: str
    latencies: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Watch:
        self.lags_before = loop_lags(self.url, self.key)
        self.base = psutil.Process(self.pid).memory_info().rss
        self._threads = [
            threading.Thread(target=self._poll, daemon=True),
            threading.Thread(target=self._sample, daemon=True),
        ]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)
        time.sleep(0.1)  # the last sample lands
        after = loop_lags(self.url, self.key)
        self.lags = {le: after[le] - self.lags_before.get(le, 0) for le in after}

    @property
    def stalls(self) -> int:
        """Event-loop wake-ups more than 100 ms late."""
        return self.lags[float("inf")] - self.lags[0.1]

    @property
    def worst_lag_ms(self) -> str:
        """The bucket the latest wake-up falls in (``<= 50 ms``)."""
        total = self.lags[float("inf")]
        bound = min(le for le, n in self.lags.items() if n == total)
        return "> 5 s" if bound == float("inf") else f"<= {bound * 1000:g} ms"

    def _poll(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            while not self._stop.is_set():
                t = time.perf_counter()
                http.get("/healthz")
                self.latencies.append((time.perf_counter() - t) * 1000)
                time.sleep(0.02)

    def _sample(self) -> None:
        proc = psutil.Process(self.pid)
        while not self._stop.is_set():
            self.rss.append(proc.memory_info().rss)
            time.sleep(0.01)

    @property
    def growth_mb(self) -> float:
        return (max(self.rss, default=self.base) - self.base) / MB

    def p99(self) -> float:
        return percentile(self.latencies, 99)

    def worst(self) -> float:
        return max(self.latencies, default=0.0)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


class Api:
    """A fresh API process with its own log, an admin key on the bench's database."""

    def __init__(self, env: dict[str, str], folder: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(folder / f"api-{self.port}.log", "wb")  # noqa: SIM115 - closed in stop
        self.proc = start_api(env, self.port, self.log)
        self.http = httpx.Client(base_url=self.url, timeout=120)
        wait(lambda: api_up(self.http), 60)
        self.http.get("/healthz")  # warm: the first answers import and connect
        self.key = api_key(env, "hostile")

    def stop(self) -> None:
        self.http.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def raw_post(port: int, path: str, body: bytes, key: str | None = None) -> int:
    """POST ``body`` whole over a raw socket (no ``Expect``, kept alive: every byte is sent
    and read by the server, whenever its answer comes); returns the status."""
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{auth}\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=300) as sock:
        sock.sendall(head)
        view = memoryview(body)
        try:
            for at in range(0, len(body), MB):
                sock.sendall(view[at : at + MB])
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered and closed before the end: what is read next says how
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return int(answer.split()[1]) if answer else 0


def unauthenticated(env: dict[str, str], folder: Path) -> tuple[list[str], bool, str]:
    """4 x 64 MiB without a key, at once."""
    api = Api(env, folder)
    body = b'{"messages": [{"type": "human", "content": "' + b"x" * (64 * MB - 50) + b'"}]}'
    try:
        statuses: list[int] = []
        took: list[float] = []
        with Watch(api.url, api.proc.pid, api.key) as watch:
            time.sleep(0.5)

            def send() -> None:
                t = time.perf_counter()
                statuses.append(raw_post(api.port, "/sessions/hostile/turns", body))
                took.append(time.perf_counter() - t)

            senders = [threading.Thread(target=send) for _ in range(4)]
            for s in senders:
                s.start()
            for s in senders:
                s.join()
            time.sleep(0.5)
    finally:
        api.stop()
    met = watch.growth_mb < UNAUTH_GROWTH_MB and watch.p99() < HEALTHZ_P99_MS
    line = (
        f"4 x 64 MiB without a key: answers {sorted(set(statuses))}, each sent in "
        f"{statistics.median(took):.1f} s (median); API memory +{watch.growth_mb:.1f} MB; "
        f"/healthz p99 {watch.p99():.0f} ms, max {watch.worst():.0f} ms over "
        f"{len(watch.latencies)} polls; event loop: latest wake-up {watch.worst_lag_ms} late, "
        f"{watch.stalls} over 100 ms"
    )
    return [line], met, f"+{watch.growth_mb:.1f} MB, /healthz p99 {watch.p99():.0f} ms"


def shapes() -> list[tuple[str, bytes]]:
    """The authenticated shapes: (what, body)."""

    def turn(**extra: Any) -> dict[str, Any]:
        return {"messages": [{"type": "human", "content": "x"}], **extra}

    return [
        (
            "a 30 MB string",
            json.dumps({"messages": [{"type": "human", "content": "x" * 30_000_000}]}).encode(),
        ),
        (
            "10,000 messages (the cap)",
            json.dumps(
                {"messages": [{"type": "human", "content": f"m{i}"} for i in range(10_000)]}
            ).encode(),
        ),
        ("a million items (2 MB)", b'{"messages": [' + b",".join([b"0"] * 1_000_000) + b"]}"),
        ("199,000 values in state", json.dumps(turn(state={"a": [0] * 199_000})).encode()),
        ("5,000 levels", ('{"messages": ' + "[" * 5000 + "]" * 5000 + "}").encode()),
        ("8 MB of []", b'{"messages": [' + b",".join([b"[]"] * 2_700_000) + b"]}"),
    ]


def authenticated(env: dict[str, str], folder: Path) -> tuple[list[str], bool, list[str]]:
    rows = [
        "| shape | body | answer | took | API memory growth | x body | event loop: latest "
        "wake-up, wake-ups > 100 ms late | /healthz max (p99) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    met = True
    for what, body in shapes():
        api = Api(env, folder)
        key = api.key
        try:
            with Watch(api.url, api.proc.pid, key) as watch:
                time.sleep(0.3)
                t = time.perf_counter()
                status = raw_post(
                    api.port, f"/sessions/h-{random.randrange(10**9)}/turns", body, key
                )
                took = time.perf_counter() - t
                time.sleep(0.3)
        finally:
            api.stop()
        ratio = watch.growth_mb * MB / len(body)
        ok = ratio <= BODY_RATIO and watch.stalls == 0
        met = met and ok
        rows.append(
            f"| {what} | {len(body) / MB:.1f} MiB | {status} | {took:.2f} s | "
            f"+{watch.growth_mb:.1f} MB | {ratio:.1f}x | {watch.worst_lag_ms}, "
            f"{watch.stalls} | {watch.worst():.0f} ms ({watch.p99():.0f} ms) |"
        )
    return rows, met, []


def injection() -> tuple[list[str], bool, str]:
    """The variants through each channel, each summarizer (no server: the summarizers are
    the same code the worker runs)."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from injection import CHANNELS, VARIANTS, copying_answer, quoted, stated, tail, turns
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    from offpath.compaction.formats import to_messages
    from offpath.compaction.planner import plan_compaction
    from offpath.compaction.prompt import build_prompt
    from offpath.compaction.summarizers.guarded import GuardedSummarizer
    from offpath.compaction.summarizers.offline import OfflineSummarizer
    from offpath.config import load_settings
    from offpath.llm import LLMSummarizer

    s = load_settings(summarization_threshold_chars=30_000, summarization_keep_chars=10_000)
    rows = [
        "| channel | summarizer | variants | stated as plain text | quoted as data |",
        "|---|---|---|---|---|",
    ]
    total = 0
    for channel in CHANNELS:
        plan = plan_compaction(to_messages(turns(channel) + tail()), s, force=True)
        prompt = build_prompt(plan, s.summarization_max_prompt_chars)
        for name in ("offline", "copying LLM"):
            if name == "offline":
                inner: Any = OfflineSummarizer()
            else:
                answer = AIMessage(content=copying_answer(prompt.user))
                inner = LLMSummarizer(GenericFakeChatModel(messages=iter([answer])), "copying")
            text = GuardedSummarizer(inner, s.summary_pinned_max_chars).summarize(plan, prompt).text
            n = len(stated(text))
            total += n
            rows.append(f"| {channel} | {name} | {len(VARIANTS)} | {n} | {len(quoted(text)) - n} |")
    return rows, total == 0, f"{total} of {len(VARIANTS)} x {len(CHANNELS)} x 2 stated"


def fuzzing(ctx: Context, env: dict[str, str], folder: Path) -> tuple[list[str], bool, str]:
    """schemathesis on each backend for BENCH_FUZZ_SECONDS, against an API with a worker and
    ``offpath beat`` beside it (as in production: ``/readyz`` says whether they run)."""

    sys.path.insert(0, str(ROOT / "tests"))
    from integration.test_fuzz import fuzz

    seconds = int(os.environ.get("BENCH_FUZZ_SECONDS", "30" if ctx.quick else "1800"))
    seed = int(os.environ.get("BENCH_FUZZ_SEED", str(random.randrange(2**31))))
    lines, met, summary = [], True, []
    if seconds <= 0:
        return ["schemathesis: skipped (BENCH_FUZZ_SECONDS=0)"], False, "skipped"
    for backend in ("sqlite", "postgres"):
        data = folder / f"data-{backend}"
        benv = {**env, "DATA_DIR": str(data)}
        if backend == "sqlite":
            benv["DATABASE_URL"] = ""
        api = Api(benv, folder)
        key = api.key
        run_dir = folder / f"fuzz-{backend}"
        run_dir.mkdir()
        # /readyz answers 200 only with a worker on the queue and the reconciler's passes
        # seen: the fuzzed API runs beside both, as in production
        log = open(folder / f"worker-beat-{backend}.log", "wb")  # noqa: SIM115 - closed below
        helpers = [
            start_worker(benv, f"hostile-{backend}-{RUN_ID}@%h", log),
            subprocess.Popen(
                [sys.executable, "-m", "offpath.cli.main", "beat"],
                cwd=ROOT,
                env=benv,
                stdout=log,
                stderr=subprocess.STDOUT,
            ),
        ]
        try:
            wait(lambda a=api: a.http.get("/readyz").status_code == 200, 180, 1.0)
            run = fuzz(api.url, key, seconds, seed, run_dir)
        finally:
            api.stop()
            for proc in helpers:
                proc.terminate()
                proc.wait(timeout=60)
            log.close()
        off = len(run.problems) - run.server_errors
        met = met and not run.problems
        twohundred = sum(n for (_, status), n in run.statuses.items() if status == 200)
        slow = sum(n for reason, n in run.expected.items() if reason.startswith("slow"))
        lines.append(
            f"{backend}: {run.seconds / 60:.1f} min (seed {seed}), {len(run.exchanges)} requests "
            f"({twohundred} answered 200), {run.server_errors} x 5xx, {off} other problems"
            + (f": {run.problems[0][:300]}" if run.problems else "")
            + f"; {slow} answers over schemathesis's 10 s (counted, not judged)"
        )
        summary.append(
            f"{backend} {run.seconds / 60:.0f} min: {run.server_errors} x 5xx, {off} off"
        )
    return lines, met, "; ".join(summary)


def run(ctx: Context) -> Result:
    env = dict(os.environ)
    folder = Path(tempfile.mkdtemp(prefix="hostile-"))
    load_before = os.getloadavg()
    unauth_lines, unauth_met, unauth = unauthenticated(env, folder)
    auth_rows, auth_met, _ = authenticated(env, folder)
    inj_rows, inj_met, inj = injection()
    fuzz_lines, fuzz_met, fuzzed = fuzzing(ctx, env, folder)
    return Result(
        "13. Hostile input",
        f"unauthenticated 4 x 64 MiB: memory < {UNAUTH_GROWTH_MB:.0f} MB, /healthz p99 < "
        f"{HEALTHZ_P99_MS:.0f} ms; any authenticated request: memory <= {BODY_RATIO:.0f}x its "
        f"body, no event-loop wake-up > {STALL_MS:.0f} ms late; injection variants: 0 stated as plain "
        "text; schemathesis 30 min per backend: 0 x 5xx, 0 off the document",
        f"unauthenticated {unauth}; authenticated shapes {'met' if auth_met else 'see the table'}; "
        f"injection {inj}; schemathesis {fuzzed}",
        unauth_met and auth_met and inj_met and fuzz_met,
        details=[
            *unauth_lines,
            "authenticated shapes: one request each on a fresh API process (PostgreSQL), "
            "memory = peak resident memory while it ran minus before; /healthz polled every "
            "20 ms meanwhile (an event-loop stall shows as its wait)",
            *fuzz_lines,
            "host load average (1, 5, 15 min) at the start: "
            + ", ".join(f"{x:.1f}" for x in load_before)
            + "; at the end: "
            + ", ".join(f"{x:.1f}" for x in os.getloadavg())
            + f" ({os.cpu_count()} cores: above that, other work shared the CPU, and the event "
            "loop waits for a thread the host has not scheduled)",
            f"logs and reports: {folder}",
        ],
        limits="an accepted body becomes Python objects (pydantic models, then LangChain "
        "messages): a body of many small values costs far more than 3x its bytes (the "
        "10,000-message row), bounded by MAX_JSON_VALUES and MAX_TURN_MESSAGES; and on a busy "
        "2-core host the event loop waits for the GIL held by the thread that parses, "
        "validates or converts a large body",
        table=[*auth_rows, "", *inj_rows],
    )
