"""``on_compaction`` (issue 21, item 4): the update's ACP shape, and a callback that raises
never reaches the run."""

from __future__ import annotations

import logging

from offpath import OffPathCompaction
from offpath.config import load_settings
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


def test_the_events_stream_reads_each_job_row_as_its_acp_update(tmp_path):
    """``GET /sessions/{id}/events`` (issue 21, item 4) streams what
    :func:`offpath.stores.updates.job_updates` reads from the job rows: queued, running and
    prepared are in progress (with the size when queued), applied is completed with its
    record's sizes, failed is failed and skipped cancelled (with the reason); a revert is no
    step of a compaction; ``since`` leaves out rows that did not change since."""
    from offpath.stores.db.engine import make_engine, migrate
    from offpath.stores.db.tables import JobStatus
    from offpath.stores.db.transitions import create_job, set_job, store_result
    from offpath.stores.updates import job_updates

    settings = load_settings(data_dir=str(tmp_path))
    migrate(settings)
    engine = make_engine(settings)
    for job in ("q", "p", "a", "f", "s", "r"):
        create_job(engine, job, "t1", 70_000)
    create_job(engine, "other", "t2", 1)
    store_result(engine, "p", {"prepared": {}}, JobStatus.PREPARED)
    record = {"record": {"chars_before": 72_000, "chars_after": 21_000}}
    store_result(engine, "a", record, JobStatus.APPLIED)
    set_job(engine, "f", "t1", JobStatus.FAILED, "summarizer timed out", "timeout")
    set_job(engine, "s", "t1", JobStatus.SKIPPED, "stale: kept message gone", "stale")
    set_job(engine, "r", "t1", JobStatus.REVERTED, "reverted", "reverted")
    got = {c.update.compaction_id: c.update for c in job_updates(engine, "t1")}
    assert set(got) == {"q", "p", "a", "f", "s"}
    assert got["q"].to_acp() == {
        "sessionUpdate": "compaction_update",
        "compactionId": "q",
        "status": "in_progress",
        "charsBefore": 70_000,
    }
    assert got["p"].status == "in_progress"
    assert (got["a"].status, got["a"].chars_before, got["a"].chars_after) == (
        "completed",
        72_000,
        21_000,
    )
    assert (got["f"].status, got["f"].reason) == ("failed", "summarizer timed out")
    assert (got["s"].status, got["s"].reason) == ("cancelled", "stale: kept message gone")
    last = max(c.at for c in job_updates(engine, "t1"))
    set_job(engine, "q", "t1", JobStatus.FAILED, "lease_lapsed", "lease_lapsed")
    later = job_updates(engine, "t1", since=last)
    assert [c.update.compaction_id for c in later if c.at > last] == ["q"]
    assert later[-1].update.status == "failed"
    engine.dispose()
