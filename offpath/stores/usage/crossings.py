"""Thread crossings: when a job's thread was first seen over its threshold
(``compaction_jobs.crossed_at``), where the compaction lag runs from; marked once per job
and process (:data:`_crossed`)."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from offpath.stores.db.tables import FINAL_VALUES, JOBS
from offpath.stores.db.transitions import async_commit
from offpath.stores.leases.claims import Claim, State

log = logging.getLogger("offpath.usage")


def mark_crossed(engine: Engine, job_id: str) -> bool:
    """Record that job ``job_id``'s thread was seen over its threshold now, unless it was
    seen so before or the job has ended; returns whether a row changed. The compaction lag
    (``offpath_compaction_lag_seconds``, ``/stats`` ``lag_ms``) runs from here to the patch."""
    with engine.begin() as conn:
        async_commit(conn, engine)
        return bool(
            conn.execute(
                sa.update(JOBS)
                .where(
                    JOBS.c.job_id == job_id,
                    JOBS.c.crossed_at.is_(None),
                    JOBS.c.status.not_in(list(FINAL_VALUES)),
                )
                .values(crossed_at=datetime.now(UTC))
            ).rowcount
        )


#: Jobs this process has marked crossed already (so a thread over its threshold costs one
#: UPDATE per job, not one per turn or model call).
_crossed: set[str] = set()
#: A failure to mark a crossing was logged as a warning already (later ones: DEBUG).
_failed_once = False
_crossed_guard = threading.Lock()


def crossing_unseen(claim: Claim | None) -> bool:
    """``claim`` holds an open job (queued, running, prepared) this process has not marked
    crossed yet."""
    if claim is None or claim.state not in (State.QUEUED, State.RUNNING, State.PREPARED):
        return False
    with _crossed_guard:
        return claim.job_id not in _crossed


def note_crossing(engine: Engine, claim: Claim | None) -> None:
    """The thread of ``claim`` is over its threshold now: mark its open job crossed (once per
    job and process; errors are logged, never raised: the caller is a turn or a run)."""
    if not crossing_unseen(claim):
        return
    assert claim is not None
    try:
        mark_crossed(engine, claim.job_id)
    except Exception as exc:  # the database is away: said once (its first line), then quiet
        global _failed_once
        level, _failed_once = (logging.DEBUG if _failed_once else logging.WARNING), True
        first = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0]
        log.log(level, "could not mark job %s crossed: %s", claim.job_id, first)
        return
    with _crossed_guard:
        if len(_crossed) > 10_000:
            _crossed.clear()
        _crossed.add(claim.job_id)
