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
        "Targets come from issues 5, 8, 9, 11, 13, 18, 19, 20 and 22.",
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


def write_path() -> Path:
    return ROOT / "BENCHMARKS.md"


def write(text: str) -> Path:
    path = write_path()
    path.write_text(text)
    return path


def merge(old: str, results: list[Result], seconds: float) -> str:
    """``old`` (BENCHMARKS.md) with the rows and sections of ``results`` replaced or added
    (``python -m bench --only NAMES --update``): the other benchmarks keep their figures
    and their run's header; a line under the header names the benchmarks rerun, when, on
    what load. A section is ``## <name>`` up to the next ``## ``; a row is the table line
    opening with ``| <name> |``."""
    results = sorted(results, key=order)
    lines = old.rstrip("\n").split("\n")
    names = {r.name for r in results}
    # the table: drop the old rows of those rerun, add the new ones, in number order
    start = next(i for i, line in enumerate(lines) if line.startswith("| benchmark |"))
    end = start + 2
    while end < len(lines) and lines[end].startswith("| "):
        end += 1
    rows = {line.split(" | ")[0][2:]: line for line in lines[start + 2 : end]}
    for r in results:
        rows[r.name] = results_table([r])[2]
    ordered = sorted(rows, key=lambda n: order(Result(n, "", "", None)))
    table = lines[start : start + 2] + [rows[n] for n in ordered]
    # the sections: cut out those rerun, then put each new one before the first section
    # with a higher number (or before the fault sections at the end)
    body = lines[end:]
    kept: list[str] = []
    skipping = False
    for line in body:
        if line.startswith("## "):
            skipping = line[3:] in names
        if not skipping:
            kept.append(line)
    for r in results:
        section = details([r])
        at = next(
            (
                i
                for i, line in enumerate(kept)
                if line.startswith("## ") and order(Result(line[3:], "", "", None)) > order(r)
            ),
            len(kept),
        )
        kept[at:at] = section
    note = (
        f"- rerun on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC (`python -m bench --only ... "
        f"--update`, {seconds / 60:.1f} min, load average at the start "
        + ", ".join(f"{x:.1f}" for x in LOAD_AT_START)
        + f"): {', '.join(r.name for r in results)}; the other rows are from the run above"
    )
    head = lines[:start]
    while head and not head[-1].strip():
        head.pop()
    return "\n".join([*head, note, "", *table, *kept]).rstrip() + "\n"
