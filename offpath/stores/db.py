"""Usage tables (SQLModel) and their queries: ``usage_events`` and ``compaction_jobs``.

SQLite under ``DATA_DIR`` by default, PostgreSQL when ``DATABASE_URL`` says so;
the schema is created by Alembic (``stores/migrations/``, :func:`migrate`).

``usage_events`` has the seed's fields (session id, model, input and output
tokens, latency in ms, tool-call count, ``metadata`` JSON with
``summarization: true``, ``messages_removed``, ``chars_removed``; ours: ``chars_saved``,
the real reduction, :func:`chars_saved`) and a unique
``job_id``: a job delivered twice records one event (DESIGN.md invariant 4).
``compaction_jobs`` has one row per job and how it ended.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import JSON, Column, event, func
from sqlalchemy.engine import Engine
from sqlmodel import Field, SQLModel, create_engine

from offpath import metrics
from offpath.compaction.settings import Settings


class JobStatus(enum.StrEnum):
    """A job's life: ``queued`` -> ``running`` -> ``applied``, ``skipped`` or ``failed``;
    or ``running`` -> ``prepared`` (its compaction waits for the thread to be free and over
    its threshold) -> ``applied``, or ``skipped`` (stale). An applied compaction may be
    undone (``POST /sessions/{id}/compactions/{job}/revert``): ``applied`` -> ``reverted``
    (issue 19)."""

    QUEUED = "queued"
    RUNNING = "running"
    PREPARED = "prepared"
    APPLIED = "applied"
    SKIPPED = "skipped"
    FAILED = "failed"
    REVERTED = "reverted"


FINAL = (JobStatus.APPLIED, JobStatus.SKIPPED, JobStatus.FAILED, JobStatus.REVERTED)
FINAL_VALUES = frozenset(f.value for f in FINAL)
#: A delivery of a job in these states runs it; in any other, it has nothing to do.
RUNNABLE_VALUES = frozenset({JobStatus.QUEUED.value, JobStatus.RUNNING.value})


def _now() -> datetime:
    return datetime.now(UTC)


class UsageEvent(SQLModel, table=True):
    """One LLM usage; for a compaction ``metadata["summarization"]`` is true."""

    __tablename__ = "usage_events"

    id: int | None = Field(default=None, primary_key=True)
    job_id: str | None = Field(default=None, unique=True, max_length=64)
    session_id: str = Field(index=True, max_length=128)
    model: str = Field(max_length=200)
    input_tokens: int = 0
    output_tokens: int = 0
    latency_ms: int = 0
    tool_call_count: int = 0
    metadata_: dict[str, Any] = Field(
        default_factory=dict, sa_column=Column("metadata", JSON, nullable=False)
    )
    created_at: datetime = Field(
        default_factory=_now, index=True, sa_type=sa.DateTime(timezone=True)
    )


#: Most chars of a job's stored ``reason``.
MAX_REASON_CHARS = 300


def _reason(reason: str | None) -> str | None:
    """A reason as stored: one line, at most :data:`MAX_REASON_CHARS` chars."""
    if not reason:
        return None
    line = " ".join(reason.split())
    return line if len(line) <= MAX_REASON_CHARS else line[: MAX_REASON_CHARS - 3] + "..."


class CompactionJob(SQLModel, table=True):
    """One queued compaction request and how it ended.

    ``reason_code`` names why a job was skipped or failed (low cardinality, for
    metrics); ``reason`` says it in offpath's words, at most :data:`MAX_REASON_CHARS`
    (never an exception's text: it is shown by ``/stats`` and the UI; the log has the
    detail, issue 20, item 9). ``published`` is false while the broker
    has not taken the job (the reconciler publishes it). ``options`` say how it may
    apply its compaction (:class:`~offpath.coordination.compactions.JobOptions`).
    ``result`` holds ``prepared`` (the summary and its plan, kept until applied:
    :class:`~offpath.compaction.patch.Prepared`), ``usage`` (what the summarizer
    cost) and ``record``, offpath's own record of the summary about to be patched in
    (written before the patch): the only source of what a compaction removed
    (DESIGN.md invariant 10).
    """

    __tablename__ = "compaction_jobs"

    job_id: str = Field(primary_key=True, max_length=64)
    session_id: str = Field(index=True, max_length=128)
    status: str = Field(default=JobStatus.QUEUED, index=True, max_length=16)
    reason: str | None = Field(default=None, max_length=2000)
    reason_code: str | None = Field(default=None, max_length=32)
    attempts: int = 0
    chars_before: int | None = None
    published: bool = True
    result: dict[str, Any] | None = Field(default=None, sa_column=Column("result", JSON))
    options: dict[str, Any] | None = Field(default=None, sa_column=Column("options", JSON))
    created_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))
    updated_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))
    #: When the thread was first seen over its threshold with this job open (None: never
    #: seen; the lag of an applied job then runs from ``created_at``). Migration 0007.
    crossed_at: datetime | None = Field(default=None, sa_type=sa.DateTime(timezone=True))
    #: The thread's size (chars) just before this job's compaction was applied: its peak
    #: since the previous one (the dashboard's size chart draws it). Migration 0010.
    chars_at_apply: int | None = None


class FallbackMasking(SQLModel, table=True):
    """One model call whose oldest tool results were masked because it would have gone over
    ``CONTEXT_HARD_LIMIT_CHARS`` with no summary ready (DESIGN.md invariant 9)."""

    __tablename__ = "fallback_maskings"

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(index=True, max_length=128)
    results: int
    chars: int
    created_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))


# --- engine and schema -----------------------------------------------------------------


def sqlalchemy_url(settings: Settings) -> str:
    """SQLAlchemy URL: ``DATABASE_URL`` (``postgresql://`` gets the psycopg 3 driver) or
    ``sqlite:///DATA_DIR/usage.db``."""
    url = settings.database_url.strip()
    if not url:
        path = Path(settings.data_dir) / "usage.db"
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(settings: Settings, *, ping_every_checkout: bool = False) -> Engine:
    """An engine for the usage tables; SQLite gets WAL and a busy timeout. PostgreSQL
    connections are pinged at checkout when idle over :data:`IDLE_PING_S` (the worker's
    jobs), or at every checkout with ``ping_every_checkout`` (SQLAlchemy's
    ``pool_pre_ping``: the API, whose reads must not answer 500 once after a database
    restart or a dropped connection)."""
    url = sqlalchemy_url(settings)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(conn: Any, _record: Any) -> None:
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    engine = create_engine(url, pool_size=5, max_overflow=10, pool_pre_ping=ping_every_checkout)
    if not ping_every_checkout:
        _ping_when_idle(engine)
    return engine


#: A pooled connection idle longer than this (s) is pinged before it is handed out.
IDLE_PING_S = 1.0


def _ping_when_idle(engine: Engine) -> None:
    """Ping a pooled connection at checkout only if it sat idle over :data:`IDLE_PING_S`
    (a database restart shows there): ``pool_pre_ping`` pings at every checkout, a round
    trip per statement group of a job. A connection that breaks while in use invalidates
    the pool (SQLAlchemy's disconnect handling), and the job retries."""

    @event.listens_for(engine, "checkin")
    def _stamp(_dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("idle_since")
        if since is None or time.monotonic() - since < IDLE_PING_S:
            return
        try:
            cur = dbapi_conn.cursor()
            cur.execute("SELECT 1")
            cur.close()
        except Exception as exc:
            raise sa.exc.DisconnectionError(str(exc)) from exc


def migrate(settings: Settings) -> str:
    """Bring the schema to the latest Alembic revision (safe to call from every process,
    also at once: ``stores/migrations/env.py`` runs one migrator at a time).

    Returns a line saying what it did. Raises the driver's error if the database
    cannot be reached.
    """
    from alembic import command
    from alembic.config import Config

    url = sqlalchemy_url(settings)
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).resolve().parent / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    command.upgrade(cfg, "head")
    # read under the migration lock by env.py: a migrator that waited sees the tables made
    before = cfg.attributes.get("revision_before")
    after = cfg.attributes.get("revision_after")
    if before == after:
        return f"usage tables are up to date (revision {after})"
    return f"usage tables {'created' if before is None else 'upgraded from ' + before} at revision {after}"


# --- jobs -----------------------------------------------------------------------------


JOBS = CompactionJob.__table__  # type: ignore[attr-defined]
EVENTS = UsageEvent.__table__  # type: ignore[attr-defined]


def _insert(engine: Engine, table: sa.Table) -> Any:
    """``INSERT`` that can skip a row whose key exists (PostgreSQL and SQLite)."""
    if engine.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(table)


def _async_commit(conn: Any, engine: Engine) -> None:
    """On PostgreSQL, let this transaction's commit skip the WAL flush: for rows whose loss to
    a database crash costs nothing (a queued or running mark the job rewrites anyway)."""
    if engine.dialect.name == "postgresql":
        conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")


def _ensure_job(
    conn: Any,
    engine: Engine,
    job_id: str,
    session_id: str,
    status: str,
    now: datetime,
    **values: Any,
) -> None:
    """Insert the job's row when the publisher could not write it (a row that exists wins)."""
    conn.execute(
        _insert(engine, JOBS)
        .values(
            job_id=job_id,
            session_id=session_id,
            status=status,
            attempts=1,
            created_at=now,
            updated_at=now,
            **values,
        )
        .on_conflict_do_nothing()
    )


def create_job(
    engine: Engine,
    job_id: str,
    session_id: str,
    chars_before: int | None,
    *,
    published: bool = True,
    reason: str | None = None,
    options: dict[str, Any] | None = None,
) -> None:
    """Insert a ``queued`` row for a job about to be published (one statement; no WAL flush
    on PostgreSQL: a lost queued row costs nothing, the job writes its own row).

    ``published=False`` records a job the broker could not take: the reconciler
    publishes it once the broker is back (issue 8, item 3).
    """
    now = _now()
    with engine.begin() as conn:
        _async_commit(conn, engine)
        conn.execute(
            sa.insert(JOBS).values(
                job_id=job_id,
                session_id=session_id,
                status=JobStatus.QUEUED.value,
                reason=_reason(reason),
                reason_code="not_published" if not published else None,
                attempts=0,
                chars_before=chars_before,
                published=published,
                options=options,
                created_at=now,
                updated_at=now,
            )
        )
    metrics.job_reached(JobStatus.QUEUED, "not_published" if not published else None)


def set_published(engine: Engine, job_id: str, published: bool, reason: str | None = None) -> None:
    """Record whether the broker took a queued job (and why not)."""
    with engine.begin() as conn:
        conn.execute(
            sa.update(JOBS)
            .where(JOBS.c.job_id == job_id)
            .values(
                published=published,
                reason=None if published else _reason(reason),
                reason_code=None if published else "not_published",
                updated_at=_now(),
            )
        )


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


def now_utc() -> datetime:
    return _now()


def _utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes: they are UTC."""
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


def start_job(
    engine: Engine, job_id: str, session_id: str
) -> tuple[JobStatus | None, dict[str, Any] | None]:
    """Mark the job ``running`` and count the attempt, unless it has finished already.

    Returns ``(status, None)`` for a job that is past running (finished, or prepared:
    a redelivery has nothing to do), else ``(None, stored result)``: the result a
    previous delivery recorded before it died, if any. Creates the row if the
    publisher could not.
    """
    with engine.begin() as conn:
        _async_commit(conn, engine)
        row = conn.execute(
            sa.update(JOBS)
            .where(JOBS.c.job_id == job_id, JOBS.c.status.in_(list(RUNNABLE_VALUES)))
            .values(
                status=JobStatus.RUNNING.value,
                attempts=JOBS.c.attempts + 1,
                published=True,
                updated_at=_now(),
            )
            .returning(JOBS.c.result)
        ).first()
        if row is not None:
            return None, row.result
        status = conn.execute(sa.select(JOBS.c.status).where(JOBS.c.job_id == job_id)).scalar()
        if status is not None:
            return JobStatus(status), None
        _ensure_job(conn, engine, job_id, session_id, JobStatus.RUNNING.value, _now())
        return None, None


def set_job(
    engine: Engine,
    job_id: str,
    session_id: str,
    status: JobStatus,
    reason: str | None = None,
    code: str | None = None,
    *,
    only_if_open: bool = False,
) -> bool:
    """Set a job's status, reason and reason code (creating the row if the publisher could
    not). ``only_if_open``: change a job that has not ended yet, else nothing (returns
    whether a row changed)."""
    now = _now()
    values = {"status": status.value, "reason": _reason(reason)}
    values.update(reason_code=code, updated_at=now)
    with engine.begin() as conn:
        q = sa.update(JOBS).where(JOBS.c.job_id == job_id)
        if only_if_open:
            q = q.where(JOBS.c.status.not_in(list(FINAL_VALUES)))
        if conn.execute(q.values(**values)).rowcount:
            metrics.job_reached(status, code)
            return True
        if only_if_open:
            return False
        _ensure_job(
            conn,
            engine,
            job_id,
            session_id,
            status.value,
            now,
            reason=values["reason"],
            reason_code=code,
        )
        metrics.job_reached(status, code)
        return True


def end_others(engine: Engine, session_id: str, job_id: str) -> int:
    """End the thread's other open jobs: called by a job that holds the thread's running lease,
    so they are dead (their lease lapsed), were never published, or hold a prepared
    compaction whose claim expired. Returns how many."""
    now = _now()
    why = f"job {job_id} took the thread over"
    runnable = JOBS.c.status.in_(list(RUNNABLE_VALUES))
    lapsed = runnable & JOBS.c.published.is_(True)
    code = sa.case((lapsed, "lease_lapsed"), else_="superseded")
    reason = sa.case(
        (lapsed, f"lease_lapsed: its worker was lost; {why}"),
        (runnable, f"superseded: never published; {why}"),
        else_=f"superseded: never applied; {why}",
    )
    # one statement: this runs at the start of every job
    q = (
        sa.update(JOBS)
        .where(
            JOBS.c.session_id == session_id,
            JOBS.c.job_id != job_id,
            runnable | (JOBS.c.status == JobStatus.PREPARED.value),
        )
        .values(
            status=sa.case((lapsed, JobStatus.FAILED.value), else_=JobStatus.SKIPPED.value),
            reason=reason,
            reason_code=code,
            updated_at=now,
        )
    )
    with engine.begin() as conn:
        ended = conn.execute(q.returning(JOBS.c.status, JOBS.c.reason_code)).all()
    for row in ended:
        metrics.job_reached(row.status, row.reason_code)
    return len(ended)


def store_result(
    engine: Engine, job_id: str, result: dict[str, Any], status: JobStatus | None = None
) -> None:
    """Write a job's ``result`` (see :class:`CompactionJob`): its prepared compaction, or its
    record of the summary it is about to patch in, before the patch; ``status`` with it."""
    values: dict[str, Any] = {"result": result, "updated_at": _now()}
    if status is not None:
        values["status"] = status.value
    with engine.begin() as conn:
        conn.execute(sa.update(JOBS).where(JOBS.c.job_id == job_id).values(**values))
    if status is not None:
        metrics.job_reached(status)


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
            last = last or _utc(row.updated_at)
    return count, last


def jobs_of(engine: Engine, session_id: str) -> list[dict[str, Any]]:
    """A session's jobs, oldest first (what an applied one removed is in its ``result``)."""
    q = sa.select(JOBS).where(JOBS.c.session_id == session_id).order_by(JOBS.c.created_at)
    with engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(q)]


# --- usage events ---------------------------------------------------------------------


def chars_saved(record: Mapping[str, Any]) -> int:
    """The real reduction of one applied compaction, from its record (chars): the thread's
    size before it less its size after (``chars_before`` - ``chars_after``: what it removed,
    less the summary it put in, plus what it cut from kept results). A summary that a later
    compaction folds again is removed by that one but was put in by this one: summed over a
    thread, the savings are what the thread produced less what it holds now, each char
    counted once (issue 21, item 6: ``chars_removed`` counted re-folded summaries again).
    A record without the sizes: ``chars_removed`` less ``summary_chars``, else
    ``chars_removed``."""
    before, after = record.get("chars_before"), record.get("chars_after")
    if before is not None and after is not None:
        return max(0, int(before) - int(after))
    removed = int(record.get("chars_removed") or 0)
    return max(0, removed - int(record.get("summary_chars") or 0))


def finalize(
    engine: Engine, job_id: str, session_id: str, stored: dict[str, Any] | None = None
) -> bool:
    """Record the compaction of ``job_id`` (its usage event, from the job's stored result, never
    from the summary message) and mark the job ``applied``, in one transaction. ``stored``:
    the result the caller wrote to the job's row in this job (saves reading it back).

    Returns False (and changes nothing) when it was recorded already (the unique key on
    ``usage_events.job_id`` decides, also between two concurrent deliveries). Raises
    ``LookupError`` when the job has no stored result.
    """
    with engine.begin() as conn:
        if stored is None:
            stored = conn.execute(sa.select(JOBS.c.result).where(JOBS.c.job_id == job_id)).scalar()
        if not stored or not stored.get("record"):
            raise LookupError(f"job {job_id} has no stored record of its summary")
        result = {**(stored.get("usage") or {}), **stored["record"]}
        values = {
            "job_id": job_id,
            "session_id": session_id,
            "model": str(result.get("model") or "unknown")[:200],
            "input_tokens": int(result.get("input_tokens") or 0),
            "output_tokens": int(result.get("output_tokens") or 0),
            "latency_ms": int(result.get("latency_ms") or 0),
            "tool_call_count": 0,
            "metadata": {
                "summarization": True,
                "messages_removed": int(result["messages_removed"]),
                "chars_removed": int(result["chars_removed"]),
                "chars_saved": chars_saved(result),
                "tool_calls_removed": int(result.get("tool_calls_removed") or 0),
                "summarizer": result.get("summarizer"),
            },
            "created_at": _now(),
        }
        inserted = conn.execute(
            _insert(engine, EVENTS).values(**values).on_conflict_do_nothing()
        ).rowcount
        if not inserted:
            return False
        applied_at = _now()
        times = conn.execute(
            sa.update(JOBS)
            .where(JOBS.c.job_id == job_id)
            .values(
                status=JobStatus.APPLIED.value,
                reason=None,
                reason_code=None,
                updated_at=applied_at,
                chars_at_apply=result.get("chars_before"),
            )
            .returning(JOBS.c.created_at, JOBS.c.crossed_at)
        ).first()
    since = _utc(times.crossed_at or times.created_at) if times is not None else None
    metrics.job_reached(JobStatus.APPLIED)
    lag_s = (applied_at - since).total_seconds() if since is not None else None
    metrics.compaction_applied(lag_s)
    return True


#: The reason code of a reverted job.
REVERTED_CODE = "reverted"


def mark_reverted(engine: Engine, job_id: str, reason: str) -> bool:
    """``applied`` -> ``reverted`` for job ``job_id`` (its originals are back in the thread),
    with ``reason``; False (nothing changed) if the job was not ``applied``. Its usage event
    stays: the summarizer ran and what it cost counts; ``/stats`` counts its chars as saved
    no longer (:func:`offpath.stores.usage.stats`)."""
    with engine.begin() as conn:
        changed = conn.execute(
            sa.update(JOBS)
            .where(JOBS.c.job_id == job_id, JOBS.c.status == JobStatus.APPLIED.value)
            .values(
                status=JobStatus.REVERTED.value,
                reason=reason[:2000],
                reason_code=REVERTED_CODE,
                updated_at=_now(),
            )
        ).rowcount
    if changed:
        metrics.job_reached(JobStatus.REVERTED, REVERTED_CODE)
    return bool(changed)


MASKINGS = FallbackMasking.__table__  # type: ignore[attr-defined]


def record_masking(engine: Engine, session_id: str, results: int, chars: int) -> None:
    """Count one fallback masking (``/stats`` ``fallback_maskings``)."""
    with engine.begin() as conn:
        conn.execute(
            sa.insert(MASKINGS).values(
                session_id=session_id, results=results, chars=chars, created_at=_now()
            )
        )


def ping(engine: Engine) -> None:
    """Raise if the database does not answer."""
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))


__all__ = [
    "FINAL",
    "FINAL_VALUES",
    "CompactionJob",
    "JobStatus",
    "SQLModel",
    "UsageEvent",
    "RUNNABLE_VALUES",
    "chars_saved",
    "create_job",
    "end_others",
    "failures_in_a_row",
    "finalize",
    "has_unpublished_job",
    "job_options",
    "job_row",
    "jobs_of",
    "mark_reverted",
    "now_utc",
    "open_jobs",
    "set_published",
    "start_job",
    "store_result",
    "threads_to_requeue",
    "make_engine",
    "migrate",
    "ping",
    "record_masking",
    "set_job",
    "sqlalchemy_url",
]
