"""The post-turn hook on real Redis and a real SQLite usage DB (issue 3, item 3)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import redis
import sqlalchemy as sa
from shared import CASES, load, messages_of
from stack import REDIS_URL

from compaction.settings import load_settings
from service.db import JOBS, JobStatus, create_job, make_engine, migrate, now_utc, set_job
from service.hook import PostTurnHook
from service.locks import ThreadLocks


@pytest.fixture
def parts(tmp_path):
    settings = load_settings(
        data_dir=str(tmp_path),
        summarization_threshold_chars=30_000,
        summarization_keep_chars=10_000,
    )
    migrate(settings)
    engine = make_engine(settings)
    client = redis.Redis.from_url(REDIS_URL)
    locks = ThreadLocks(
        client, timeout_s=5, wait_s=1, claim_ttl_s=60, prefix=f"hooktest-{uuid.uuid4().hex[:6]}"
    )
    published: list[tuple[str, str]] = []
    hook = PostTurnHook(settings, locks, engine, lambda s, j: published.append((s, j)))
    yield settings, engine, locks, hook, published
    engine.dispose()
    client.close()


def over_threshold():
    return messages_of(load(next(p for p in CASES if p.stem == "summary-first")))


def test_hook_queues_once_per_thread(parts):
    _, _, _, hook, published = parts
    first = hook("t1", over_threshold())
    second = hook("t1", over_threshold())
    assert first.action == "queued" and second.action == "already_queued"
    assert published == [("t1", first.job_id)]


def test_hook_skips_a_thread_under_the_threshold(parts):
    _, _, _, hook, published = parts
    assert hook("t2", over_threshold()[:5]).action == "skipped" and not published


@pytest.mark.parametrize(
    ("status", "age_s", "taken"),
    [("applied", 0, True), ("failed", 0, True), ("running", 0, False), ("running", 3600, True)],
)
def test_claim_of_an_ended_or_dead_job_is_taken_over(parts, status, age_s, taken):
    _, engine, locks, hook, published = parts
    old = uuid.uuid4().hex
    create_job(engine, old, "t3", 1)
    set_job(engine, old, "t3", JobStatus(status))
    with engine.begin() as conn:
        conn.execute(
            sa.update(JOBS)
            .where(JOBS.c.job_id == old)
            .values(updated_at=now_utc() - timedelta(seconds=age_s))
        )
    assert locks.claim_job("t3", old)
    result = hook("t3", over_threshold())
    assert (result.action == "queued") is taken, result
    assert locks.claimed_by("t3") == (result.job_id if taken else old)


def test_disabled_hook_touches_nothing():
    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the disabled hook used {name}")

    hook = PostTurnHook(
        load_settings(summarization_enabled=False), Untouchable(), Untouchable(), Untouchable()
    )
    assert hook("t4", over_threshold()).action == "skipped"


def test_broker_down_is_reported_not_raised(parts, tmp_path):
    settings, engine, _, _, _ = parts
    dead = ThreadLocks(
        redis.Redis(port=1, socket_connect_timeout=0.5), timeout_s=5, wait_s=1, claim_ttl_s=60
    )
    hook = PostTurnHook(settings, dead, engine, lambda s, j: None)
    result = hook("t5", over_threshold())
    assert result.action == "error" and "broker unreachable" in result.detail
