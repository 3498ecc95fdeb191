"""Usage tables (SQLModel) and their queries: ``usage_events`` and ``compaction_jobs``.

SQLite under ``DATA_DIR`` by default, PostgreSQL when ``DATABASE_URL`` says so;
the schema is created by Alembic (``service/migrations/``, :func:`migrate`).

``usage_events`` has the seed's fields (session id, model, input and output
tokens, latency in ms, tool-call count, ``metadata`` JSON with
``summarization: true``, ``messages_removed``, ``chars_removed``) and a unique
``job_id``: a job delivered twice records one event (DESIGN.md invariant 4).
``compaction_jobs`` has one row per job and how it ended.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import JSON, Column, event, func
from sqlalchemy.engine import Engine
from sqlmodel import Field, Session, SQLModel, create_engine, select

from compaction.accounting import approx_tokens
from compaction.settings import Settings


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    APPLIED = "applied"
    SKIPPED = "skipped"
    FAILED = "failed"


FINAL = (JobStatus.APPLIED, JobStatus.SKIPPED, JobStatus.FAILED)
FINAL_VALUES = frozenset(f.value for f in FINAL)


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


class CompactionJob(SQLModel, table=True):
    """One queued compaction request and how it ended."""

    __tablename__ = "compaction_jobs"

    job_id: str = Field(primary_key=True, max_length=64)
    session_id: str = Field(index=True, max_length=128)
    status: str = Field(default=JobStatus.QUEUED, index=True, max_length=16)
    reason: str | None = Field(default=None, max_length=2000)
    attempts: int = 0
    chars_before: int | None = None
    created_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))
    updated_at: datetime = Field(default_factory=_now, sa_type=sa.DateTime(timezone=True))


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


def make_engine(settings: Settings) -> Engine:
    """An engine for the usage tables; SQLite gets WAL and a busy timeout."""
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
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)


def migrate(settings: Settings) -> str:
    """Bring the schema to the latest Alembic revision (safe to call from every process).

    Returns a line saying what it did. Raises the driver's error if the database
    cannot be reached.
    """
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext

    url = sqlalchemy_url(settings)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            before = MigrationContext.configure(conn).get_current_revision()
        cfg = Config()
        cfg.set_main_option("script_location", str(Path(__file__).resolve().parent / "migrations"))
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
        command.upgrade(cfg, "head")
        with engine.connect() as conn:
            after = MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
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


def _ensure_job(
    conn: Any,
    engine: Engine,
    job_id: str,
    session_id: str,
    status: str,
    now: datetime,
    reason: str | None = None,
) -> None:
    """Insert the job's row when the publisher could not write it (a row that exists wins)."""
    conn.execute(
        _insert(engine, JOBS)
        .values(
            job_id=job_id,
            session_id=session_id,
            status=status,
            reason=reason,
            attempts=1,
            created_at=now,
            updated_at=now,
        )
        .on_conflict_do_nothing()
    )


def create_job(engine: Engine, job_id: str, session_id: str, chars_before: int) -> None:
    """Insert a ``queued`` row for a job about to be published (one statement).

    On PostgreSQL the commit does not wait for the WAL flush: a queued row lost to a
    database crash costs nothing (the job writes its own row when it starts), and the
    post-turn hook saves a disk sync per turn.
    """
    now = _now()
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
        conn.execute(
            sa.insert(JOBS).values(
                job_id=job_id,
                session_id=session_id,
                status=JobStatus.QUEUED.value,
                attempts=0,
                chars_before=chars_before,
                created_at=now,
                updated_at=now,
            )
        )


def job_status(engine: Engine, job_id: str) -> tuple[str | None, datetime | None]:
    """A job's status and when it last changed (UTC), or (None, None) if it has no row."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(JOBS.c.status, JOBS.c.updated_at).where(JOBS.c.job_id == job_id)
        ).first()
    if row is None:
        return None, None
    updated = row.updated_at
    return row.status, updated.replace(tzinfo=UTC) if updated.tzinfo is None else updated


def now_utc() -> datetime:
    return _now()


def start_job(engine: Engine, job_id: str, session_id: str) -> JobStatus | None:
    """Mark the job ``running`` and count the attempt, unless it has finished already.

    Returns the final status of a job that finished before (a redelivery: nothing to
    do), else None. One round trip in the common case; creates the row if the
    publisher could not. Like the queued row, the running mark does not wait for a
    disk sync on PostgreSQL: losing it to a database crash only miscounts an attempt.
    """
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")
        row = conn.execute(
            sa.update(JOBS)
            .where(JOBS.c.job_id == job_id, JOBS.c.status.not_in([f.value for f in FINAL]))
            .values(status=JobStatus.RUNNING.value, attempts=JOBS.c.attempts + 1, updated_at=_now())
            .returning(JOBS.c.status)
        ).first()
        if row is not None:
            return None
        status = conn.execute(sa.select(JOBS.c.status).where(JOBS.c.job_id == job_id)).scalar()
        if status is not None:
            return JobStatus(status)
        now = _now()
        _ensure_job(conn, engine, job_id, session_id, JobStatus.RUNNING.value, now)
        return None


def set_job(
    engine: Engine, job_id: str, session_id: str, status: JobStatus, reason: str | None = None
) -> None:
    """Set a job's final status and reason (creating the row if the publisher could not)."""
    now = _now()
    reason = reason[:2000] if reason else None
    with engine.begin() as conn:
        updated = conn.execute(
            sa.update(JOBS)
            .where(JOBS.c.job_id == job_id)
            .values(status=status.value, reason=reason, updated_at=now)
        ).rowcount
        if not updated:
            _ensure_job(conn, engine, job_id, session_id, status.value, now, reason=reason)


def jobs_of(engine: Engine, session_id: str) -> list[dict[str, Any]]:
    """A session's jobs, oldest first, with what an applied one removed (from its usage event)."""
    q = (
        sa.select(JOBS, EVENTS.c.metadata)
        .select_from(JOBS.outerjoin(EVENTS, EVENTS.c.job_id == JOBS.c.job_id))
        .where(JOBS.c.session_id == session_id)
        .order_by(JOBS.c.created_at)
    )
    with engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(q)]


# --- usage events ---------------------------------------------------------------------


def record_compaction(engine: Engine, job_id: str, event_row: UsageEvent) -> bool:
    """Insert the usage event and mark the job ``applied``, in one transaction.

    Returns False (and changes nothing) when an event for ``job_id`` exists already
    (the unique key on ``job_id`` decides, also between two concurrent deliveries).
    """
    values = event_row.model_dump(exclude={"id", "metadata_"})
    values["metadata"] = event_row.metadata_
    now = _now()
    with engine.begin() as conn:
        inserted = conn.execute(
            _insert(engine, EVENTS).values(**values).on_conflict_do_nothing()
        ).rowcount
        if not inserted:
            return False
        updated = conn.execute(
            sa.update(JOBS)
            .where(JOBS.c.job_id == job_id)
            .values(status=JobStatus.APPLIED.value, reason=None, updated_at=now)
        ).rowcount
        if not updated:
            _ensure_job(conn, engine, job_id, event_row.session_id, JobStatus.APPLIED.value, now)
        return True


def stats(engine: Engine) -> dict[str, Any]:
    """The ``/stats`` body, computed in SQL: the seed's two fields and ours."""
    summ = UsageEvent.metadata_["summarization"].as_boolean()
    chars = UsageEvent.metadata_["chars_removed"].as_integer()
    with Session(engine) as s:
        count, total, sessions = s.exec(
            select(
                func.count(UsageEvent.id),
                func.coalesce(func.sum(chars), 0),
                func.count(sa.distinct(UsageEvent.session_id)),
            ).where(summ.is_(True))
        ).one()
        by_status = dict(
            s.exec(select(CompactionJob.status, func.count()).group_by(CompactionJob.status)).all()
        )
    return {
        "summary": {
            "total_summarizations": int(count),
            "total_chars_compacted": int(total),
            "sessions_compacted": int(sessions),
            "approx_tokens_saved": approx_tokens(int(total)),
            "jobs": {status.value: int(by_status.get(status.value, 0)) for status in JobStatus},
        }
    }


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
    "create_job",
    "job_status",
    "now_utc",
    "start_job",
    "jobs_of",
    "make_engine",
    "migrate",
    "ping",
    "record_compaction",
    "set_job",
    "sqlalchemy_url",
    "stats",
]
