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

from compaction.accounting import CHARS_PER_TOKEN
from compaction.settings import Settings


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    APPLIED = "applied"
    SKIPPED = "skipped"
    FAILED = "failed"


FINAL = (JobStatus.APPLIED, JobStatus.SKIPPED, JobStatus.FAILED)


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


def migrate(settings: Settings) -> None:
    """Bring the schema to the latest Alembic revision (safe to call from every process)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).resolve().parent / "migrations"))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(settings).replace("%", "%%"))
    command.upgrade(cfg, "head")


# --- jobs -----------------------------------------------------------------------------


def create_job(engine: Engine, job_id: str, session_id: str, chars_before: int) -> None:
    """Insert a ``queued`` row for a job about to be published."""
    with Session(engine) as s:
        s.add(CompactionJob(job_id=job_id, session_id=session_id, chars_before=chars_before))
        s.commit()


def get_job(engine: Engine, job_id: str) -> CompactionJob | None:
    with Session(engine) as s:
        return s.get(CompactionJob, job_id)


def set_job(
    engine: Engine,
    job_id: str,
    session_id: str,
    status: JobStatus,
    reason: str | None = None,
    *,
    attempt: bool = False,
) -> None:
    """Set a job's status (creating the row if the publisher could not)."""
    with Session(engine) as s:
        job = s.get(CompactionJob, job_id) or CompactionJob(job_id=job_id, session_id=session_id)
        job.status = status
        job.reason = reason[:2000] if reason else None
        job.attempts += 1 if attempt else 0
        job.updated_at = _now()
        s.add(job)
        s.commit()


def jobs_of(engine: Engine, session_id: str) -> list[CompactionJob]:
    with Session(engine) as s:
        rows = s.exec(
            select(CompactionJob)
            .where(CompactionJob.session_id == session_id)
            .order_by(CompactionJob.created_at)
        )
        return list(rows)


# --- usage events ---------------------------------------------------------------------


def record_compaction(engine: Engine, job_id: str, event_row: UsageEvent) -> bool:
    """Insert the usage event and mark the job ``applied``, in one transaction.

    Returns False (and changes nothing) when an event for ``job_id`` exists already.
    """
    with Session(engine) as s:
        exists = s.exec(select(UsageEvent.id).where(UsageEvent.job_id == job_id)).first()
        if exists is not None:
            return False
        s.add(event_row)
        job = s.get(CompactionJob, job_id) or CompactionJob(
            job_id=job_id, session_id=event_row.session_id
        )
        job.status = JobStatus.APPLIED
        job.reason = None
        job.updated_at = _now()
        s.add(job)
        try:
            s.commit()
        except sa.exc.IntegrityError:  # a concurrent delivery won the race on the unique job id
            s.rollback()
            return False
        return True


def usage_events_of(engine: Engine, session_id: str | None = None) -> list[UsageEvent]:
    with Session(engine) as s:
        q = select(UsageEvent).order_by(UsageEvent.id)
        if session_id is not None:
            q = q.where(UsageEvent.session_id == session_id)
        return list(s.exec(q))


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
            "approx_tokens_saved": int(total) // CHARS_PER_TOKEN,
            "jobs": {status.value: int(by_status.get(status.value, 0)) for status in JobStatus},
        }
    }


def ping(engine: Engine) -> None:
    """Raise if the database does not answer."""
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))


__all__ = [
    "FINAL",
    "CompactionJob",
    "JobStatus",
    "SQLModel",
    "UsageEvent",
    "create_job",
    "get_job",
    "jobs_of",
    "make_engine",
    "migrate",
    "ping",
    "record_compaction",
    "set_job",
    "sqlalchemy_url",
    "stats",
    "usage_events_of",
]
