"""The deployment's figures outside ``/stats``: open jobs by status and what every process
recorded (the API's ``/metrics``), the summarizer's latency p90 (how early the middleware
starts a job), and the SQL and percentile helpers ``/stats`` shares."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from offpath.stores.db.tables import EVENTS, FINAL_VALUES, JOBS, MASKINGS, JobStatus


def open_job_counts(engine: Engine, *, published_only: bool = False) -> dict[str, int]:
    """Job rows not ended, by status (``published_only``: only jobs the broker took)."""
    q = (
        sa.select(JOBS.c.status, sa.func.count())
        .where(JOBS.c.status.not_in(list(FINAL_VALUES)))
        .group_by(JOBS.c.status)
    )
    if published_only:
        q = q.where(JOBS.c.published.is_(True))
    with engine.connect() as conn:
        rows: Iterable[tuple[Any, ...]] = conn.execute(q)  # (as tuples: their values typed Any)
        return {str(status): int(n) for status, n in rows}


def bought_counts() -> tuple[Any, Any, Any]:
    """The SQL of the summaries paid for, counted over job rows by where they went:
    ``(waiting, dropped, used)``: prepared and waiting for their thread; ended ``skipped`` or
    ``failed`` with the compaction they prepared in their row (stale, expired, superseded,
    not applied); applied (or reverted since)."""
    bought = JOBS.c.result["prepared"].as_string().is_not(None)
    waiting = JOBS.c.status == JobStatus.PREPARED.value
    dropped = JOBS.c.status.in_([JobStatus.SKIPPED.value, JobStatus.FAILED.value]) & bought
    used = JOBS.c.status.in_([JobStatus.APPLIED.value, JobStatus.REVERTED.value])
    count = sa.func.count
    return count().filter(waiting), count().filter(dropped), count().filter(used)


def saved_chars_expr() -> Any:
    """The SQL of one usage event's chars saved: its ``chars_saved`` (the real reduction,
    :func:`offpath.stores.db.chars_saved`), else (a row no record could fill, migration
    0010) its ``chars_removed``."""
    return sa.func.coalesce(
        EVENTS.c.metadata["chars_saved"].as_integer(),
        EVENTS.c.metadata["chars_removed"].as_integer(),
        0,
    )


def recorded_totals(engine: Engine) -> dict[str, int]:
    """What every process recorded, all time, for the API's ``/metrics`` (counters):
    ``compactions`` (usage events of compactions, reverted ones too: they happened),
    ``chars_saved`` (their real reduction), ``compactions_reverted`` and ``chars_restored``
    (the same two of the reverted ones: ``/stats`` counts ``compactions - compactions_reverted``
    and ``chars_saved - chars_restored``; a counter never goes down), ``fallback_maskings``,
    ``summaries_paid`` (summaries prepared: applied, waiting or dropped since) and
    ``summaries_dropped`` (ended without being applied: :func:`bought_counts`)."""
    summ = EVENTS.c.metadata["summarization"].as_boolean()
    counted = sa.select(
        sa.func.count(EVENTS.c.id), sa.func.coalesce(sa.func.sum(saved_chars_expr()), 0)
    ).where(summ.is_(True))
    reverted = counted.join_from(EVENTS, JOBS, JOBS.c.job_id == EVENTS.c.job_id).where(
        JOBS.c.status == JobStatus.REVERTED
    )
    with engine.connect() as conn:
        # the rows as tuples: their values typed Any
        counts: tuple[Any, ...] = conn.execute(counted).one()
        reverts: tuple[Any, ...] = conn.execute(reverted).one()
        compactions, saved = counts
        undone, restored = reverts
        maskings = conn.execute(sa.select(sa.func.count(MASKINGS.c.id))).scalar()
        bought: tuple[Any, ...] = conn.execute(sa.select(*bought_counts()).select_from(JOBS)).one()
        waiting, dropped, used = (int(n) for n in bought)
    return {
        "compactions": int(compactions),
        "chars_saved": int(saved),
        "compactions_reverted": int(undone),
        "chars_restored": int(restored),
        "fallback_maskings": int(maskings or 0),
        "summaries_paid": waiting + dropped + used,
        "summaries_dropped": dropped,
    }


def percentiles(values: Sequence[float], *qs: float) -> list[float | None]:
    """Nearest-rank percentiles (``qs`` in 0..100) of ``values``; None for none."""
    ordered = sorted(values)
    if not ordered:
        return [None for _ in qs]
    n = len(ordered)
    return [ordered[min(n - 1, max(0, int(-(-q * n // 100)) - 1))] for q in qs]


#: The summarizer's latency (s) assumed before any compaction of the deployment measured it,
#: and how often (s) :class:`SummarizerLatency` reads its p90 again; while none is measured,
#: it reads again after :data:`LATENCY_RETRY_S` (the default paces every thread of a fresh
#: deployment as if its summarizer took 5 s, so its jobs start earlier than they need to).
DEFAULT_LATENCY_S = 5.0
LATENCY_REFRESH_S = 60.0
LATENCY_RETRY_S = 5.0


class SummarizerLatency:
    """The deployment's summarizer latency p90 in seconds (:attr:`seconds`), read again at most
    every :data:`LATENCY_REFRESH_S`: a caller asks :meth:`due` and, when it says so, calls
    :meth:`refresh` (inline, or on a background thread). The last figure stays while the
    usage database is away; :data:`DEFAULT_LATENCY_S` until a compaction measured one, read
    again every :data:`LATENCY_RETRY_S` until then."""

    def __init__(
        self,
        seconds: float = DEFAULT_LATENCY_S,
        read_at: float = -math.inf,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seconds = seconds
        self.read_at = read_at  # clock time of the last read
        self.clock = clock
        self.measured = False  # a compaction's latency read

    def due(self) -> bool:
        """True when the figure is older than :data:`LATENCY_REFRESH_S` (:data:`LATENCY_RETRY_S`
        while none is measured); marks it read now, so concurrent callers start one read."""
        now = self.clock()
        if now - self.read_at < (LATENCY_REFRESH_S if self.measured else LATENCY_RETRY_S):
            return False
        self.read_at = now
        return True

    def refresh(self, engine: Engine) -> None:
        """Read the p90 from the usage database; keeps the last figure on any error."""
        try:
            value = summarizer_latency_p90_s(engine)
        except Exception:  # the usage database is away
            return
        if value is not None:
            self.seconds, self.measured = value, True


def summarizer_latency_p90_s(engine: Engine, sample: int = 200) -> float | None:
    """The p90 of the summarizer's latency over the deployment's latest ``sample``
    compactions, in seconds (None: none yet): how early the middleware starts a job so that
    its summary is ready when the thread crosses its threshold."""
    with engine.connect() as conn:
        rows: Iterable[tuple[Any, ...]] = conn.execute(
            sa.select(EVENTS.c.latency_ms).order_by(EVENTS.c.id.desc()).limit(sample)
        )
        values = [float(v) for (v,) in rows if v is not None]
    (p90,) = percentiles(values, 90)
    return None if p90 is None else p90 / 1000
