"""A short chaos soak (:mod:`bench.soak`): every fault kind once, at random moments, while
sessions post turns and chat over HTTP and a user's own agent runs with the middleware; on
its own PostgreSQL cluster, Redis and stub LLM (private ports: safe beside other tests).
The hour-long run's figures are in BENCHMARKS.md (``python -m bench.soak --minutes 60``)."""

from __future__ import annotations

import pytest

from bench.soak import KINDS, SILENT_S, Plan, soak


@pytest.mark.timeout(1_500)
def test_a_short_chaos_soak_keeps_every_message_and_leaves_nothing_stuck(tmp_path):
    figures = soak(Plan.short(minutes=3), tmp_path / "soak")
    report = "\n".join([*figures.table(), *figures.details()])
    assert sorted({f.kind for f in figures.faults}) == sorted(KINDS), report
    assert figures.posted > 0 and figures.found == figures.posted, report
    assert not figures.stuck, report
    assert figures.twice == 0 and not figures.usage_mismatch, report
    assert not figures.over, report
    assert not figures.orphans, report
    assert figures.silent_s <= SILENT_S, report
    assert not figures.client_errors, report
