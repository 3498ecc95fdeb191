"""A reverted compaction shows nothing saved and nothing lost (issue 32, item 6): its
originals are back in the thread, whatever its record says it removed."""

from __future__ import annotations

from datetime import UTC, datetime

from offpath.api.session_jobs import job_json
from offpath.stores.db.tables import JobStatus

RECORD = {
    "messages_removed": 14,
    "chars_removed": 42_000,
    "chars_before": 50_000,
    "chars_after": 12_000,
    "summarizer": "offline",
    "loss": {
        "messages_removed": 14,
        "chars_removed": 42_000,
        "results_shortened": 1,
        "chars_shortened": 900,
        "facts": 40,
        "facts_lost": 12,
        "lost": [{"value": "pod-x7", "kind": "identifier", "message_id": "m3"}],
        "ground_truth": None,
    },
}


def row(status: str) -> dict:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return {
        "job_id": "j1",
        "status": status,
        "reason": None,
        "reason_code": None,
        "attempts": 1,
        "published": True,
        "chars_before": 50_000,
        "chars_at_apply": 50_000,
        "result": {"record": RECORD},
        "created_at": now,
        "updated_at": now,
    }


def test_an_applied_job_shows_what_it_saved_and_lost():
    job = job_json(row(JobStatus.APPLIED))
    assert (job["chars_saved"], job["chars_removed"], job["messages_removed"]) == (
        38_000,
        42_000,
        14,
    )
    assert job["loss"]["facts_lost"] == 12


def test_a_reverted_job_shows_nothing_saved_and_nothing_lost():
    job = job_json(row(JobStatus.REVERTED))
    assert (job["chars_saved"], job["chars_removed"], job["messages_removed"]) == (0, 0, 0)
    loss = job["loss"]
    assert (loss["facts"], loss["facts_lost"], loss["lost"], loss["chars_shortened"]) == (
        0,
        0,
        [],
        0,
    )
    assert job["summarizer"] == "offline"  # what ran is still shown


def test_the_session_page_shows_a_jobs_real_reduction_as_chars_saved():
    from offpath.api.ui import templates

    def page(status: str) -> str:
        job = {**job_json(row(status)), "took_s": 1.0, "revertible": False, "forced": False}
        job["chars_when_queued"] = None
        return templates.env.get_template("_jobs.html").render(jobs=[job], session_id="s")

    applied = page(JobStatus.APPLIED)
    assert 'data-chars-saved="38000"' in applied  # before less after, not the 42,000 removed
    assert "42,000 chars in 14 messages summarized" in applied
    assert 'data-chars-saved="0"' in page(JobStatus.REVERTED)
