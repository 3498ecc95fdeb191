"""A short chaos soak (:mod:`bench.soak`): every fault kind once, at random moments, while
sessions post turns and chat over HTTP and a user's own agent runs with the middleware; on
its own PostgreSQL cluster, Redis and stub LLM (private ports: safe beside other tests).
The hour-long run's figures are in BENCHMARKS.md (``python -m bench.soak --minutes 60``).

One soak run, read by two tests: what must hold under every fault (every message kept, no
usage event twice, no orphan, the API answering), and that no job is left stuck and no
thread over its threshold once the faults end (a worker killed between taking a job's
message and starting the job included: the reconciler re-publishes that job instead of
waiting for the broker's visibility timeout)."""

from __future__ import annotations

import pytest

from bench.soak import KINDS, SILENT_S, Figures, Plan, soak


@pytest.fixture(scope="module")
def soaked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Figures, str]:
    figures = soak(Plan.short(minutes=2), tmp_path_factory.mktemp("soak"))
    return figures, "\n".join([*figures.table(), *figures.details()])


@pytest.mark.timeout(1_500)
def test_a_short_chaos_soak_keeps_every_message_and_counts_each_compaction_once(soaked):
    figures, report = soaked
    assert sorted({f.kind for f in figures.faults}) == sorted(KINDS), report
    assert figures.posted > 0 and figures.found == figures.posted, report
    assert figures.twice == 0 and not figures.usage_mismatch, report
    assert not figures.orphans, report
    assert figures.silent_s <= SILENT_S, report
    assert not figures.client_errors, report


def test_a_short_chaos_soak_leaves_no_job_stuck_and_no_thread_over_its_threshold(soaked):
    figures, report = soaked
    assert not figures.stuck, report
    assert not figures.over, report
