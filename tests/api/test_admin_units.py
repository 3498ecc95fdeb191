"""Pure parts of session admin and /stats (issue 12): percentiles, ``?since=``, session
cursors, the planner's ``force``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi import HTTPException
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from offpath.api.stats import parse_since
from offpath.compaction.planner import Skip, SkipReason, plan_compaction
from offpath.compaction.settings import Settings
from offpath.stores.usage.sessions import BadCursor, _decode_cursor, _encode_cursor
from offpath.stores.usage.totals import percentiles


def test_nearest_rank_percentiles():
    assert percentiles([], 50, 99) == [None, None]
    assert percentiles([7.0], 50, 99) == [7.0, 7.0]
    values = [float(v) for v in range(100, 0, -1)]  # 100 .. 1, unsorted
    assert percentiles(values, 50, 99, 100) == [50.0, 99.0, 100.0]
    assert percentiles([1.0, 2.0, 3.0, 1000.0], 50, 99) == [2.0, 1000.0]


def test_since_takes_iso_datetimes_and_durations_and_refuses_the_rest():
    assert parse_since(None) is None and parse_since("") is None
    assert parse_since("2026-12-01T09:00:00Z") == datetime(2026, 12, 1, 9, tzinfo=UTC)
    assert parse_since("2026-12-01T09:00:00") == datetime(2026, 12, 1, 9, tzinfo=UTC)
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    assert abs((parse_since("1h") - hour_ago).total_seconds()) < 5
    assert abs((parse_since("90s") - hour_ago).total_seconds() - 3510) < 5
    for bad in ("yesterday", "1y", "-1h", "1.5h", "999999w", "2026-02-30"):
        with pytest.raises(HTTPException) as caught:
            parse_since(bad)
        assert caught.value.status_code == 422 and "since" in caught.value.detail


def test_session_cursors_round_trip_and_refuse_forgeries():
    at = datetime(2026, 12, 1, 9, 30, 1, 123456, tzinfo=UTC)
    cursor = _encode_cursor("-last_activity", at, "s-1")
    assert _decode_cursor(cursor, "-last_activity") == (at, "s-1")
    assert _decode_cursor(_encode_cursor("chars", 1234, "s-2"), "chars") == (1234, "s-2")
    with pytest.raises(BadCursor, match="another sort order"):
        _decode_cursor(cursor, "chars")
    for forged in ("", "!!", _encode_cursor("chars", "1234", "s"), _encode_cursor("chars", 1, 5)):
        with pytest.raises(BadCursor):
            _decode_cursor(forged, "chars")


def thread(turns: int, chars: int) -> list:
    out: list = []
    for i in range(turns):
        out += [
            HumanMessage(id=f"h{i}", content=f"question {i}"),
            AIMessage(
                id=f"a{i}", content="", tool_calls=[{"id": f"c{i}", "name": "f", "args": {}}]
            ),
            ToolMessage(id=f"t{i}", tool_call_id=f"c{i}", content="x" * chars),
            AIMessage(id=f"r{i}", content=f"answer {i}"),
        ]
    return out


def test_force_plans_under_the_threshold_but_keeps_the_keep_window_and_pairs():
    settings = Settings(summarization_threshold_chars=60_000, summarization_keep_chars=20_000)
    messages = thread(8, 4_000)  # ~32,000 chars: under the threshold and the prepare floor
    assert plan_compaction(messages, settings, early=True).reason is SkipReason.UNDER_THRESHOLD
    plan = plan_compaction(messages, settings, force=True)
    assert not isinstance(plan, Skip)
    assert plan.kept_chars >= 20_000 and plan.kept[0].type == "human"
    small = thread(2, 4_000)  # fits the keep window: still nothing to cut
    skip = plan_compaction(small, settings, force=True)
    assert isinstance(skip, Skip) and skip.reason is SkipReason.NO_CUT_POINT
