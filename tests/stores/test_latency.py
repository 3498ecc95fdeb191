"""The summarizer's latency p90 the prepare point reads, on a real SQLite usage database."""

from __future__ import annotations

import sqlalchemy as sa

from offpath.config import load_settings
from offpath.stores.db.engine import make_engine, migrate
from offpath.stores.db.tables import EVENTS
from offpath.stores.usage.totals import (
    DEFAULT_LATENCY_S,
    LATENCY_REFRESH_S,
    LATENCY_RETRY_S,
    SummarizerLatency,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_the_latency_is_read_once_a_minute_and_kept_while_the_database_is_away(tmp_path):
    settings = load_settings(data_dir=str(tmp_path))
    migrate(settings)
    engine = make_engine(settings)
    away = sa.create_engine(f"sqlite:///{tmp_path / 'missing' / 'no.db'}")
    clock = Clock()
    latency = SummarizerLatency(clock=clock)
    try:
        assert latency.seconds == DEFAULT_LATENCY_S  # no compaction measured yet
        with engine.begin() as conn:
            conn.execute(
                EVENTS.insert(),
                [
                    {"session_id": "s", "model": "m", "latency_ms": ms, "metadata": {}}
                    for ms in range(100, 1_100, 100)  # 0.1 .. 1.0 s
                ],
            )
        assert latency.due() and not latency.due()  # one read per interval, however many ask
        latency.refresh(engine)
        assert latency.seconds == 0.9  # the p90 of ten compactions
        clock.now += LATENCY_REFRESH_S - 1
        assert not latency.due()
        clock.now += 1
        assert latency.due()
        latency.refresh(away)  # the usage database is away: the last figure stays
        assert latency.seconds == 0.9
    finally:
        engine.dispose()
        away.dispose()


def test_until_a_compaction_is_measured_the_latency_is_read_again_soon(tmp_path):
    # a process that started before the deployment's first compaction paces by the default
    # only until one is measured, not for a whole refresh interval
    settings = load_settings(data_dir=str(tmp_path))
    migrate(settings)
    engine = make_engine(settings)
    clock = Clock()
    latency = SummarizerLatency(clock=clock)
    try:
        assert latency.due()
        latency.refresh(engine)  # nothing measured yet
        assert latency.seconds == DEFAULT_LATENCY_S
        clock.now += LATENCY_RETRY_S - 1
        assert not latency.due()
        clock.now += 1
        assert latency.due()
        with engine.begin() as conn:
            conn.execute(
                EVENTS.insert(),
                [{"session_id": "s", "model": "m", "latency_ms": 1_200, "metadata": {}}],
            )
        latency.refresh(engine)
        assert latency.seconds == 1.2
        clock.now += LATENCY_RETRY_S
        assert not latency.due()  # measured: read again once a refresh interval has passed
        clock.now += LATENCY_REFRESH_S - LATENCY_RETRY_S
        assert latency.due()
    finally:
        engine.dispose()
