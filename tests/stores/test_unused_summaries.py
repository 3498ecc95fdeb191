"""``/stats`` reports the summaries paid for and never applied (issue 33, item 5): a job whose
row holds a prepared compaction (the summarizer was called) and that did not apply it:
waiting (prepared), or ended without it (dropped as stale, expired, superseded, failed)."""

from __future__ import annotations

import pytest
from stack import create_pg_database, drop_pg_database

from offpath.config import load_settings
from offpath.stores.db.engine import make_engine, migrate
from offpath.stores.db.tables import JobStatus
from offpath.stores.db.transitions import create_job, finalize, set_job, store_result
from offpath.stores.usage.stats_body import stats

BOUGHT = {"prepared": {"job_id": "x", "summary": "..."}, "usage": {"latency_ms": 5}}


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request):
    if request.param == "postgres":
        url = create_pg_database("offpath_test_unused")
        yield url
        drop_pg_database(url)
    else:
        yield ""


def test_stats_count_the_summaries_paid_for_and_never_applied(tmp_path, database_url):
    settings = load_settings(data_dir=str(tmp_path), database_url=database_url)
    migrate(settings)
    engine = make_engine(settings)
    record = {"messages_removed": 3, "chars_removed": 9_000, "chars_before": 20_000}
    for k in range(3):  # three applied
        create_job(engine, f"ok{k}", f"s-ok{k}", 20_000)
        result = {**BOUGHT, "record": {**record, "chars_after": 11_000}}
        store_result(engine, f"ok{k}", result, JobStatus.PREPARED)
        assert finalize(engine, f"ok{k}", f"s-ok{k}")
    create_job(engine, "waiting", "s-w", 25_000)  # prepared, waiting for its thread
    store_result(engine, "waiting", BOUGHT, JobStatus.PREPARED)
    create_job(engine, "stale", "s-st", 25_000)  # prepared, then dropped at the apply
    store_result(engine, "stale", BOUGHT, JobStatus.PREPARED)
    set_job(engine, "stale", "s-st", JobStatus.SKIPPED, "stale: a request moved", "stale")
    create_job(engine, "small", "s-sm", 25_000)  # skipped before any summary: not paid for
    set_job(engine, "small", "s-sm", JobStatus.SKIPPED, "too few", "too_few_messages")
    unused = stats(engine)["summary"]["summaries_not_applied"]
    alone = stats(engine, session_id="s-w")["summary"]["summaries_not_applied"]
    engine.dispose()
    assert unused == {"paid": 5, "waiting": 1, "dropped": 1, "share": 0.4}
    assert alone == {"paid": 1, "waiting": 1, "dropped": 0, "share": 1.0}
