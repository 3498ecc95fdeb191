"""Benchmark 3, throughput with a 2 s LLM: compactions per second of one worker process,
threads pool against prefork, side by side, on PostgreSQL."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import RUN_ID, Context, Result, applied, finished, med, start_worker, wait

NAME = "throughput"


def run(ctx: Context, runs: int | None = None) -> Result:
    from offpath.worker.tasks import publish

    from bench.workloads import thread
    from offpath.compaction.settings import get_settings
    from offpath.service.agent import AGENT_NODE, thread_config
    from offpath.service.db import create_job
    from offpath.service.runtime import Runtime

    jobs_threads, jobs_prefork = (64, 4) if ctx.quick else (240, 8)
    runs = runs or (2 if ctx.quick else 5)
    settings = get_settings()
    rt = Runtime.open(settings)
    ctx.stub.set_delay(2.0)
    rates: dict[str, list[float]] = {}
    configs = [
        ("threads", str(settings.worker_concurrency), jobs_threads),
        ("prefork", str(os.cpu_count() or 1), jobs_prefork),
    ]
    for r in range(runs):
        for pool, conc, n in configs:
            env = {
                **os.environ,
                "WORKER_POOL": pool,
                "WORKER_CONCURRENCY": conc,
            }
            log = open(Path(tempfile.gettempdir()) / f"bench-worker-{RUN_ID}-{pool}.log", "ab")  # noqa: SIM115
            worker = start_worker(env, f"bench-{pool}-{r}@%h", log)
            try:
                sids = []
                for k in range(n):
                    sid = f"tp-{pool}-{RUN_ID}-{r}-{k}"
                    rt.graph.update_state(
                        thread_config(sid),
                        {"messages": thread(40, 70_000, seed=k, prefix=sid)},
                        as_node=AGENT_NODE,
                    )
                    sids.append(sid)
                time.sleep(2.0)  # worker start-up
                started = time.perf_counter()
                for sid in sids:
                    job_id = uuid.uuid4().hex
                    create_job(rt.engine, job_id, sid, 70_000)
                    publish(sid, job_id)
                wait(lambda s=sids, n=n: finished(rt, s) >= n, 600)
                rates.setdefault(f"{pool} x{conc}", []).append(
                    applied(rt, sids) / (time.perf_counter() - started)
                )
            finally:
                worker.terminate()
                worker.wait(timeout=30)
                log.close()
    ctx.stub.set_delay(0.0)
    rt.close()
    medians = {k: med(v) for k, v in rates.items()}
    ours = next(v for k, v in medians.items() if k.startswith("threads"))
    return Result(
        "3. Throughput with a 2 s LLM",
        ">= 20 compactions/s on one 2-core host",
        ", ".join(f"{k}: {v:.1f}/s" for k, v in medians.items()),
        ours >= 20,
        [
            f"{runs} runs, side by side; {jobs_threads} jobs per run for threads, {jobs_prefork} for prefork; "
            f"threads of 40 messages / ~70,000 chars on PostgreSQL; rate = jobs / (last applied - first published)",
            "per-run rates: "
            + "; ".join(f"{k} {', '.join(f'{x:.1f}' for x in v)}" for k, v in rates.items()),
        ],
        "with a 2 s LLM, a host does at most concurrency / 2 compactions per second: prefork's default concurrency "
        "is the number of cores (2 here), so it is bound to ~1/s; threads overlap the waits in one process",
    )
