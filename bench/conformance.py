"""Benchmark 19, the conformance suite of agent shapes (issue 30, item 3): the shapes x
properties table of ``tests/conformance``, each pair pass, fail or xfail (a known fault,
named in the suite's ``KNOWN``), and the suite's wall time.

It runs ``pytest tests/conformance/test_conformance.py`` in one process (``-n 0``: the wall
time is the one it adds to the test suite on one xdist worker) with ``--junitxml``, and reads
each test's outcome from the report: ``test_shape_keeps_property[<shape>-<property>]`` and
``test_shape_compacts[<shape>]`` (the column *compacts*: the run exercised compaction).
A pair the suite does not run (``caller_untouched`` of a shape without a callee) is ``n/a``.
Target: every pair passes (an xfail is a known fault, not a pass).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from bench.common import ROOT, Context, Result

NAME = "conformance"
TITLE = "19. Agent shapes x properties (conformance suite)"
SUITE = "tests/conformance/test_conformance.py"
#: The columns, in the suite's order (``conformance.properties.PROPERTIES``, then compacts).
COLUMNS = (
    "nothing_lost",
    "no_orphans",
    "whole_turns",
    "caller_untouched",
    "bounded",
    "one_summary",
    "own_branch",
    "compacts",
)
_CASE = re.compile(
    r"test_shape_(?:keeps_property\[(?P<shape>[^\]-]+)-(?P<prop>[^\]]+)\]|compacts\[(?P<only>[^\]]+)\])"
)


def outcome(case: ET.Element) -> tuple[str, str]:
    """(``pass`` / ``fail`` / ``xfail``, the reason or first line of the failure)."""
    for child in case:
        if child.tag in ("failure", "error"):
            text = (child.get("message") or child.text or "").strip()
            return "fail", text.splitlines()[0] if text else child.tag
        if child.tag == "skipped":
            kind = "xfail" if child.get("type") == "pytest.xfail" else "skipped"
            return kind, (child.get("message") or "").strip()
    return "pass", ""


def read(report: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """By (shape, column): each test's outcome in the JUnit report."""
    cells: dict[tuple[str, str], tuple[str, str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        m = _CASE.search(case.get("name", ""))
        if m is None:
            continue
        shape = m["shape"] or m["only"]
        cells[(shape, m["prop"] or "compacts")] = outcome(case)
    return cells


def table(cells: dict[tuple[str, str], tuple[str, str]]) -> list[str]:
    """The Markdown table: one row per shape, one column per property."""
    shapes = list(dict.fromkeys(shape for shape, _ in cells))
    mark = {"pass": "pass", "fail": "**fail**", "xfail": "xfail", "skipped": "skipped"}
    lines = [
        "| shape | " + " | ".join(COLUMNS) + " |",
        "|---|" + "---|" * len(COLUMNS),
    ]
    for shape in shapes:
        row = [mark[cells[(shape, c)][0]] if (shape, c) in cells else "n/a" for c in COLUMNS]
        lines.append(f"| {shape} | " + " | ".join(row) + " |")
    return lines


def run(ctx: Context | None = None) -> Result:
    report = Path(tempfile.mkdtemp(prefix="conformance-")) / "junit.xml"
    env = dict(os.environ)
    for key in ("DATABASE_URL", "REDIS_URL", "CELERY_QUEUE", "REDIS_KEY_PREFIX", "OPENAI_BASE_URL"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider"]
    cmd += [f"--junitxml={report}", SUITE]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if not report.exists():
        raise RuntimeError(f"pytest wrote no report (exit {proc.returncode}): {proc.stderr[-500:]}")
    cells = read(report)
    counts = {k: sum(v[0] == k for v in cells.values()) for k in ("pass", "fail", "xfail")}
    shapes = len({shape for shape, _ in cells})
    reasons: dict[str, list[str]] = {}
    for (shape, column), (kind, why) in cells.items():
        if kind in ("xfail", "fail"):
            reasons.setdefault(f"{kind}: {why}", []).append(f"{shape} x {column}")
    details = [
        f"`pytest -n 0 {SUITE}`: {shapes} shapes, {len(cells)} pairs, {seconds:.0f} s in one process "
        "(real agents, a real worker on Redis, SQLite checkpointers; the plain shape on "
        "PostgreSQL too)",
        *[f"{why} ({', '.join(pairs)})" for why, pairs in sorted(reasons.items())],
    ]
    return Result(
        TITLE,
        "every shape keeps every property (0 fail, 0 xfail)",
        f"{counts['pass']} of {len(cells)} pairs pass, {counts['xfail']} xfail (known faults), "
        f"{counts['fail']} fail; {shapes} shapes in {seconds:.0f} s",
        counts["pass"] == len(cells),
        details,
        table=table(cells),
    )
