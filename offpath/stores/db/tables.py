"""The usage tables (SQLModel): ``usage_events``, ``compaction_jobs`` and
``fallback_maskings``, the job's statuses (:class:`JobStatus`), and the time helpers
their rows use.

Each table class is defined here once (``SQLModel.metadata``, what Alembic's autogenerate
compares against); :data:`JOBS`, :data:`EVENTS` and :data:`MASKINGS` are their
SQLAlchemy tables, for the queries.

Beside them, a usage event's figure and a fallback masking's row: :func:`chars_saved` (the real reduction a
compaction's usage event records) and :func:`record_masking` (``fallback_maskings``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import JSON, Column
from sqlalchemy.engine import Engine
from sqlmodel import Field, SQLModel


class JobStatus(enum.StrEnum):
    """A job's life: ``queued`` -> ``running`` -> ``applied``, ``skipped`` or ``failed``;
    or ``running`` -> ``prepared`` (its compaction waits for the thread to be free and over
    its threshold) -> ``applied``, or ``skipped`` (stale). An applied compaction may be
    undone (``POST /sessions/{id}/compactions/{job}/revert``): ``applied`` -> ``reverted``."""

    QUEUED = "queued"
    RUNNING = "running"
    PREPARED = "prepared"
    APPLIED = "applied"
    SKIPPED = "skipped"
    FAILED = "failed"
    REVERTED = "reverted"


FINAL = (JobStatus.APPLIED, JobStatus.SKIPPED, JobStatus.FAILED, JobStatus.REVERTED)
FINAL_VALUES = frozenset(f.value for f in FINAL)
#: What happened to the thread (its compaction in force, or undone): no ending changes these.
SETTLED_VALUES = frozenset({JobStatus.APPLIED.value, JobStatus.REVERTED.value})
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


def stored_reason(reason: str | None) -> str | None:
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
    detail). ``published`` is false while the broker
    has not taken the job (the reconciler publishes it). ``options`` say how it may
    apply its compaction (:class:`~offpath.coordination.jobs.JobOptions`).
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


# each model's table (SQLModel sets ``__table__`` on a table model but does not declare it)
JOBS: sa.Table = CompactionJob.__table__  # type: ignore[attr-defined]
EVENTS: sa.Table = UsageEvent.__table__  # type: ignore[attr-defined]
MASKINGS: sa.Table = FallbackMasking.__table__  # type: ignore[attr-defined]


def now_utc() -> datetime:
    """The current time, timezone-aware UTC (what every row's timestamps hold)."""
    return _now()


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes: they are UTC."""
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


def chars_saved(record: Mapping[str, Any]) -> int:
    """The real reduction of one applied compaction, from its record (chars): the thread's
    size before it less its size after (``chars_before`` - ``chars_after``: what it removed,
    less the summary it put in, plus what it cut from kept results). A summary that a later
    compaction folds again is removed by that one but was put in by this one: summed over a
    thread, the savings are what the thread produced less what it holds now, each char
    counted once (``chars_removed`` counts re-folded summaries again).
    A record without the sizes: ``chars_removed`` less ``summary_chars``, else
    ``chars_removed``."""
    before, after = record.get("chars_before"), record.get("chars_after")
    if before is not None and after is not None:
        return max(0, int(before) - int(after))
    removed = int(record.get("chars_removed") or 0)
    return max(0, removed - int(record.get("summary_chars") or 0))


def record_masking(engine: Engine, session_id: str, results: int, chars: int) -> None:
    """Count one fallback masking (``/stats`` ``fallback_maskings``)."""
    with engine.begin() as conn:
        conn.execute(
            sa.insert(MASKINGS).values(
                session_id=session_id, results=results, chars=chars, created_at=now_utc()
            )
        )
