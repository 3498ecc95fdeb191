"""Benchmark 21, API memory over time: resident memory of one API process (uvicorn) under a
steady load of chat turns, sampled every 10 s, with a worker and beat compacting behind it.

Clients post turns at a steady pace and move to a new session every ``TURNS_PER_SESSION``
turns, so what the API keeps per turn and what it keeps per session both show. Reported:
the RSS at rest, after 2 minutes, and at the end (the target: the end <= 1.2x the 2-minute
figure), and the growth per turn over the run's second half (KiB).
``BENCH_API_MEMORY_MINUTES`` sets the run's length (default 20; ``--quick``: 3).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench.common import (
    REDIS_URL,
    RUN_ID,
    Context,
    Result,
    base_env,
)
from bench.load import TURN_CHARS, start_stack, stop

NAME = "api-memory"

CLIENTS = 10
#: Turns a client posts to one session before it starts another.
TURNS_PER_SESSION = 40
#: Seconds between a client's turns.
PACE_S = 0.5
THRESHOLD_CHARS = 30_000
KEEP_CHARS = 10_000
TARGET_RATIO = 1.2


def post_turns(url: str, k: int, until: float, counts: list[int], sessions: list[int]) -> None:
    """Client ``k``: a turn every ``PACE_S`` until ``until`` (monotonic), a new session every
    ``TURNS_PER_SESSION`` turns; ``counts[k]`` and ``sessions[k]`` count what it posted."""
    import httpx

    from bench.workloads import turn_messages

    with httpx.Client(base_url=url, timeout=60) as http:
        i = 0
        while time.monotonic() < until:
            sid = f"apimem-{RUN_ID}-{k}-{i // TURNS_PER_SESSION}"
            if i % TURNS_PER_SESSION == 0:
                sessions[k] += 1
            messages = turn_messages(i % TURNS_PER_SESSION, TURN_CHARS, k, sid)
            try:
                r = http.post(f"/sessions/{sid}/turns", json={"messages": messages})
            except httpx.HTTPError:
                i += 1
                continue
            if r.status_code == 409:  # the thread is being patched: the same turn again
                time.sleep(0.05)
                continue
            counts[k] += r.status_code == 200
            i += 1
            time.sleep(PACE_S)


def run(ctx: Context) -> Result:
    import psutil

    minutes = float(os.environ.get("BENCH_API_MEMORY_MINUTES", "3" if ctx.quick else "20"))
    queue = f"bench-apimem-{RUN_ID}"
    folder = Path(tempfile.mkdtemp(prefix=f"bench-apimem-{RUN_ID}-"))
    env = {
        **os.environ,
        **base_env(
            ctx.pg_url,
            queue,
            OPENAI_BASE_URL=ctx.stub.base_url if ctx.stub else "",
            SUMMARIZATION_THRESHOLD_CHARS=str(THRESHOLD_CHARS),
            SUMMARIZATION_KEEP_CHARS=str(KEEP_CHARS),
            DATA_DIR=str(folder / "data"),
            AUTH_DISABLED="true",
        ),
    }
    logs = {name: folder / f"{name}.log" for name in ("api", "worker", "beat")}
    outs = {name: open(path, "ab") for name, path in logs.items()}  # noqa: SIM115
    procs: list[subprocess.Popen[bytes]] = []
    samples: list[tuple[float, int, float]] = []  # (minutes, turns posted, RSS MiB)
    counts, sessions = [0] * CLIENTS, [0] * CLIENTS
    try:
        # its processes log at WARNING (base_env): beat's start is not waited for
        url = start_stack(env, f"bench-apimem-{RUN_ID}", logs, outs, procs, wait_beat=False)
        proc = psutil.Process(procs[0].pid)  # the API
        rest = proc.memory_info().rss / 2**20
        began = time.monotonic()
        until = began + minutes * 60
        clients = [
            threading.Thread(target=post_turns, args=(url, k, until, counts, sessions), daemon=True)
            for k in range(CLIENTS)
        ]
        for c in clients:
            c.start()
        while time.monotonic() < until:
            time.sleep(10.0)
            at = (time.monotonic() - began) / 60
            samples.append((at, sum(counts), proc.memory_info().rss / 2**20))
        for c in clients:
            c.join(timeout=90)
    finally:
        stop(procs)
        for out in outs.values():
            out.close()
        import redis

        redis.Redis.from_url(REDIS_URL).flushdb()

    two = next((s for s in samples if s[0] >= 2.0), samples[0])
    end = samples[-1]
    half = next(s for s in samples if s[0] >= end[0] / 2)
    per_turn_kib = (end[2] - half[2]) * 1024 / max(1, end[1] - half[1])
    ratio = end[2] / two[2]
    table = ["| minutes | turns posted | API RSS MiB |", "|---|---|---|"]
    step = max(1, len(samples) // 12)
    table += [f"| {m:.1f} | {n} | {rss:.0f} |" for m, n, rss in samples[::step]]
    if samples[-1] not in samples[::step]:
        table.append(f"| {end[0]:.1f} | {end[1]} | {end[2]:.0f} |")
    return Result(
        "21. API memory over time",
        f"API RSS after {minutes:.0f} min of turns <= {TARGET_RATIO}x its RSS after 2 min",
        f"{rest:.0f} MiB at rest, {two[2]:.0f} MiB at 2 min, {end[2]:.0f} MiB at {end[0]:.0f} min "
        f"({ratio:.2f}x); {per_turn_kib:.1f} KiB per turn over the second half",
        ratio <= TARGET_RATIO if minutes >= 10 else None,
        [
            f"{CLIENTS} clients, a turn each every {PACE_S} s (~{TURN_CHARS:,} chars: a question, "
            f"a tool call with its log, an answer), a new session every {TURNS_PER_SESSION} turns; "
            f"{sum(counts)} turns in {sum(sessions)} sessions; threshold {THRESHOLD_CHARS:,} / "
            f"keep {KEEP_CHARS:,}; one API, one worker, one beat on PostgreSQL and Redis; "
            f"the host's load average at the end {os.getloadavg()[0]:.1f}",
        ],
        table=table,
    )
