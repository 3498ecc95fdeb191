"""BENCHMARKS.md: the machine it ran on, one row per benchmark, each benchmark's details,
the fault-injection and recovery tables (:mod:`bench.faults`)."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

from bench import faults
from bench.common import ROOT, Result

#: The host's load when the run started (this module is imported then): other work on the
#: host skews every figure, so the report says how busy it was.
LOAD_AT_START = os.getloadavg()

PACKAGES = (
    "celery",
    "kombu",
    "redis",
    "langgraph",
    "langchain-core",
    "langgraph-checkpoint-postgres",
    "psycopg",
    "sqlalchemy",
    "fastapi",
)


def machine() -> list[str]:
    """Date, CPU, cores, memory, OS, Python and the versions that matter, as Markdown items."""
    import psutil

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = ", ".join(f"{p} {version(p)}" for p in PACKAGES)
    pg = subprocess.run(["psql", "--version"], capture_output=True, text=True).stdout.strip()
    rs = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split(
        " sha="
    )[0]
    return [
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"- machine: {cpu}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, {platform.system()} {platform.release()}",
        f"- Python {platform.python_version()}; {versions}",
        f"- {pg}; {rs}",
        "- load average (1, 5, 15 min) when the run started: "
        + ", ".join(f"{x:.1f}" for x in LOAD_AT_START)
        + f"; at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())} "
        f"({os.cpu_count()} cores; above that, other work shared the CPU)",
    ]


def order(r: Result) -> tuple[int, str]:
    """Numbered benchmarks in their number's order ("10." after "9.")."""
    number, dot, _ = r.name.partition(".")
    return (int(number), r.name) if dot and number.isdigit() else (1_000, r.name)


def mark(met: bool | None) -> str:
    return "met" if met else ("not judged" if met is None else "**missed**")


def results_table(results: list[Result]) -> list[str]:
    lines = ["| benchmark | target | measured | |", "|---|---|---|---|"]
    lines += [f"| {r.name} | {r.target} | {r.measured} | {mark(r.met)} |" for r in results]
    return [*lines, ""]


def details(results: list[Result]) -> list[str]:
    lines: list[str] = []
    for r in results:
        lines += [f"## {r.name}", "", *[f"- {d}" for d in r.details]]
        if r.limits:
            lines.append(f"- what limits it: {r.limits}")
        lines.append("")
        if r.table:
            lines += [*r.table, ""]
    return lines


def render(
    results: list[Result], fault_run: faults.FaultRun | None, seconds: float, quick: bool
) -> str:
    """The whole of BENCHMARKS.md."""
    results = sorted(results, key=order)
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`python -m bench`); do not edit by hand. Figures are medians of at least",
        "5 runs unless a section says otherwise; ratios are measured side by side in the same run.",
        "Targets come from issues 5, 8, 9, 11 and 13.",
        "",
        *machine(),
        f"- whole run: {seconds / 60:.1f} min" + (" (`--quick`: a smoke run)" if quick else ""),
        "",
        *results_table(results),
        *details(results),
        *faults.sections(fault_run),
    ]
    return "\n".join(lines).rstrip() + "\n"


def render_partial(results: list[Result], fault_run: faults.FaultRun | None) -> str:
    """What a run of a subset (``--only``) prints instead of rewriting BENCHMARKS.md."""
    results = sorted(results, key=order)
    lines: list[str] = []
    if results:
        lines += [*results_table(results), *details(results)]
    if fault_run is not None:
        lines += faults.sections(fault_run)
    return "\n".join(lines).rstrip() + "\n"


def write(text: str) -> Path:
    path = ROOT / "BENCHMARKS.md"
    path.write_text(text)
    return path
