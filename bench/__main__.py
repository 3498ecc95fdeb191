"""``python -m bench`` (``make bench``): measure the claims and rewrite BENCHMARKS.md.

One module per benchmark (``bench/<name>.py``, each with ``run(ctx) -> Result``), the
shared parts in :mod:`bench.common`, the fault suite in :mod:`bench.faults`, the report in
:mod:`bench.report`. Real Redis (db 14) and PostgreSQL (scratch databases), a local
OpenAI-compatible stub LLM with a set latency, real worker and API processes. Nothing
here fails on a slow machine: targets are reported met or missed.

Options:

* ``--quick``: fewer turns, jobs and sessions (a smoke run);
* ``--fault-n N``: how often each fault of ``tests/faults`` is injected (0 skips them);
  ``--fault-k EXPR`` runs only the faults pytest's ``-k EXPR`` selects;
* ``--only NAME[,NAME]``: run a subset (names below, ``faults`` included). A subset does
  not rewrite BENCHMARKS.md (its other sections would be lost): it prints its sections;
  with ``--update`` it replaces those benchmarks' rows and sections in BENCHMARKS.md and
  says, under the header, which ran when (the others keep their run's figures); one that
  raised keeps its row (the error is printed). Only a full run writes the report.

``SOAK_MINUTES`` sets how long the chaos soak (``soak``, :mod:`bench.soak`) runs (default 60;
with ``--quick``, its short plan for 4); ``python -m bench.soak`` runs it alone.
"""

from __future__ import annotations

import argparse
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

from bench import (
    apimemory,
    conformance,
    faults,
    fidelity,
    frontier,
    groundtruth,
    growth,
    hostile,
    job,
    lag,
    load,
    longsession,
    memory,
    middleware,
    peak,
    peakgrid,
    peers,
    planner,
    report,
    soak,
    swapcheck,
    throughput,
    turns,
)
from bench.common import (
    RUN_ID,
    Context,
    Result,
    StubServer,
    base_env,
    create_pg_database,
    drop_pg_database,
    purge_broker,
    set_env,
)

#: In the order they run: the pure ones first, then those with processes.
BENCHMARKS: dict[str, Callable[[Any], Result]] = {
    planner.NAME: planner.run,
    growth.NAME: growth.run,
    turns.NAME: turns.run,
    turns.NAME_SIZE: turns.run_size,
    job.NAME: job.run,
    throughput.NAME: throughput.run,
    lag.NAME: lag.run,
    memory.NAME: memory.run,
    apimemory.NAME: apimemory.run,
    load.NAME: load.run,
    middleware.NAME: middleware.run,
    peak.NAME: peak.run,
    peakgrid.NAME: peakgrid.run,
    peers.NAME: peers.run,
    longsession.NAME: longsession.run,
    fidelity.NAME: fidelity.run,
    hostile.NAME: hostile.run,
    groundtruth.NAME: groundtruth.run,
    frontier.NAME: frontier.run,
    swapcheck.NAME: swapcheck.run,
    conformance.NAME: conformance.run,
    soak.NAME: soak.run,
}
#: Those that need neither the stub LLM nor a database (frontier runs its own stub LLM, the
#: conformance suite its own stacks, the soak its own PostgreSQL, Redis and stub LLM).
PURE = {
    planner.NAME,
    growth.NAME,
    fidelity.NAME,
    groundtruth.NAME,
    frontier.NAME,
    swapcheck.NAME,
    conformance.NAME,
    soak.NAME,
}
NAMES = [*BENCHMARKS, faults.NAME]


def parse_only(value: str) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown benchmark {', '.join(unknown) or repr(value)}; choose from {', '.join(NAMES)}"
        )
    return names


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="Run the benchmarks and rewrite BENCHMARKS.md."
    )
    parser.add_argument("--quick", action="store_true", help="fewer turns and jobs (a smoke run)")
    parser.add_argument(
        "--fault-n",
        type=int,
        default=int(os.environ.get("FAULT_N", "3")),
        help="how often each fault is injected (0: skip the fault suite)",
    )
    parser.add_argument(
        "--fault-k", metavar="EXPR", help="run only the faults pytest -k EXPR selects"
    )
    parser.add_argument(
        "--only",
        type=parse_only,
        metavar="NAME[,NAME]",
        help=f"run only these ({', '.join(NAMES)}); prints the results, BENCHMARKS.md is "
        "left as it is (see --update)",
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="with --only: replace those benchmarks' rows and sections in BENCHMARKS.md",
    )
    args = parser.parse_args()
    selected = args.only or NAMES
    started = time.monotonic()
    results: list[Result] = []
    errored: list[Result] = []  # a run that raised: printed, never written over a row
    steps = [name for name in BENCHMARKS if name in selected]
    if steps:
        needs_stack = any(name not in PURE for name in steps)
        stub = StubServer() if needs_stack else None
        pg_url = create_pg_database("offpath_bench") if needs_stack else ""
        try:
            if not needs_stack:
                set_env({})  # no exported or .env settings leak in
            else:
                assert stub is not None
                # the worker settings at their defaults (WORKER_CONCURRENCY...)
                set_env(base_env(pg_url, f"bench-{RUN_ID}", OPENAI_BASE_URL=stub.base_url))
            ctx = Context(stub, pg_url, args.quick)  # no stub nor database for pure ones
            for name in steps:
                if needs_stack:
                    purge_broker()
                t = time.monotonic()
                print(f"bench: {name} ...", flush=True)
                try:
                    result = BENCHMARKS[name](ctx)
                except Exception as exc:  # the other benchmarks still run and are reported
                    traceback.print_exc()
                    result = Result(name, "-", f"error: {type(exc).__name__}: {exc}"[:300], False)
                    errored.append(result)
                print(
                    f"bench: {name}: {result.measured} ({time.monotonic() - t:.0f} s)", flush=True
                )
                results.append(result)
        finally:
            if stub is not None:
                stub.shutdown()
                drop_pg_database(pg_url)
                purge_broker()
    fault_run = None
    if faults.NAME in selected:
        if args.fault_n > 0:
            print(
                f"bench: fault injection, FAULT_N={args.fault_n}, lease {faults.LEASE_S} s, "
                f"reconcile {faults.RECONCILE_S} s ...",
                flush=True,
            )
            fault_run = faults.run(args.fault_n, args.fault_k)
            print(f"bench: faults: {fault_run.tail} ({fault_run.seconds:.0f} s)", flush=True)
        else:
            fault_run = faults.FaultRun(0, tail="skipped (--fault-n 0)")
    seconds = time.monotonic() - started
    measured = [r for r in results if not any(r is e for e in errored)]
    if args.only and args.update and measured:
        path = report.write(report.merge(report.write_path().read_text(), measured, seconds))
        print(f"bench: updated {', '.join(r.name for r in measured)} in {path.name}")
        if errored:
            print(f"bench: not updated (the run raised): {', '.join(r.name for r in errored)}")
        return
    if args.only:
        print(report.render_partial(results, fault_run), end="")
        print(f"bench: {', '.join(selected)} in {seconds / 60:.1f} min (BENCHMARKS.md unchanged)")
        return
    path = report.write(report.render(results, fault_run, seconds, args.quick))
    print(f"bench: wrote {path.name} in {seconds / 60:.1f} min")


if __name__ == "__main__":
    main()
