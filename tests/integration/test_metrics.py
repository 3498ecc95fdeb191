"""offpath's own Prometheus metrics (issue 12): replay the example incident through the real
API and worker, scrape ``/metrics`` of both, and check the counters against the job rows and
usage events in the database (every job status change is counted by the process that made
it, so API + worker add up to the rows)."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from datetime import datetime

import httpx
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families
from stack import REDIS_URL, ROOT, Stack, forget_broker_queue, free_port, wait_for

from integration.test_api_pipeline import replay

#: As tests/integration/test_api_pipeline.py's CASE_SETTINGS.
SETTINGS = {
    "SUMMARIZATION_THRESHOLD_CHARS": "30000",
    "SUMMARIZATION_KEEP_CHARS": "10000",
    "SUMMARIZATION_TIMEOUT_S": "30",
}


def scrape(url: str, key: str | None = None) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of a /metrics page."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.get(url, headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(samples: dict, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def rows(stack: Stack, sql: str) -> list:
    engine = sa.create_engine(stack.db_url())
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text(sql)))
    finally:
        engine.dispose()


def test_metrics_of_api_and_worker_add_up_to_the_job_rows(stacks):
    port = free_port()
    stack = stacks.get("sqlite", WORKER_METRICS_PORT=str(port), **SETTINGS)
    worker_url = f"http://127.0.0.1:{port}/metrics"
    wait_for(lambda: _answers(worker_url), timeout=20)

    # the API's /metrics: an admin key (no key: 401; a tenant's key: 403)
    assert httpx.get(f"{stack.url}/metrics").status_code == 401
    tenant_key = stack.create_key(f"m-{uuid.uuid4().hex[:6]}")
    r = httpx.get(f"{stack.url}/metrics", headers={"Authorization": f"Bearer {tenant_key}"})
    assert r.status_code == 403 and "METRICS_PUBLIC" in r.json()["detail"]

    doc = json.loads((ROOT / "examples" / "incident-checkout-latency.json").read_text())
    session = f"metrics-{uuid.uuid4().hex[:8]}"
    _, _, compactions = replay(stack, session, doc)
    assert compactions >= 2

    def settled() -> bool:  # nothing queued or running, in the rows and in the broker
        open_jobs = rows(
            stack, "SELECT count(*) FROM compaction_jobs WHERE status IN ('queued', 'running')"
        )
        return open_jobs[0][0] == 0

    wait_for(settled, timeout=60)
    time.sleep(0.5)  # a job's last counter is bumped right after its row changed
    api = scrape(f"{stack.url}/metrics", stack.key)
    worker = scrape(worker_url)
    both = Counter()
    for samples in (api, worker):
        for (name, labels), value in samples.items():
            if name == "offpath_jobs_total":
                both[dict(labels)["status"]] += value

    jobs = rows(stack, "SELECT status, reason_code FROM compaction_jobs")
    by_status = Counter(status for status, _ in jobs)
    assert by_status["applied"] >= compactions
    for status in ("applied", "skipped", "failed"):
        assert both[status] == by_status[status], (status, dict(both), dict(by_status))
    assert both["queued"] == len(jobs)  # every job was queued once
    assert both["prepared"] >= by_status["prepared"]
    # by reason: what the rows say
    for status, code in {(s, c) for s, c in jobs if s in ("skipped", "failed")}:
        n = sum(1 for s, c in jobs if (s, c) == (status, code))
        counted = total(api, "offpath_jobs_total", status=status, reason=code or "")
        counted += total(worker, "offpath_jobs_total", status=status, reason=code or "")
        assert counted == n, (status, code)

    events = rows(stack, "SELECT input_tokens, output_tokens, metadata FROM usage_events")
    chars = sum(json.loads(m)["chars_saved"] for _, _, m in events)
    applied = len(events)
    assert applied == by_status["applied"]
    # read from the usage tables by the API at scrape (issue 21, item 6): every process's
    # compactions, their real reduction (no re-folded summary counted twice), the maskings
    assert not [
        n for n, _ in worker if n.startswith(("offpath_chars_saved", "offpath_compactions"))
    ]
    assert total(api, "offpath_compactions_total") == applied
    saved = total(api, "offpath_chars_saved_total")
    assert saved == chars == stack.http.get("/stats").json()["summary"]["total_chars_compacted"]
    # the sizes each job recorded: before (also on its row, for the size chart) and after
    records = rows(
        stack, "SELECT chars_at_apply, result FROM compaction_jobs WHERE status = 'applied'"
    )
    sizes = [(at, json.loads(r)["record"]) for at, r in records]
    assert all(at == rec["chars_before"] for at, rec in sizes)
    assert saved == sum(rec["chars_before"] - rec["chars_after"] for _, rec in sizes) > 0
    (maskings,) = rows(stack, "SELECT count(*) FROM fallback_maskings")
    assert total(api, "offpath_fallback_maskings_total") == maskings[0]
    # the summaries paid for and never applied (issue 33, item 5): /stats' figures, from the rows
    # (each applied, reverted or prepared job paid for one; an ended one that holds what it
    # prepared paid for one it never used)
    every = rows(stack, "SELECT status, result FROM compaction_jobs")
    used = sum(1 for status, _ in every if status in ("applied", "reverted", "prepared"))
    dropped = sum(
        1
        for status, result in every
        if status in ("skipped", "failed") and result and json.loads(result).get("prepared")
    )
    paid = used + dropped
    not_applied = stack.http.get("/stats").json()["summary"]["summaries_not_applied"]
    assert total(api, "offpath_summaries_paid_total") == paid == not_applied["paid"] > 0
    assert total(api, "offpath_summaries_dropped_total") == dropped == not_applied["dropped"]
    lags = total(api, "offpath_compaction_lag_seconds_count") + total(
        worker, "offpath_compaction_lag_seconds_count"
    )
    assert lags == applied
    # each lag runs from the crossing the post-turn hook saw (else from the queueing) to the
    # patch: the histogram's sum is what the job rows say
    spans = rows(
        stack,
        "SELECT created_at, crossed_at, updated_at FROM compaction_jobs WHERE status = 'applied'",
    )
    assert any(crossed is not None for _, crossed, _ in spans)  # the hook saw a crossing
    expected = sum(
        (_at(done) - _at(crossed or created)).total_seconds() for created, crossed, done in spans
    )
    observed = total(api, "offpath_compaction_lag_seconds_sum") + total(
        worker, "offpath_compaction_lag_seconds_sum"
    )
    assert abs(observed - expected) < 0.01 * applied, (observed, expected)
    # the summarizer runs in the worker only: every call counted, with the LLM's tokens
    calls = total(worker, "offpath_summarizer_latency_seconds_count")
    assert calls >= applied and total(api, "offpath_summarizer_latency_seconds_count") == 0
    assert (
        total(worker, "offpath_summarizer_tokens_total", kind="input")
        >= sum(i for i, _, _ in events)
        > 0
    )
    # read at scrape time, by the API: the broker's queue and the open job rows
    assert total(api, "offpath_queue_depth") == 0
    assert ("offpath_queue_depth", (("queue", stack.env["CELERY_QUEUE"]),)) in api
    assert total(api, "offpath_jobs_open", status="prepared") == by_status["prepared"]
    assert total(api, "offpath_jobs_open", status="queued") == 0


def _at(value) -> datetime:
    """A timestamp as SQLite hands it back (text, UTC)."""
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_queue_depth_is_read_from_the_broker_at_scrape(tmp_path):
    """``offpath_queue_depth`` counts the messages waiting in the Redis list kombu keeps the
    queue in: three jobs sent to a queue no worker consumes."""
    from celery import Celery

    from offpath.config import load_settings
    from offpath.coordination.exporter import QueueCollector
    from offpath.coordination.runtime import Client

    queue = f"test-depth-{uuid.uuid4().hex[:8]}"
    settings = load_settings(redis_url=REDIS_URL, celery_queue=queue, data_dir=str(tmp_path))
    client = Client.open(settings, make_tables=False)  # a database as it is: no tables
    app = Celery(broker=REDIS_URL)
    try:
        for i in range(3):
            app.send_task("compact_session", args=[f"s{i}"], queue=queue)
        found = {m.name: m for m in QueueCollector(client).collect()}
        depth = found["offpath_queue_depth"].samples
        assert [(s.labels, s.value) for s in depth] == [({"queue": queue}, 3.0)]
        assert "offpath_jobs_open" not in found  # no usage tables here: left out, no error
    finally:
        app.close()
        client.close()
        forget_broker_queue({"REDIS_URL": REDIS_URL, "CELERY_QUEUE": queue})
