"""The job's state machine on its ``compaction_jobs`` row: queued (:func:`create_job`,
:func:`set_published`), running (:func:`start_job`), ended (:func:`set_job`,
:func:`end_others`), prepared (:func:`store_result`), applied with its usage event
(:func:`finalize`) and reverted (:func:`mark_reverted`); a prepared job forced by an
operator (:func:`mark_forced`). Each status change is counted
in :mod:`offpath.metrics`.

The job's crossing: when its thread was first seen over its threshold
(``compaction_jobs.crossed_at``), where the compaction lag runs from; marked once per job
and process (:data:`_crossed`).
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from offpath import metrics
from offpath.compaction.tokens import stored_ratio
from offpath.stores.db.engine import insert_for
from offpath.stores.db.tables import (
    EVENTS,
    FINAL_VALUES,
    JOBS,
    RUNNABLE_VALUES,
    SETTLED_VALUES,
    JobStatus,
    as_utc,
    chars_saved,
    now_utc,
    stored_reason,
)
from offpath.stores.leases.claims import Claim, State
from offpath.stores.tenants import SESSIONS
from offpath.stores.values import REFUSED_ERRORS, refused_value


def async_commit(conn: Any, engine: Engine) -> None:
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
) -> bool:
    """Insert the job's row when the publisher could not write it (a row that exists wins);
    whether it was inserted."""
    return (
        conn.execute(
            insert_for(engine, JOBS)
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
        ).rowcount
        > 0
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
    publishes it once the broker is back.
    """
    now = now_utc()
    with engine.begin() as conn:
        async_commit(conn, engine)
        conn.execute(
            sa.insert(JOBS).values(
                job_id=job_id,
                session_id=session_id,
                status=JobStatus.QUEUED.value,
                reason=stored_reason(reason),
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
                reason=None if published else stored_reason(reason),
                reason_code=None if published else "not_published",
                updated_at=now_utc(),
            )
        )


#: A job's statements, each made once and its values bound at each call (``b_*``): making a
#: statement, and the key it is looked up by among the compiled ones, costs more of a job's CPU
#: than running it (~0.45 ms for :func:`start_job`'s).
_OTHER = JOBS.alias("other")
#: Whether thread ``b_session`` has an open job besides ``b_job`` (one :func:`end_others`
#: would end), as a scalar subquery.
_OTHERS_OPEN = (
    sa.select(_OTHER.c.job_id)
    .where(
        _OTHER.c.session_id == sa.bindparam("b_session"),
        _OTHER.c.job_id != sa.bindparam("b_job"),
        _OTHER.c.status.in_(sorted({*RUNNABLE_VALUES, JobStatus.PREPARED.value})),
    )
    .limit(1)
    .exists()
)
_START = (
    sa.update(JOBS)
    .where(JOBS.c.job_id == sa.bindparam("b_job"), JOBS.c.status.in_(sorted(RUNNABLE_VALUES)))
    .values(
        status=JobStatus.RUNNING.value,
        attempts=JOBS.c.attempts + 1,
        published=True,
        updated_at=sa.bindparam("b_now", type_=JOBS.c.updated_at.type),
    )
    .returning(JOBS.c.result, _OTHERS_OPEN.label("others"))
)


def start_job(
    engine: Engine, job_id: str, session_id: str
) -> tuple[JobStatus | None, dict[str, Any] | None, bool]:
    """Mark the job ``running`` and count the attempt, unless it has finished already.

    Returns ``(status, None, _)`` for a job that is past running (finished, or prepared:
    a redelivery has nothing to do), else ``(None, stored result, others)``: the result a
    previous delivery recorded before it died, if any, and whether the thread had another
    open job (one :func:`end_others` ends; True when not known). Creates the row if the
    publisher could not.
    """
    with engine.begin() as conn:
        async_commit(conn, engine)
        row = conn.execute(
            _START, {"b_job": job_id, "b_session": session_id, "b_now": now_utc()}
        ).first()
        if row is not None:
            return None, row.result, bool(row.others)
        status = conn.execute(sa.select(JOBS.c.status).where(JOBS.c.job_id == job_id)).scalar()
        if status is not None:
            return JobStatus(status), None, True
        _ensure_job(conn, engine, job_id, session_id, JobStatus.RUNNING.value, now_utc())
        return None, None, True


def uncount_attempt(engine: Engine, job_id: str) -> None:
    """Take back the attempt :func:`start_job` counted for a delivery that found another
    one running the job (a duplicate message): ``attempts`` counts the deliveries that ran
    the job."""
    with engine.begin() as conn:
        async_commit(conn, engine)
        conn.execute(
            sa.update(JOBS)
            .where(JOBS.c.job_id == job_id, JOBS.c.attempts > 0)
            .values(attempts=JOBS.c.attempts - 1)
        )


def set_job(
    engine: Engine,
    job_id: str,
    session_id: str,
    status: JobStatus,
    reason: str | None = None,
    code: str | None = None,
    *,
    only_if_open: bool = False,
    result: dict[str, Any] | None = None,
) -> bool:
    """Set a job's status, reason and reason code (creating the row if the publisher could
    not); returns whether a row changed. An ``applied`` or ``reverted`` job is never changed
    here: those say what happened to the thread, and a late ending (a duplicate delivery
    whose lease was lost after the other one applied) must not take that back.
    ``only_if_open``: change only a job that has not ended at all. ``result``: the job's
    result (see :func:`store_result`) written with it; one the database refuses (a NUL
    character the summary quoted) is left out, and the ending is written without it."""
    now = now_utc()
    values: dict[str, Any] = {"status": status.value, "reason": stored_reason(reason)}
    values.update(reason_code=code, updated_at=now)
    if result is not None:
        values["result"] = result
    kept = FINAL_VALUES if only_if_open else SETTLED_VALUES
    try:
        with engine.begin() as conn:
            q = sa.update(JOBS).where(JOBS.c.job_id == job_id, JOBS.c.status.not_in(list(kept)))
            changed = conn.execute(q.values(**values)).rowcount > 0
            if not changed and not only_if_open:
                changed = _ensure_job(
                    conn,
                    engine,
                    job_id,
                    session_id,
                    status.value,
                    now,
                    reason=values["reason"],
                    reason_code=code,
                    **({"result": result} if result is not None else {}),
                )
    except REFUSED_ERRORS:
        if result is None or refused_value([("result", result)]) is None:
            raise
        return set_job(engine, job_id, session_id, status, reason, code, only_if_open=only_if_open)
    if changed:
        metrics.job_reached(status, code)
    return changed


def end_others(engine: Engine, session_id: str, job_id: str) -> int:
    """End the thread's other open jobs: called by a job that holds the thread's running lease,
    so they are dead (their lease lapsed), were never published, or hold a prepared
    compaction whose claim expired. Returns how many."""
    now = now_utc()
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
    record of the summary it is about to patch in, before the patch; ``status`` with it.
    Raises :class:`~offpath.stores.values.Unstorable` naming a value the database refused
    (a NUL character the summary quoted from the thread, on PostgreSQL)."""
    values: dict[str, Any] = {"result": result, "updated_at": now_utc()}
    if status is not None:
        values["status"] = status.value
    try:
        with engine.begin() as conn:
            conn.execute(sa.update(JOBS).where(JOBS.c.job_id == job_id).values(**values))
    except REFUSED_ERRORS as exc:
        if (found := refused_value([("the prepared compaction", result)])) is None:
            raise
        raise found from exc
    if status is not None:
        metrics.job_reached(status)


#: :func:`finalize`'s statements, made once (see :data:`_START`); the usage event's insert
#: per dialect (:func:`_event_insert`).
_SESSION_SIZE = (
    sa.update(SESSIONS)
    .where(SESSIONS.c.session_id == sa.bindparam("b_session"))
    .values(
        messages=sa.bindparam("b_messages", type_=SESSIONS.c.messages.type),
        chars=sa.bindparam("b_chars", type_=SESSIONS.c.chars.type),
    )
)
_APPLIED = (
    sa.update(JOBS)
    .where(JOBS.c.job_id == sa.bindparam("b_job"))
    .values(
        status=JobStatus.APPLIED.value,
        reason=None,
        reason_code=None,
        updated_at=sa.bindparam("b_now", type_=JOBS.c.updated_at.type),
        chars_at_apply=sa.bindparam("b_chars", type_=JOBS.c.chars_at_apply.type),
    )
    .returning(JOBS.c.created_at, JOBS.c.crossed_at)
)
_EVENT_INSERTS: dict[str, Any] = {}


def _event_insert(engine: Engine) -> Any:
    """``INSERT`` of a usage event in ``engine``'s dialect that skips one whose job has one
    already (made once per dialect; its values given at each call)."""
    name = engine.dialect.name
    if (stmt := _EVENT_INSERTS.get(name)) is None:
        stmt = _EVENT_INSERTS[name] = insert_for(engine, EVENTS).on_conflict_do_nothing()
    return stmt


def finalize(
    engine: Engine,
    job_id: str,
    session_id: str,
    stored: dict[str, Any] | None = None,
    size: tuple[int, int] | None = None,
) -> bool:
    """Record the compaction of ``job_id`` (its usage event, from the job's stored result, never
    from the summary message) and mark the job ``applied``, in one transaction. ``stored``:
    the result the caller wrote to the job's row in this job (saves reading it back).
    ``size``: the thread's size once patched (messages, chars), written to its session's row
    (the session list's; a session with no owner row is left alone) in the same transaction.

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
                **tokens_saved(result),
                "tool_calls_removed": int(result.get("tool_calls_removed") or 0),
                "summarizer": result.get("summarizer"),
            },
            "created_at": now_utc(),
        }
        inserted = conn.execute(_event_insert(engine), values).rowcount
        if size is not None:
            conn.execute(
                _SESSION_SIZE, {"b_session": session_id, "b_messages": size[0], "b_chars": size[1]}
            )
        if not inserted:
            return False
        applied_at = now_utc()
        times = conn.execute(
            _APPLIED,
            {"b_job": job_id, "b_now": applied_at, "b_chars": result.get("chars_before")},
        ).first()
    since = as_utc(times.crossed_at or times.created_at) if times is not None else None
    metrics.job_reached(JobStatus.APPLIED)
    lag_s = (applied_at - since).total_seconds() if since is not None else None
    metrics.compaction_applied(lag_s)
    return True


def tokens_saved(result: dict[str, Any]) -> dict[str, Any]:
    """A compaction's tokens saved, for its usage event: its chars saved over its thread's
    chars per token as the job measured them (``chars_per_token``: counted with the thread's
    model's tokenizer, or reported by its provider; :mod:`offpath.compaction.tokens`), with
    that ratio; nothing when the job measured none (``/stats`` then counts chars / 4)."""
    ratio = stored_ratio(result.get("chars_per_token"))
    if ratio is None:
        return {}
    return {"tokens_saved": round(chars_saved(result) / ratio), "chars_per_token": ratio}


#: The reason code of a reverted job.
REVERTED_CODE = "reverted"


def mark_reverted(engine: Engine, job_id: str, reason: str) -> bool:
    """``applied`` -> ``reverted`` for job ``job_id`` (its originals are back in the thread),
    with ``reason`` (stored as every status change's: one line, capped); False (nothing changed) if the job was not ``applied``. Its usage event
    stays: the summarizer ran and what it cost counts; ``/stats`` counts its chars as saved
    no longer (:func:`offpath.stores.usage.stats`)."""
    with engine.begin() as conn:
        changed = conn.execute(
            sa.update(JOBS)
            .where(JOBS.c.job_id == job_id, JOBS.c.status == JobStatus.APPLIED.value)
            .values(
                status=JobStatus.REVERTED.value,
                reason=stored_reason(reason),
                reason_code=REVERTED_CODE,
                updated_at=now_utc(),
            )
        ).rowcount
    if changed:
        metrics.job_reached(JobStatus.REVERTED, REVERTED_CODE)
    return bool(changed)


def mark_forced(engine: Engine, job_id: str) -> bool:
    """Mark the prepared job ``job_id`` as asked for by an operator (its options' ``force``);
    False (nothing changed) if it is no longer prepared."""
    with engine.begin() as conn:
        options = conn.execute(
            sa.select(JOBS.c.options).where(
                JOBS.c.job_id == job_id, JOBS.c.status == JobStatus.PREPARED.value
            )
        ).first()
        if options is None:
            return False
        changed = conn.execute(
            sa.update(JOBS)
            .where(JOBS.c.job_id == job_id, JOBS.c.status == JobStatus.PREPARED.value)
            .values(options={**(options[0] or {}), "force": True})
        ).rowcount
    return bool(changed)


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
