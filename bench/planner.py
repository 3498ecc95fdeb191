"""Benchmark 4, planner scaling: ``plan_compaction`` on threads of 1,000 to 100,000 messages."""

from __future__ import annotations

import time

from bench.common import Context, Result, med

NAME = "planner"


def run(ctx: Context | None = None, runs: int = 5) -> Result:
    from bench.workloads import thread
    from offpath.compaction.planner import CompactionPlan, plan_compaction
    from offpath.config import load_settings

    settings = load_settings()
    times = {}
    for n in (1_000, 10_000, 100_000):
        messages = thread(n, n * 800, seed=n, prefix=f"p{n}")
        samples = []
        for _ in range(runs):
            started = time.perf_counter()
            plan = plan_compaction(messages, settings)
            samples.append((time.perf_counter() - started) * 1000)
            assert isinstance(plan, CompactionPlan)
        times[n] = med(samples)
    growth = times[100_000] / times[10_000]
    return Result(
        "4. Planner scaling",
        "100,000 messages <= 250 ms; 10x messages <= 12x time",
        ", ".join(f"{n:,}: {t:.1f} ms" for n, t in times.items()) + f"; 10k -> 100k x{growth:.1f}",
        times[100_000] <= 250 and growth <= 12,
        [
            f"median of {runs} runs; threads of turns with 1-6 tool steps, a quarter of them parallel batches of 3"
        ],
        "each message is one pydantic object touched once by a single pass; at 100,000 messages they no longer "
        "fit the CPU caches, so the per-message cost rises (10,000 messages stay cache-resident): the growth "
        "comes from memory, not from the algorithm, which is linear",
    )
