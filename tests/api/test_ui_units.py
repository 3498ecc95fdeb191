"""The web UI's figures and chart layout as pure functions (issue 21, item 11): durations
read as a person reads them, labels instead of JSON keys, a zero failure count in no
colour, round ticks, and a session's events spread across the chart whatever its length.
The browser test (tests/integration/test_ui.py) checks the rendered pages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from offpath.api.ui_data.chart import nice_ticks, steps_of, tick_label
from offpath.api.ui_data.dashboard import FOLDED, fmt_ms, widgets


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (None, "—"),
        (0, "0 ms"),
        (52.4, "52 ms"),
        (639.5, "640 ms"),
        (999.4, "999 ms"),
        (999.6, "1.0 s"),
        (1694.0, "1.7 s"),
        (52_886.5, "52.9 s"),
        (59_960.0, "1 min 00 s"),
        (185_000, "3 min 05 s"),
    ],
)
def test_milliseconds_are_rounded_and_shown_in_seconds_from_one_second(ms, text):
    assert fmt_ms(ms) == text


def body(**summary):
    base = {
        "sessions_compacted": 1,
        "jobs": {"applied": 2, "failed": 0, "queued": 0},
        "lag_ms": {"count": 2, "p50": 52_886.5, "p99": 640.2},
        "summarizer_latency_ms": {"count": 1, "p50": 373.0, "p99": None},
        "llm_tokens": {"input": 0, "output": 0, "events": 0},
        "jobs_by_reason": {"skipped": {"too_few_messages": 1}, "failed": {}},
        "new_figure_ms": 1500,
    }
    return {"summary": base | summary}


def test_widgets_have_labels_not_key_names_and_durations_with_their_unit():
    shown = {w["path"]: w for w in widgets(body())}
    # the counts behind the percentiles are said in their units, not as widgets of their own
    for folded in FOLDED:
        assert folded not in shown
    assert shown["summary.lag_ms.p50"]["text"] == "52.9 s"
    assert shown["summary.lag_ms.p50"]["unit"] == "over 2 compactions"
    assert shown["summary.summarizer_latency_ms.p50"]["unit"] == "over 1 compaction"
    assert shown["summary.summarizer_latency_ms.p99"]["text"] == "—"
    assert shown["summary.llm_tokens.input"]["unit"] == "reported by 0 compactions"
    # a figure no widget names yet gets words, not its key
    assert shown["summary.jobs_by_reason.skipped.too_few_messages"]["label"] == (
        "jobs skipped: too few messages"
    )
    assert shown["summary.new_figure_ms"]["label"] == "new figure"
    assert shown["summary.new_figure_ms"]["text"] == "1.5 s"
    for w in shown.values():
        assert "_" not in w["label"] and " ms" not in w["label"], w


def test_a_failed_count_is_red_only_when_it_is_not_zero():
    shown = {w["path"]: w for w in widgets(body())}
    assert shown["summary.jobs.failed"]["tone"] == ""
    assert shown["summary.jobs.applied"]["tone"] == "ok"
    assert shown["summary.jobs.queued"]["tone"] == ""
    failing = body(jobs={"applied": 0, "failed": 3})
    tones = {w["path"]: w["tone"] for w in widgets(failing)}
    assert tones["summary.jobs.failed"] == "bad" and tones["summary.jobs.applied"] == ""


@pytest.mark.parametrize(
    ("top", "ticks"),
    [
        (97_857, [0, 20_000, 40_000, 60_000, 80_000, 100_000]),
        (85_000, [0, 20_000, 40_000, 60_000, 80_000, 100_000]),
        (60_000, [0, 20_000, 40_000, 60_000]),
        (186_000, [0, 50_000, 100_000, 150_000, 200_000]),
        (12_345, [0, 2_500, 5_000, 7_500, 10_000, 12_500]),
        (1, [0, 1]),
    ],
)
def test_size_ticks_are_round(top, ticks):
    assert nice_ticks(top) == ticks
    assert tick_label(2_500) == "2.5k" and tick_label(100_000) == "100k"


def test_a_compaction_takes_one_step_and_a_subsecond_session_spreads_like_a_long_one():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    ms = timedelta(milliseconds=1)
    quick = [
        (t0, 0, "session started"),
        (t0 + 100 * ms, 50_000, "job queued"),
        (t0 + 300 * ms, 61_000, "applied: at least"),
        (t0 + 300 * ms, 30_000, "applied: after"),
        (t0 + 400 * ms, 35_000, "now"),
    ]
    assert steps_of(quick) == [0, 1, 2, 2, 3]
    days = [(t0 + timedelta(days=k), c, w) for k, (_, c, w) in enumerate(quick)]
    days[3] = (days[2][0], *days[3][1:])
    assert steps_of(days) == steps_of(quick)


def test_the_summaries_paid_for_and_never_applied_are_shown_against_those_paid_for():
    unused = {"paid": 41, "waiting": 7, "dropped": 0, "share": 0.1707}
    shown = {w["path"]: w for w in widgets(body(summaries_not_applied=unused))}
    assert "summary.summaries_not_applied.paid" not in shown
    waiting = shown["summary.summaries_not_applied.waiting"]
    assert (waiting["label"], waiting["text"]) == ("summaries waiting to apply", "7")
    assert waiting["unit"] == "of 41 compactions paid for"
    share = shown["summary.summaries_not_applied.share"]
    assert (share["label"], share["text"]) == ("share not applied", "17.1%")  # 7 of 41
    none_paid = {"paid": 0, "waiting": 0, "dropped": 0, "share": None}
    shown = {w["path"]: w for w in widgets(body(summaries_not_applied=none_paid))}
    assert shown["summary.summaries_not_applied.share"]["text"] == "—"
