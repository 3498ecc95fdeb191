"""Benchmark 2, job overhead against the floor: one compaction job run in-process exactly as
the worker's ``compact_session`` runs it (job row, running lease, lease keeper,
:func:`worker.jobs.run_job`, hand-on), against the floor of what no job can avoid
(read the state, write the patched checkpoint, insert one usage row)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from bench.common import RUN_ID, Context, Result, med

NAME = "job"


def run_like_the_worker(rt: Any, summarizer: Any, keeper: Any, session_id: str, job_id: str) -> str:
    """The steps of ``worker.tasks.compact_session`` for one delivery, minus Celery's
    dispatch: mark the job ``running``, take the thread's running lease, have the lease
    keeper renew it, run the job, then hand the thread on. Returns the job's status."""
    from offpath.worker.jobs import run_job
    from offpath.worker.tasks import _hand_on

    from offpath.service.db import start_job
    from offpath.service.leases import Start

    done, stored = start_job(rt.engine, job_id, session_id)
    assert done is None, done
    token = uuid.uuid4().hex[:12]
    started, before = rt.leases.start(session_id, job_id, token)
    assert started is Start.OK, (started, before)
    held = keeper.hold(session_id, job_id, token)
    status = None
    try:
        status = run_job(rt, summarizer, session_id, job_id, held, stored).status
    finally:
        keeper.drop(held)
        if status is not None:
            _hand_on(rt, session_id, job_id, token, status)
    return str(status)


def run(ctx: Context, runs: int = 5) -> Result:
    from sqlmodel import Session

    from bench.workloads import thread
    from offpath.compaction.pipeline import compact
    from offpath.compaction.settings import get_settings
    from offpath.compaction.summarizers.llm import LLMSummarizer
    from offpath.compaction.summarizers.offline import OfflineSummarizer
    from offpath.service.agent import AGENT_NODE, thread_config
    from offpath.service.db import UsageEvent, create_job
    from offpath.service.leases import LeaseKeeper
    from offpath.service.runtime import Runtime

    per_run = 4 if ctx.quick else 20
    settings = get_settings()
    rt = Runtime.open(settings)
    summarizer = LLMSummarizer.from_settings(settings)
    keeper = LeaseKeeper(rt.leases, settings.job_time_limit_s)
    ctx.stub.set_delay(0.0)
    job_runs, floor_runs = [], []
    try:
        for r in range(runs):
            jobs, floors = [], []
            for k in range(per_run):
                messages = thread(100, 80_000, seed=k, prefix=f"j{r}-{k}")
                # the job, as the worker runs it (minus Celery's dispatch); queued as the
                # post-turn hook queues it: claim, then the queued row
                sid = f"job-{RUN_ID}-{r}-{k}"
                rt.graph.update_state(
                    thread_config(sid), {"messages": messages}, as_node=AGENT_NODE
                )
                job_id = uuid.uuid4().hex
                assert rt.leases.claim(sid, job_id) is None
                create_job(rt.engine, job_id, sid, 80_000)
                started = time.perf_counter()
                status = run_like_the_worker(rt, summarizer, keeper, sid, job_id)
                jobs.append((time.perf_counter() - started) * 1000)
                assert status == "applied", status
                # the floor: what no job can avoid, done directly
                fid = f"floor-{RUN_ID}-{r}-{k}"
                rt.graph.update_state(
                    thread_config(fid), {"messages": messages}, as_node=AGENT_NODE
                )
                patch = compact(messages, settings, OfflineSummarizer()).patch
                started = time.perf_counter()
                rt.graph.get_state(thread_config(fid))
                rt.graph.update_state(thread_config(fid), {"messages": patch}, as_node=AGENT_NODE)
                with Session(rt.engine) as s:
                    s.add(
                        UsageEvent(
                            session_id=fid,
                            model="floor",
                            metadata_={"summarization": True, "chars_removed": 1},
                        )
                    )
                    s.commit()
                floors.append((time.perf_counter() - started) * 1000)
            job_runs.append(med(jobs))
            floor_runs.append(med(floors))
    finally:
        keeper.stop()
        rt.close()
    job, floor = med(job_runs), med(floor_runs)
    ratio = med([j / f for j, f in zip(job_runs, floor_runs, strict=True)])
    return Result(
        "2. Job overhead against the floor",
        "job <= 2.0x the floor",
        f"job {job:.1f} ms, floor {floor:.1f} ms: {ratio:.2f}x",
        ratio <= 2.0,
        [
            f"threads of 100 messages / ~80,000 chars on PostgreSQL, 0 ms stub LLM over HTTP; {runs} runs x {per_run} jobs, "
            f"per-run medians job {', '.join(f'{x:.1f}' for x in job_runs)} ms, floor {', '.join(f'{x:.1f}' for x in floor_runs)} ms",
            "job = the steps of the worker's compact_session: job row to running, running lease on the thread (Redis), "
            "lease keeper, run_job (read thread, plan, prompt, LLM call, thread lock, re-read, reconcile, stored result, "
            "patch, usage row), hand-on of the lease; floor = read the state, write the patched checkpoint, insert one usage row",
        ],
        "the job reads the thread twice (once to plan, once under the lock to check the plan still fits), "
        "calls the LLM and writes its job row three times (running, its result, applied); the second read is the "
        "price of never losing a message to a concurrent turn",
    )
