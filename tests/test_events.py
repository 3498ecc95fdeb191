"""``on_compaction`` (issue 21, item 4): the update's ACP shape, and a callback that raises
never reaches the run."""

from __future__ import annotations

import logging

from offpath import OffPathCompaction
from offpath.compaction.settings import load_settings
from offpath.events import CompactionUpdate


def test_an_update_in_the_shape_of_acp_leaves_out_what_it_does_not_know():
    queued = CompactionUpdate("t1", "job-1", "in_progress", chars_before=61_000)
    assert queued.to_acp() == {
        "sessionUpdate": "compaction_update",
        "compactionId": "job-1",
        "status": "in_progress",
        "charsBefore": 61_000,
    }
    done = CompactionUpdate("t1", "job-1", "completed", 61_000, 18_500)
    assert done.to_acp()["charsAfter"] == 18_500 and "reason" not in done.to_acp()


def test_a_callback_that_raises_is_logged_and_the_next_update_still_comes(caplog):
    heard: list[CompactionUpdate] = []

    def callback(update: CompactionUpdate) -> None:
        heard.append(update)
        if update.status == "in_progress":
            raise RuntimeError("the app's bug")

    middleware = OffPathCompaction(load_settings(), on_compaction=callback)
    with caplog.at_level(logging.ERROR, logger="offpath.middleware"):
        middleware._tell("t1", "job-1", "in_progress", 61_000)
        middleware._tell("t1", "job-1", "cancelled", reason="stale: x")
    assert [u.status for u in heard] == ["in_progress", "cancelled"]
    assert "on_compaction raised" in caplog.text
    assert heard[1].reason == "stale: x"
