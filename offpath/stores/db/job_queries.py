"""Reading the ``compaction_jobs`` rows: one job, a session's jobs, the reconciler's
candidates (open jobs gone quiet, threads to queue again) and a thread's failures in a row."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import func
from sqlalchemy.engine import Engine

from offpath.stores.db.tables import FINAL_VALUES, JOBS, JobStatus, as_utc


def has_unpublished_job(engine: Engine, session_id: str) -> bool:
    """The thread has a queued job the broker has not taken yet."""
    with engine.connect() as conn:
        return (
            conn.execute(
                sa.select(JOBS.c.job_id).where(
                    JOBS.c.session_id == session_id,
                    JOBS.c.published.is_(False),
                    JOBS.c.status == JobStatus.QUEUED.value,
                )
            ).first()
            is not None
        )


def job_row(engine: Engine, job_id: str) -> dict[str, Any] | None:
    """One job's row as a dict (None if there is none)."""
    with engine.connect() as conn:
        row = conn.execute(sa.select(JOBS).where(JOBS.c.job_id == job_id)).first()
    return dict(row._mapping) if row is not None else None


def job_options(engine: Engine, job_id: str) -> dict[str, Any] | None:
    """One job's ``options`` (None: no such job, or none stored); reads nothing else of it."""
    with engine.connect() as conn:
        return conn.execute(sa.select(JOBS.c.options).where(JOBS.c.job_id == job_id)).scalar()


def open_jobs(engine: Engine, quiet_since: datetime) -> list[dict[str, Any]]:
    """Jobs not ended yet whose row has not changed since ``quiet_since`` (the reconciler's
    candidates), oldest first."""
    q = (
        sa.select(JOBS)
        .where(JOBS.c.status.not_in(list(FINAL_VALUES)), JOBS.c.updated_at < quiet_since)
        .order_by(JOBS.c.created_at)
    )
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(q)]


def pending_losses(engine: Engine, pending: str, quiet_since: datetime) -> list[dict[str, Any]]:
    """Applied jobs whose loss report is still the placeholder an in-run apply stores before
    it makes the report (its ``error`` is ``pending``), and whose row has not changed since
    ``quiet_since``: the process that applied them ended before it made the report."""
    loss = JOBS.c.result[("record", "loss", "error")].as_string()
    q = (
        sa.select(JOBS)
        .where(
            JOBS.c.status == JobStatus.APPLIED.value,
            loss == pending,
            JOBS.c.updated_at < quiet_since,
        )
        .order_by(JOBS.c.updated_at)
    )
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(q)]


#: Reason codes of ended jobs whose thread is still over its threshold with no job.
REQUEUE_CODES = ("stale",)


def threads_to_requeue(engine: Engine, ended_since: datetime) -> list[tuple[str, Any]]:
    """Threads whose latest job ended ``failed`` (or skipped as stale) since ``ended_since``,
    with no job open, and that job's options: they are still over the threshold and need
    one (the reconciler queues it once the failure backoff, held in the thread's claim,
    has passed)."""
    latest = (
        sa.select(JOBS.c.session_id, func.max(JOBS.c.created_at).label("at"))
        .group_by(JOBS.c.session_id)
        .subquery()
    )
    q = (
        sa.select(JOBS.c.session_id, JOBS.c.options)
        .join(
            latest,
            sa.and_(JOBS.c.session_id == latest.c.session_id, JOBS.c.created_at == latest.c.at),
        )
        .where(
            JOBS.c.updated_at >= ended_since,
            sa.or_(
                JOBS.c.status == JobStatus.FAILED.value,
                sa.and_(
                    JOBS.c.status == JobStatus.SKIPPED.value,
                    JOBS.c.reason_code.in_(REQUEUE_CODES),
                ),
            ),
        )
    )
    with engine.connect() as conn:
        return list({r.session_id: (r.session_id, r.options) for r in conn.execute(q)}.values())


def failures_in_a_row(engine: Engine, session_id: str) -> tuple[int, datetime | None]:
    """How many of the thread's latest jobs failed in a row, and when the last one ended."""
    q = (
        sa.select(JOBS.c.status, JOBS.c.updated_at)
        .where(JOBS.c.session_id == session_id, JOBS.c.status.in_(list(FINAL_VALUES)))
        .order_by(JOBS.c.created_at.desc())
        .limit(64)
    )
    count, last = 0, None
    with engine.connect() as conn:
        for row in conn.execute(q):
            if row.status != JobStatus.FAILED.value:
                break
            count += 1
            last = last or as_utc(row.updated_at)
    return count, last


def jobs_of(engine: Engine, session_id: str) -> list[dict[str, Any]]:
    """A session's jobs, oldest first (what an applied one removed is in its ``result``)."""
    q = sa.select(JOBS).where(JOBS.c.session_id == session_id).order_by(JOBS.c.created_at)
    with engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(q)]


#: Most of a session's applied jobs whose lost facts :func:`lost_of` reads (the newest).
LOST_JOBS = 64


def lost_of(engine: Engine, session_id: str, limit: int = LOST_JOBS) -> list[list[Any]]:
    """The facts each of a session's ``limit`` newest applied jobs lost from view, as their
    loss reports list them (``record.loss.lost``: a list of dicts, or None where the report is
    not there), oldest first; the rest of each row (the summary, the plan) is not read."""
    lost = JOBS.c.result["record"]["loss"]["lost"]
    q = (
        sa.select(lost)
        .where(JOBS.c.session_id == session_id, JOBS.c.status == JobStatus.APPLIED.value)
        .order_by(JOBS.c.created_at.desc())
        .limit(limit)
    )
    with engine.connect() as conn:
        rows = [r[0] for r in conn.execute(q)]
    return [r if isinstance(r, list) else [] for r in reversed(rows)]
