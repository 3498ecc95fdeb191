"""Usage tables (SQLModel) and their queries: ``usage_events`` and ``compaction_jobs``.

SQLite under ``DATA_DIR`` by default, PostgreSQL when ``DATABASE_URL`` says so;
the schema is created by Alembic (``stores/migrations/``, :func:`migrate`).

``usage_events`` has the seed's fields (session id, model, input and output
tokens, latency in ms, tool-call count, ``metadata`` JSON with
``summarization: true``, ``messages_removed``, ``chars_removed``; ours: ``chars_saved``,
the real reduction, :func:`chars_saved`) and a unique
``job_id``: a job delivered twice records one event (DESIGN.md invariant 4).
``compaction_jobs`` has one row per job and how it ended.

The package: :mod:`.engine` (the engine, :func:`migrate`), :mod:`.tables` (the SQLModel
tables, :class:`JobStatus`), :mod:`.transitions` (the job's state machine: queue, start,
end, apply, revert), :mod:`.job_queries` (reading job rows) and :mod:`.usage_events`
(:func:`chars_saved`, fallback maskings).
"""

from __future__ import annotations

from sqlmodel import SQLModel

from offpath.stores.db.engine import IDLE_PING_S as IDLE_PING_S
from offpath.stores.db.engine import make_engine, migrate, ping, sqlalchemy_url
from offpath.stores.db.job_queries import REQUEUE_CODES as REQUEUE_CODES
from offpath.stores.db.job_queries import (
    failures_in_a_row,
    has_unpublished_job,
    job_options,
    job_row,
    jobs_of,
    open_jobs,
    pending_losses,
    threads_to_requeue,
)
from offpath.stores.db.tables import EVENTS as EVENTS
from offpath.stores.db.tables import (
    FINAL,
    FINAL_VALUES,
    RUNNABLE_VALUES,
    CompactionJob,
    JobStatus,
    UsageEvent,
    now_utc,
)
from offpath.stores.db.tables import JOBS as JOBS
from offpath.stores.db.tables import MASKINGS as MASKINGS
from offpath.stores.db.tables import MAX_REASON_CHARS as MAX_REASON_CHARS
from offpath.stores.db.tables import FallbackMasking as FallbackMasking
from offpath.stores.db.tables import _utc as _utc
from offpath.stores.db.transitions import REVERTED_CODE as REVERTED_CODE
from offpath.stores.db.transitions import _async_commit as _async_commit
from offpath.stores.db.transitions import (
    create_job,
    end_others,
    finalize,
    mark_forced,
    mark_reverted,
    set_job,
    set_published,
    start_job,
    store_result,
)
from offpath.stores.db.usage_events import chars_saved, record_masking

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
    "mark_forced",
    "mark_reverted",
    "now_utc",
    "open_jobs",
    "pending_losses",
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
