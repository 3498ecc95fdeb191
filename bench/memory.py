"""Benchmark 6, worker memory: resident memory of one worker process at the default
concurrency (every job slot busy), with threads of realistic size, across many jobs."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

from bench.common import RUN_ID, Context, Result, finished, seed, start_worker, wait

NAME = "memory"

#: A job's LLM call: long enough for every slot of the default concurrency to be busy.
LLM_DELAY_S = 1.0


def run(ctx: Context) -> Result:
    import psutil

    from bench.workloads import thread
    from offpath.agent.graph import open_runtime
    from offpath.config import get_settings
    from offpath.stores.db.transitions import create_job

    settings = get_settings()
    conc = settings.worker_concurrency
    jobs = 500 if ctx.quick else 2_000
    batch = 2 * conc  # two waves: every slot busy
    rt = open_runtime(settings)
    ctx.stub.set_delay(LLM_DELAY_S)
    env = {**os.environ, "WORKER_POOL": "threads", "WORKER_CONCURRENCY": str(conc)}
    worker = start_worker(env, f"bench-mem-{RUN_ID}@%h", subprocess.DEVNULL)
    samples: list[tuple[int, float]] = []
    peak = 0.0
    try:
        proc = psutil.Process(worker.pid)
        rest = 0.0  # ready, no job taken yet: the RSS once it holds within 1% for a second
        for _ in range(30):
            time.sleep(1.0)
            now = proc.memory_info().rss / 2**20
            if rest and abs(now - rest) <= 0.01 * rest:
                break
            rest = now
        done = 0
        while done < jobs:
            sids = []
            for k in range(batch):
                sid = f"mem-{RUN_ID}-{done + k}"
                # realistic threads: 120 messages, ~90,000 chars (over the 60,000 threshold)
                seed(rt, sid, thread(120, 90_000, seed=k % 40, prefix=sid))
                job_id = uuid.uuid4().hex
                create_job(rt.engine, job_id, sid, 90_000)
                rt.publish(sid, job_id)
                sids.append(sid)

            def drained(s: list[str] = sids) -> bool:
                nonlocal peak
                peak = max(peak, proc.memory_info().rss / 2**20)
                return finished(rt, s) >= len(s)

            wait(drained, 600, interval=0.2)
            done += batch
            samples.append((done, proc.memory_info().rss / 2**20))
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        ctx.stub.set_delay(0.0)
        rt.close()
    warm_at = samples[min(1, len(samples) - 1)]
    warm, last = warm_at[1], samples[-1][1]
    growth = (last - warm) / warm
    return Result(
        "6. Worker memory",
        "at the default concurrency: resident memory growth < 10% after warm-up",
        f"threads x{conc}: {rest:.0f} MiB at rest, {samples[0][1]:.0f} MiB after {samples[0][0]:,} jobs, {warm:.0f} MiB after "
        f"{warm_at[0]:,}, {last:.0f} MiB after {samples[-1][0]:,} ({growth * 100:+.1f}% after warm-up, "
        f"{(last - rest) / rest * 100:+.0f}% from rest); "
        f"peak {peak:.0f} MiB, {peak / conc:.2f} MiB per slot",
        growth < 0.10,
        [
            f"one worker process, threads pool x{conc} (the default), every slot busy (batches of {batch} jobs, "
            f"stub LLM {LLM_DELAY_S:.0f} s); threads of 120 messages / ~90,000 chars on PostgreSQL; RSS after each "
            "batch: " + ", ".join(f"{n:,}: {m:.0f}" for n, m in samples)
        ],
    )
