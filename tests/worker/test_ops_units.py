"""The operator's rules of issue 21, as pure functions: when a prepared compaction expires
(item 2), when the workers are ready to run the jobs (item 3), and what a compaction saved
(item 6: a summary folded again into the next one is not saved twice)."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph.message import add_messages

from offpath.compaction.accounting import total_chars
from offpath.compaction.patch import Prepared, fit
from offpath.compaction.planner import Skip, plan_compaction
from offpath.config import load_settings
from offpath.coordination.consumers import Consumers, ConsumerWatch, from_active_queues, readiness
from offpath.stores.db.tables import chars_saved
from offpath.worker.reconciler import expiry_reason, prepared_expired

# --- item 2: a prepared compaction expires --------------------------------------------------


def test_a_prepared_compaction_expires_strictly_after_its_ttl():
    at = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)
    assert not prepared_expired(at, at + timedelta(seconds=3600), 3600)
    assert prepared_expired(at, at + timedelta(seconds=3600.5), 3600)
    # SQLite hands back naive datetimes: they are UTC
    assert prepared_expired(at.replace(tzinfo=None), at + timedelta(hours=2), 3600)
    assert not prepared_expired(at.replace(tzinfo=None), at + timedelta(minutes=5), 3600)


def test_the_expiry_reason_says_why_and_names_the_setting():
    reason = expiry_reason(3600)
    assert reason.startswith("expired: not applied within 3600 s (PREPARED_JOB_TTL_S)")
    assert "did not run again" in reason and "unchanged" in reason
    assert len(reason) <= 300  # stored whole (db.MAX_REASON_CHARS)


def test_the_default_ttl_is_an_hour_and_at_most_the_claims_day():
    import pytest

    from offpath.compaction.settings import SettingsError

    assert load_settings().prepared_job_ttl_s == 3600
    with pytest.raises(SettingsError, match="prepared_job_ttl_s|PREPARED_JOB_TTL_S"):
        load_settings(prepared_job_ttl_s=86_401)


# --- item 3: workers consuming each queue --------------------------------------------------

BROKER = "redis://:hunter2@10.0.0.5:6379/0"


def test_active_queues_answers_become_workers_by_queue():
    answer = {
        "w2@host": [{"name": "compaction", "exchange": {}}],
        "w1@host": [{"name": "compaction"}, {"name": "other"}],
        "w3@host": [],
    }
    assert from_active_queues(answer) == {
        "compaction": ("w1@host", "w2@host"),
        "other": ("w1@host",),
    }
    assert from_active_queues(None) == {}  # no worker answered


def test_a_queue_with_no_consumer_is_not_ready_and_the_message_names_queue_and_broker():
    found = Consumers(queues={"other": ("w1@h",)}, at=1.0)
    ok, queues, message = readiness(found, ["compaction"], BROKER)
    assert not ok
    assert queues == {"compaction": {"consumers": 0, "workers": []}}
    assert "no worker consumes queue 'compaction'" in message
    assert "10.0.0.5:6379" in message and "hunter2" not in message  # no password shown
    assert "offpath worker" in message


def test_consumers_on_every_queue_are_ready():
    found = Consumers(queues={"compaction": ("w1@h", "w2@h")}, at=1.0)
    ok, queues, message = readiness(found, ["compaction"], BROKER)
    assert ok and queues["compaction"]["consumers"] == 2
    assert message.startswith("ok: 2 worker(s)")


def test_a_broker_that_cannot_be_asked_is_not_ready_one_that_cannot_broadcast_is_unknown():
    ok, _, message = readiness(Consumers(error="ConnectionError: refused"), ["q"], BROKER)
    assert not ok and "could not ask the workers" in message and "refused" in message
    ok, queues, message = readiness(Consumers(supported=False), ["q"], "sqla+sqlite:///b.db")
    assert ok and queues == {} and message.startswith("unknown")


def test_the_workers_are_asked_once_per_cache_period():
    calls = []

    def ask() -> Consumers:
        import time

        calls.append(1)
        return Consumers(queues={"q": ("w",)}, at=time.time())

    watch = ConsumerWatch(ask, cache_s=60)
    assert [watch.get().count("q") for _ in range(5)] == [1] * 5
    assert len(calls) == 1
    stale = ConsumerWatch(ask, cache_s=0)
    stale.get()
    stale.get()
    assert len(calls) == 3


# --- item 6: the real reduction --------------------------------------------------------------


def test_chars_saved_is_the_size_before_less_the_size_after():
    assert chars_saved(
        {"chars_before": 70_000, "chars_after": 18_000, "chars_removed": 60_000}
    ) == (52_000)
    # an old record without the sizes: what it removed less the summary it put in
    assert chars_saved({"chars_removed": 60_000, "summary_chars": 3_000}) == 57_000
    assert chars_saved({"chars_removed": 5}) == 5


def test_savings_over_repeated_compactions_count_each_char_once():
    """A thread compacted again and again: each compaction removes the previous summary
    (re-folded) with the older messages. Summed, ``chars_removed`` counts those summaries
    once more per compaction; ``chars_saved`` adds up to what the thread produced less
    what it holds at the end."""
    settings = load_settings(summarization_threshold_chars=6_000, summarization_keep_chars=2_000)
    thread: list = []
    produced = removed = saved = compactions = 0
    for turn in range(40):
        new = [
            HumanMessage(id=f"h{turn}", content=f"step {turn}: check the pods again"),
            AIMessage(
                id=f"a{turn}",
                content="",
                tool_calls=[{"id": f"c{turn}", "name": "kubectl", "args": {}, "type": "tool_call"}],
            ),
            ToolMessage(id=f"t{turn}", tool_call_id=f"c{turn}", content="pod ok\n" * 90),
        ]
        produced += total_chars(new)
        thread = add_messages(thread, new)
        if total_chars(thread) <= settings.summarization_threshold_chars:
            continue
        plan = plan_compaction(thread, settings)
        if isinstance(plan, Skip):
            continue
        prepared = Prepared.from_plan(
            plan,
            job_id=f"j{turn}",
            summary_text="Checked the pods: all ok.",
            summarizer="t",
            model="m",
        )
        fitted = fit(prepared, thread)
        thread = add_messages(thread, fitted.patch)
        assert fitted.record["chars_after"] == total_chars(thread)
        removed += fitted.record["chars_removed"]
        saved += chars_saved(fitted.record)
        compactions += 1
    assert compactions >= 3
    assert saved == produced - total_chars(thread)
    assert removed > saved  # the re-folded summaries, counted again by chars_removed


# --- migration 0010 on real databases --------------------------------------------------------


def test_migration_0010_fills_the_size_at_apply_and_the_real_savings_of_older_rows(tmp_path):
    """Rows written before migration 0010 (an applied job whose record has the sizes, one
    whose record has only what it removed and its summary's size) get ``chars_at_apply``
    and their usage event's ``chars_saved``; ``/stats`` then counts the real reduction. On
    SQLite and on PostgreSQL (JSON columns come back differently)."""
    import json
    from pathlib import Path

    import sqlalchemy as sa
    from alembic import command
    from alembic.config import Config
    from stack import create_pg_database, drop_pg_database

    from offpath.stores import db
    from offpath.stores.db.engine import make_engine, migrate, sqlalchemy_url
    from offpath.stores.db.job_queries import jobs_of
    from offpath.stores.db.tables import EVENTS
    from offpath.stores.usage.stats_body import stats

    pg = create_pg_database("offpath_test_mig")
    try:
        for url in (f"sqlite:///{tmp_path}/usage.db", pg):
            sqlite = url.startswith("sqlite")
            settings = load_settings(data_dir=str(tmp_path), database_url="" if sqlite else url)
            cfg = Config()
            folder = Path(db.__file__).resolve().parent.parent / "migrations"
            cfg.set_main_option("script_location", str(folder))
            cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(settings).replace("%", "%%"))
            command.upgrade(cfg, "0008")
            engine = sa.create_engine(sqlalchemy_url(settings))
            sized = {"chars_before": 70_000, "chars_after": 18_000, "chars_removed": 61_000}
            unsized = {"chars_removed": 40_000, "summary_chars": 2_500}
            with engine.begin() as conn:
                for job, record in (("j-sized", sized), ("j-unsized", unsized)):
                    conn.execute(
                        sa.text(
                            "INSERT INTO compaction_jobs (job_id, session_id, status, attempts, "
                            "published, result, created_at, updated_at) VALUES (:j, 's', "
                            "'applied', 1, true, :r, :t, :t)"
                        ),
                        {"j": job, "r": json.dumps({"record": record}), "t": "2026-12-01"},
                    )
                    meta = {"summarization": True, "messages_removed": 9, **record}
                    meta = {
                        k: v for k, v in meta.items() if k not in ("chars_before", "chars_after")
                    }
                    conn.execute(
                        sa.text(
                            "INSERT INTO usage_events (job_id, session_id, model, input_tokens, "
                            "output_tokens, latency_ms, tool_call_count, metadata, created_at) "
                            "VALUES (:j, 's', 'm', 0, 0, 0, 0, :m, :t)"
                        ),
                        {"j": job, "m": json.dumps(meta), "t": "2026-12-01"},
                    )
            engine.dispose()
            migrate(settings)
            engine = make_engine(settings)
            try:
                jobs = {r["job_id"]: r for r in jobs_of(engine, "s")}
                assert jobs["j-sized"]["chars_at_apply"] == 70_000
                assert jobs["j-unsized"]["chars_at_apply"] is None
                with engine.connect() as conn:
                    saved = {
                        j: m["chars_saved"]
                        for j, m in conn.execute(sa.select(EVENTS.c.job_id, EVENTS.c.metadata))
                    }
                assert saved == {"j-sized": 52_000, "j-unsized": 37_500}, url
                assert stats(engine)["summary"]["total_chars_compacted"] == 89_500
            finally:
                engine.dispose()
    finally:
        drop_pg_database(pg)


def test_the_worker_settles_its_heap_and_spaces_its_full_collections():
    """Once its runtime is open the worker freezes what start-up made and raises the oldest
    generation's threshold (:data:`JOB_GC_THRESHOLDS`): at CPython's 10 a full collection
    over the process's caches (~50 ms) came every ~15 jobs; the younger generations keep
    CPython's thresholds (what a job frees is freed as soon as before)."""
    import gc

    from offpath.worker.jobs import JOB_GC_THRESHOLDS, settle_heap

    before = gc.get_threshold()
    try:
        settle_heap()
        assert gc.get_threshold() == JOB_GC_THRESHOLDS and gc.get_freeze_count() > 0
        assert JOB_GC_THRESHOLDS[:2] == (700, 10) and JOB_GC_THRESHOLDS[2] >= 100
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_the_worker_loads_the_token_encoder_before_its_first_job(tmp_path):
    """The encoder every job counts a thread's tokens with is loaded when the worker's
    runtime opens (``load_job_path``), not inside the first job: there its load held the
    GIL for ~0.5 s while another thread renewed the job's running lease. Run in a fresh
    interpreter (this one may have loaded it already), on SQLite under ``tmp_path``."""
    import subprocess
    import sys

    from stack import REDIS_URL

    code = (
        "from offpath.compaction import tokens\n"
        "from offpath.worker import tasks\n"
        "before = tokens.DEFAULT_ENCODING in tokens._LOADED\n"
        "rt, _ = tasks.runtime()\n"
        "print(before, tokens.DEFAULT_ENCODING in tokens._LOADED)\n"
        "rt.close()\n"
    )
    env = {
        **os.environ,
        "DATA_DIR": str(tmp_path),
        "DATABASE_URL": "",
        "REDIS_URL": REDIS_URL,
        "REDIS_KEY_PREFIX": f"test-warm-{uuid.uuid4().hex[:8]}",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True"]
