"""The lead a thread that grows by turns gets its job with (pure): as late as its summary is
still applied before the first turn after the crossing."""

from __future__ import annotations

import pytest

from offpath.compaction.planner import JOB_OVERHEAD_S, LEAD_MARGIN, lead_chars, turn_lead_chars


def test_with_the_turn_size_unknown_the_lead_is_the_growth_over_a_job():
    assert turn_lead_chars(1_000.0, 1.0, 0) == lead_chars(1_000.0, 1.0)


def test_a_job_done_within_one_turn_starts_at_the_crossing():
    # 20 chars/s, turns of 3,000 chars (one every 150 s): the job (1 s + overhead, with the
    # margin) ends long before the next turn; a summary paid for ahead would be wasted on a
    # thread that stops under its threshold
    assert turn_lead_chars(20.0, 1.0, 3_000) == 0


def test_a_job_longer_than_a_turn_starts_a_whole_turn_ahead_not_a_turn_and_a_half():
    # turns of 3,000 chars every 2 s; the job needs (1 + overhead) x margin = 3.1 s: from the
    # last turn under the threshold it has two turns' time (4 s) before the turn after the
    # crossing; the growth over a job alone (4,688 chars) would start it a turn earlier
    # half the time
    rate, step = 1_500.0, 3_000
    assert lead_chars(rate, 1.0) > step
    assert turn_lead_chars(rate, 1.0, step) == step


@pytest.mark.parametrize("interval_s", [0.3, 0.9, 1.7, 2.0, 3.3, 6.0, 40.0])
@pytest.mark.parametrize("latency_s", [0.5, 2.0, 5.0])
def test_the_job_starts_at_the_last_turn_that_leaves_it_its_time(interval_s, latency_s):
    # a thread growing 2,900 chars a turn from 2,234 chars, one turn every interval_s; the hook
    # queues at the first turn within the lead of the threshold (the crossing turn at the
    # latest): its job has the time it needs before the turn after the crossing, and one
    # turn later it would not have had it
    threshold, step = 100_000, 2_900
    needed = (latency_s + JOB_OVERHEAD_S) * LEAD_MARGIN
    lead = turn_lead_chars(step / interval_s, latency_s, step)
    sizes = [2_234 + k * step for k in range(60)]
    crossing = next(k for k, s in enumerate(sizes) if s > threshold)
    queued = next(k for k, s in enumerate(sizes) if s > threshold or s >= threshold - lead)
    before_next = (crossing + 1 - queued) * interval_s  # until the turn after the crossing
    assert before_next >= needed - 1e-9
    if queued < crossing:
        assert before_next - interval_s < needed
