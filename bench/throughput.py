"""Benchmark 3, throughput with a 2 s LLM: compactions per second at steady state, with the
memory each concurrent job slot costs, side by side in one run:

* one worker process, threads pool, at several concurrencies (where one process's CPU,
  its GIL, tops out: the ceiling the default concurrency comes from);
* ``offpath worker`` as users run it: one process per core at the default concurrency;
* prefork at its default concurrency (one process per core), for memory per slot.

The rate is taken at steady state: the jobs that ended between the first and the last
quarter of the run, over that time (start-up and the last partial wave left out).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import ROOT, RUN_ID, Context, Result, finished, med, seed, start_worker, wait

NAME = "throughput"

LLM_DELAY_S = 2.0
#: Targets (issue 13, item 3).
MIN_PER_PROCESS = 50.0
MIN_HOST = 75.0
#: Jobs per run: this many times the concurrent jobs.
WAVES = 2


def start_offpath_worker(env: dict[str, str], name: str, out: Any) -> subprocess.Popen[bytes]:
    """``offpath worker`` (one process per core, ``WORKER_CONCURRENCY`` each), as users run it."""
    cmd = [sys.executable, "-m", "offpath.cli.main", "worker", "--name", name]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def steady_rate(rt: Any, sids: list[str]) -> float:
    """Jobs per second between the first and the last quarter of the jobs that ended."""
    import sqlalchemy as sa

    with rt.engine.connect() as conn:
        q = sa.text(
            "SELECT updated_at FROM compaction_jobs WHERE status = 'applied' "
            "AND session_id = ANY(:s) ORDER BY updated_at"
        )
        ends = [r[0] for r in conn.execute(q, {"s": sids})]
    a, b = len(ends) // 4, (3 * len(ends)) // 4
    seconds = (ends[b] - ends[a]).total_seconds()
    return (b - a) / seconds if seconds > 0 else 0.0


def rss_mib(proc: subprocess.Popen[bytes], celery_only: bool) -> float:
    """Resident memory of ``proc``'s Celery processes (itself, if it is one, and its
    descendants), MiB."""
    import psutil

    root = psutil.Process(proc.pid)
    procs = root.children(recursive=True) + ([] if celery_only else [root])
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def one_run(
    rt: Any, env: dict[str, str], label: str, jobs: int, start: Any, celery_only: bool
) -> tuple[float, float]:
    """``jobs`` compactions through the workers ``start`` starts: (steady rate, peak RSS MiB)."""
    from bench.workloads import thread
    from offpath.stores.db.transitions import create_job

    log = open(Path(tempfile.gettempdir()) / f"bench-tp-{RUN_ID}-{label}.log", "ab")  # noqa: SIM115
    sids = []
    for k in range(jobs):
        sid = f"tp-{label}-{RUN_ID}-{k}"
        messages = thread(40, 70_000, seed=k % 50, prefix=sid)
        seed(rt, sid, messages)
        rt.facts.remember(messages)  # found as they arrived: the post-turn hook's store
        sids.append(sid)
    worker = start(env, f"tp-{label}-{RUN_ID}@%h", log)
    peak = 0.0
    try:
        time.sleep(4.0)  # start-up
        for sid in sids:
            job_id = uuid.uuid4().hex
            create_job(rt.engine, job_id, sid, 70_000)
            rt.publish(sid, job_id)

        def done() -> bool:
            nonlocal peak
            peak = max(peak, rss_mib(worker, celery_only))
            return finished(rt, sids) >= jobs

        wait(done, 900, interval=0.5)
        return steady_rate(rt, sids), peak
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        log.close()


def run(ctx: Context, runs: int | None = None) -> Result:
    from offpath.agent.graph import open_runtime
    from offpath.config import get_settings

    settings = get_settings()
    default = settings.worker_concurrency
    cores = os.cpu_count() or 1
    runs = runs or 1
    sweep = sorted({64, default, 2 * default} if not ctx.quick else {default})
    rt = open_runtime(settings)
    ctx.stub.set_delay(LLM_DELAY_S)
    rates: dict[str, list[float]] = {}
    mem: dict[str, list[float]] = {}
    slots: dict[str, int] = {}

    def record(label: str, conc: int, rate: float, peak: float) -> None:
        rates.setdefault(label, []).append(rate)
        mem.setdefault(label, []).append(peak)
        slots[label] = conc

    try:
        for r in range(runs):
            for c in sweep:  # one process, threads, concurrency c
                env = {**os.environ, "WORKER_POOL": "threads", "WORKER_CONCURRENCY": str(c)}
                rate, peak = one_run(
                    rt, env, f"t{c}-{r}", WAVES * c, start_worker, celery_only=False
                )
                record(f"1 process, threads x{c}", c, rate, peak)
            # the same process without the fact guard: what the rest of a job costs
            env = {
                **os.environ,
                "WORKER_POOL": "threads",
                "WORKER_CONCURRENCY": str(default),
                "SUMMARY_PINNED_MAX_CHARS": "0",
            }
            rate, peak = one_run(
                rt, env, f"ng-{r}", WAVES * default, start_worker, celery_only=False
            )
            record(f"1 process, threads x{default}, fact guard off", default, rate, peak)
            env = {
                **os.environ,
                "WORKER_POOL": "threads",
                "WORKER_CONCURRENCY": str(default),
                "WORKER_PROCESSES": "0",
            }
            n = WAVES * default * cores
            rate, peak = one_run(rt, env, f"host-{r}", n, start_offpath_worker, celery_only=True)
            record(f"offpath worker: {cores} processes x{default}", cores * default, rate, peak)
            env = {**os.environ, "WORKER_POOL": "prefork", "WORKER_CONCURRENCY": str(cores)}
            rate, peak = one_run(rt, env, f"pf-{r}", 4 * cores, start_worker, celery_only=False)
            record(f"prefork x{cores}", cores, rate, peak)
    finally:
        ctx.stub.set_delay(0.0)
        rt.close()
    medians = {k: med(v) for k, v in rates.items()}
    per_process = medians[f"1 process, threads x{default}"]
    host = medians[f"offpath worker: {cores} processes x{default}"]
    lines = [
        "| workers | concurrent jobs | compactions/s (steady) | peak RSS | RSS per concurrent job |",
        "|---|---|---|---|---|",
    ]
    for k in rates:
        m = med(mem[k])
        lines.append(
            f"| {k} | {slots[k]} | {medians[k]:.1f} | {m:.0f} MiB | {m / slots[k]:.2f} MiB |"
        )
    ceiling = max(medians[f"1 process, threads x{c}"] for c in sweep)
    return Result(
        "3. Throughput with a 2 s LLM",
        f">= {MIN_PER_PROCESS:.0f} compactions/s per worker process; >= {MIN_HOST:.0f}/s on this {cores}-core host",
        f"one process x{default}: {per_process:.1f}/s; offpath worker ({cores} processes x{default}): {host:.1f}/s",
        per_process >= MIN_PER_PROCESS and host >= MIN_HOST,
        [
            f"{runs} run(s) each, side by side; {WAVES} waves of jobs per run ({WAVES} x the concurrent jobs); threads of "
            f"40 messages / ~70,000 chars on PostgreSQL; stub LLM answering in {LLM_DELAY_S:.0f} s (its own process, "
            "on the same host); steady rate = the jobs that ended between the first and the last quarter, over "
            "that time; each thread's messages had their facts stored as they arrived (the post-turn hook's "
            "FactStore in Redis, before the workers start), as in benchmark 2",
            f"a process's ceiling (its GIL: a job's CPU is spent in one interpreter): best one-process rate "
            f"{ceiling:.1f}/s; with a {LLM_DELAY_S:.0f} s LLM a process needs about 2 x the rate in concurrent jobs, "
            f"so the default WORKER_CONCURRENCY is {default}, and `offpath worker` starts one process per core",
            "per-run rates: "
            + "; ".join(f"{k} {', '.join(f'{x:.1f}' for x in v)}" for k, v in rates.items()),
        ],
        "a process tops out when its jobs' CPU fills one core (per-job CPU: benchmark 2); the host's "
        "ceiling is its cores, shared here with PostgreSQL, Redis and the stub LLM; prefork pays a whole "
        "process per concurrent job",
        lines,
    )
