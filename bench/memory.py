"""Benchmark 6, worker memory: resident memory of one threads-pool worker across many jobs."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

from bench.common import RUN_ID, Context, Result, finished, start_worker, wait

NAME = "memory"


def run(ctx: Context) -> Result:
    import psutil
    from offpath.worker.tasks import publish

    from bench.workloads import thread
    from offpath.compaction.settings import get_settings
    from offpath.service.agent import AGENT_NODE, thread_config
    from offpath.service.db import create_job
    from offpath.service.runtime import Runtime

    jobs = 1_000 if ctx.quick else 10_000
    settings = get_settings()
    rt = Runtime.open(settings)
    ctx.stub.set_delay(0.0)
    env = {
        **os.environ,
        "WORKER_POOL": "threads",
        "WORKER_CONCURRENCY": "16",
        "SUMMARIZATION_THRESHOLD_CHARS": "3000",
        "SUMMARIZATION_KEEP_CHARS": "1000",
    }
    worker = start_worker(env, f"bench-mem-{RUN_ID}@%h", subprocess.DEVNULL)
    samples: list[tuple[int, float]] = []
    try:
        proc = psutil.Process(worker.pid)
        time.sleep(2.0)
        batch = max(1, jobs // 20)
        done = 0
        while done < jobs:
            sids = []
            for k in range(batch):
                sid = f"mem-{RUN_ID}-{done + k}"
                rt.graph.update_state(
                    thread_config(sid),
                    {"messages": thread(12, 4_500, seed=k, prefix=sid)},
                    as_node=AGENT_NODE,
                )
                job_id = uuid.uuid4().hex
                create_job(rt.engine, job_id, sid, 4_500)
                publish(sid, job_id)
                sids.append(sid)
            wait(lambda s=sids: finished(rt, s) >= len(s), 600)
            done += batch
            samples.append((done, proc.memory_info().rss / 2**20))
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        rt.close()
    warm_at = samples[min(1, len(samples) - 1)]
    warm, last = warm_at[1], samples[-1][1]
    growth = (last - warm) / warm
    return Result(
        "6. Worker memory",
        "resident memory growth < 10% across 10,000 jobs",
        f"{samples[0][1]:.0f} MiB after {samples[0][0]:,} jobs, {warm:.0f} MiB after {warm_at[0]:,}, "
        f"{last:.0f} MiB after {samples[-1][0]:,}: {growth * 100:+.1f}% after warm-up",
        growth < 0.10 if jobs >= 10_000 else None,
        [
            "one worker, threads pool x16, small threads (12 messages) on PostgreSQL, 0 ms stub LLM; RSS sampled every "
            f"{max(1, jobs // 20):,} jobs: " + ", ".join(f"{n:,}: {m:.0f}" for n, m in samples)
        ],
    )
