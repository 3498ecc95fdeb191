"""README's "How it fits together" traces one compaction through the files that decide it;
this keeps that list true: every file it names exists, and each file of its two paths (the
API's, a team's own agent's) is one that the compaction runs on that path, as
``python -m bench.trace`` records it (a real run of each path: the real ``compact_session``
task, Redis, SQLite)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from stack import ROOT

#: A file path as README writes it: under ``offpath/`` unless it starts with one of these.
TOP = ("api/", "worker/", "tests/", "bench/")
PATH = re.compile(r"(?<![\w/.])((?:[a-z_]+/)+[a-z_0-9]+\.py)\b")


def section() -> str:
    """The part of "How it fits together" that traces one compaction."""
    text = (ROOT / "README.md").read_text()
    start = text.index("One compaction, traced through the files that decide it")
    return text[start : text.index("DESIGN.md's parts, and where each lives", start)]


def resolved(path: str) -> str:
    return path if path.startswith(TOP) else f"offpath/{path}"


def named(text: str) -> list[str]:
    return sorted({resolved(p) for p in PATH.findall(text)})


def blocks() -> dict[str, list[str]]:
    """The files each path's diagram names: the API's first, then the own agent's."""
    api, own = re.findall(r"```\n(.*?)```", section(), re.S)[:2]
    return {"api": named(api), "own": named(own)}


def test_every_file_the_trace_names_exists():
    files = named(section())
    assert len(files) >= 15, files  # the list is read, not skipped
    missing = [f for f in files if not (ROOT / f).is_file()]
    assert not missing, f"README names files that do not exist: {missing}"


def test_the_readme_does_not_name_a_file_outside_the_product_as_a_step():
    for path, files in blocks().items():
        assert files and all(f.startswith(("offpath/", "api/", "worker/")) for f in files), (
            path,
            files,
        )


def traced(path: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.trace", "--path", path, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("path", ["api", "own"])
def test_each_file_of_a_path_runs_when_one_compaction_takes_it(path):
    runs = traced(path)
    assert len(runs) > 30  # the whole compaction was traced
    not_run = [f for f in blocks()[path] if f not in runs]
    assert not not_run, f"README's {path} path names files its compaction does not run: {not_run}"
