"""A thread's compaction progress as :class:`~offpath.events.CompactionUpdate` s, read from its
job rows: what ``GET /sessions/{id}/events`` streams.

The job rows are the one record every producer writes (the API's post-turn hook, compact
now, the worker, the middleware in a team's own agent, the reconciler), on every lock
backend, so the stream needs no second channel and a client that reconnects is told where
the thread stands. A job's status maps to the Agent Client Protocol's ``compaction_update``
statuses:

=================================  ==============  =============================================
job status                         update status   sizes, reason
=================================  ==============  =============================================
``queued``, ``running``,           ``in_progress``  ``chars_before``: the thread when queued
``prepared``
``applied``                        ``completed``   ``chars_before``, ``chars_after``: its record's
``failed``                         ``failed``      ``reason``
``skipped``                        ``cancelled``   ``reason`` (stale, nothing worth compacting...)
``reverted``                       (none)          an undo, not a step of a compaction
=================================  ==============  =============================================
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from offpath.events import CompactionUpdate, Status
from offpath.stores.db.tables import JOBS, JobStatus, as_utc

#: A job status -> the update status it is reported as (absent: not reported).
STATUS: dict[str, Status] = {
    JobStatus.QUEUED.value: "in_progress",
    JobStatus.RUNNING.value: "in_progress",
    JobStatus.PREPARED.value: "in_progress",
    JobStatus.APPLIED.value: "completed",
    JobStatus.FAILED.value: "failed",
    JobStatus.SKIPPED.value: "cancelled",
}


@dataclass(frozen=True, slots=True)
class Changed:
    """A job's update as its row says now, and when the row last changed."""

    update: CompactionUpdate
    at: datetime


def job_updates(engine: Engine, session_id: str, since: datetime | None = None) -> list[Changed]:
    """The updates of ``session_id``'s jobs whose row changed at or after ``since`` (None:
    all), in the order they changed. One indexed query; reads of the stored result only the
    record's two sizes."""
    return updates_of(engine, [session_id], since).get(session_id, [])


def updates_of(
    engine: Engine, session_ids: Collection[str], since: datetime | None = None
) -> dict[str, list[Changed]]:
    """:func:`job_updates` of several threads in one query (the API's one poller for every
    open event stream): ``{session_id: [Changed, ...]}``, threads with none left out."""
    if not session_ids:
        return {}
    record = JOBS.c.result
    q = (
        sa.select(
            JOBS.c.session_id,
            JOBS.c.job_id,
            JOBS.c.status,
            JOBS.c.chars_before,
            JOBS.c.reason,
            JOBS.c.updated_at,
            record[("record", "chars_before")].as_integer().label("record_before"),
            record[("record", "chars_after")].as_integer().label("record_after"),
        )
        .where(JOBS.c.session_id.in_(list(session_ids)))
        .order_by(JOBS.c.updated_at, JOBS.c.created_at)
    )
    if since is not None:
        q = q.where(JOBS.c.updated_at >= since)
    out: dict[str, list[Changed]] = {}
    with engine.connect() as conn:
        for r in conn.execute(q):
            status = STATUS.get(r.status)
            if status is None:
                continue
            done = status == "completed"
            update = CompactionUpdate(
                r.session_id,
                r.job_id,
                status,
                chars_before=r.record_before if done and r.record_before else r.chars_before,
                chars_after=r.record_after if done else None,
                reason=r.reason if status in ("failed", "cancelled") else None,
            )
            changed = Changed(update, as_utc(r.updated_at))  # type: ignore[arg-type]
            out.setdefault(r.session_id, []).append(changed)
    return out
