"""Reading the usage tables for people: ``/stats`` (time windows, one session), the session
list, and forgetting a session's rows (issue 12).

Where each figure comes from (the cheapest source that is right):

* a session's owner, last activity, messages and chars: the ``sessions`` table
  (:class:`~offpath.stores.tenants.SessionOwner`), written by every write offpath makes
  to one of its own threads (a turn, a chat run, a compaction patch), so listing and
  sorting never read a checkpoint;
* compactions and jobs: ``compaction_jobs`` (one row per job, indexed by session);
* what was saved, and what the summarizer cost: ``usage_events`` (one per applied
  compaction, with the tokens the LLM reported);
* fallback maskings: ``fallback_maskings``.

Threads of a team's own agent (the middleware in their process) have a row in ``sessions``
of kind ``own agent``, written by the middleware (issue 21, item 1): they are listed, and
counted in ``/stats``, for the tenant it names, like the API's.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from offpath.compaction.accounting import approx_tokens
from offpath.stores.db import (
    EVENTS,
    FINAL_VALUES,
    JOBS,
    MASKINGS,
    JobStatus,
    _async_commit,
    _utc,
)
from offpath.stores.leases import Claim, State
from offpath.stores.tenants import SESSIONS

log = logging.getLogger("offpath.usage")

#: At most this many recent values enter a percentile (lag, latency) of ``/stats``.
PERCENTILE_SAMPLE = 10_000
#: How many recent failed jobs ``/stats`` lists.
RECENT_FAILURES = 10
#: Sort keys of the session list (``-`` before one: descending).
SORTS = ("last_activity", "chars", "compactions", "session_id")
IN_FLIGHT = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)


class BadCursor(ValueError):
    """A cursor this API did not give, or given with another sort order."""


# --- thread crossings (compaction lag) ---------------------------------------------------------


def mark_crossed(engine: Engine, job_id: str) -> bool:
    """Record that job ``job_id``'s thread was seen over its threshold now, unless it was
    seen so before or the job has ended; returns whether a row changed. The compaction lag
    (``offpath_compaction_lag_seconds``, ``/stats`` ``lag_ms``) runs from here to the patch."""
    with engine.begin() as conn:
        _async_commit(conn, engine)
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
    except Exception as exc:
        log.warning("could not mark job %s crossed: %s", claim.job_id, exc)
        return
    with _crossed_guard:
        if len(_crossed) > 10_000:
            _crossed.clear()
        _crossed.add(claim.job_id)


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
        return {str(status): int(n) for status, n in conn.execute(q)}


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
    ``chars_saved`` (their real reduction) and ``fallback_maskings``."""
    summ = EVENTS.c.metadata["summarization"].as_boolean()
    with engine.connect() as conn:
        compactions, saved = conn.execute(
            sa.select(
                sa.func.count(EVENTS.c.id), sa.func.coalesce(sa.func.sum(saved_chars_expr()), 0)
            ).where(summ.is_(True))
        ).one()
        maskings = conn.execute(sa.select(sa.func.count(MASKINGS.c.id))).scalar()
    return {
        "compactions": int(compactions),
        "chars_saved": int(saved),
        "fallback_maskings": int(maskings or 0),
    }


# --- /stats ----------------------------------------------------------------------------------


def percentiles(values: Sequence[float], *qs: float) -> list[float | None]:
    """Nearest-rank percentiles (``qs`` in 0..100) of ``values``; None for none."""
    ordered = sorted(values)
    if not ordered:
        return [None for _ in qs]
    n = len(ordered)
    return [ordered[min(n - 1, max(0, int(-(-q * n // 100)) - 1))] for q in qs]


def summarizer_latency_p90_s(engine: Engine, sample: int = 200) -> float | None:
    """The p90 of the summarizer's latency over the deployment's latest ``sample``
    compactions, in seconds (None: none yet): how early the middleware starts a job so that
    its summary is ready when the thread crosses its threshold (issue 18, item 4)."""
    with engine.connect() as conn:
        values = [
            float(v)
            for (v,) in conn.execute(
                sa.select(EVENTS.c.latency_ms).order_by(EVENTS.c.id.desc()).limit(sample)
            )
            if v is not None
        ]
    (p90,) = percentiles(values, 90)
    return None if p90 is None else p90 / 1000


def _spread(values: Sequence[float]) -> dict[str, Any]:
    p50, p99 = percentiles(values, 50, 99)
    return {"count": len(values), "p50": p50, "p99": p99}


def stats(
    engine: Engine,
    tenant: str | None = None,
    since: datetime | None = None,
    session_id: str | None = None,
) -> dict[str, Any]:
    """The ``/stats`` body: the seed's fields and ours, computed in SQL.

    ``tenant``: only the sessions it owns (None: all). ``since``: only what happened from
    then on (usage events and maskings by their time, jobs by when they were queued, lags by
    when the compaction was applied). ``session_id``: one session's figures.

    ``summary`` holds ``total_summarizations``, ``total_chars_compacted`` (the real
    reduction: each compaction's thread size before less its size after, so a summary
    folded into the next one is not counted as saved again; issue 21, item 6),
    ``sessions_compacted``, ``approx_tokens_saved`` (chars / 4), ``jobs`` (count by status),
    (a reverted compaction counts in ``total_summarizations``, in the summarizer's latency
    and tokens, and in ``jobs.reverted``, but not in the chars, tokens saved or sessions
    compacted: what it removed is back; issue 19)
    ``fallback_maskings``, and: ``jobs_by_reason`` (skipped and failed jobs by reason code),
    ``lag_ms`` and ``summarizer_latency_ms`` (``count``, ``p50``, ``p99`` in ms, over the
    latest :data:`PERCENTILE_SAMPLE`), ``llm_tokens`` (``input``, ``output``: what the
    summarizer's LLM reported, over ``events`` compactions that reported any; the prompt
    holds the removed messages, so ``input`` is the real-token counterpart of the chars
    estimate), ``recent_failures`` (the latest failed jobs) and ``since`` (ISO, or None).
    """
    from offpath.stores.tenants import SessionOwner

    def scoped(query: Any, column: Any, at: Any) -> Any:
        if tenant is not None:
            mine = sa.select(SessionOwner.session_id).where(SessionOwner.tenant == tenant)
            query = query.where(column.in_(mine))
        if session_id is not None:
            query = query.where(column == session_id)
        if since is not None:
            query = query.where(at >= since)
        return query

    summ = EVENTS.c.metadata["summarization"].as_boolean()
    chars = saved_chars_expr()
    # a reverted compaction ran (its usage event stays) but removes nothing now (issue 19)
    reverted = sa.select(JOBS.c.job_id).where(JOBS.c.status == JobStatus.REVERTED.value)
    in_effect = sa.or_(EVENTS.c.job_id.is_(None), EVENTS.c.job_id.not_in(reverted))
    events = lambda q: scoped(q, EVENTS.c.session_id, EVENTS.c.created_at)  # noqa: E731
    jobs = lambda q: scoped(q, JOBS.c.session_id, JOBS.c.created_at)  # noqa: E731
    with engine.connect() as conn:
        count, total, sessions, tokens_in, tokens_out, reported = conn.execute(
            events(
                sa.select(
                    sa.func.count(EVENTS.c.id),
                    sa.func.coalesce(sa.func.sum(sa.case((in_effect, chars), else_=0)), 0),
                    sa.func.count(sa.distinct(sa.case((in_effect, EVENTS.c.session_id)))),
                    sa.func.coalesce(sa.func.sum(EVENTS.c.input_tokens), 0),
                    sa.func.coalesce(sa.func.sum(EVENTS.c.output_tokens), 0),
                    sa.func.count(EVENTS.c.id).filter(
                        (EVENTS.c.input_tokens > 0) | (EVENTS.c.output_tokens > 0)
                    ),
                ).where(summ.is_(True))
            )
        ).one()
        latencies = [
            float(v)
            for (v,) in conn.execute(
                events(
                    sa.select(EVENTS.c.latency_ms)
                    .where(summ.is_(True))
                    .order_by(EVENTS.c.id.desc())
                    .limit(PERCENTILE_SAMPLE)
                )
            )
        ]
        by_status: dict[str, int] = {}
        by_reason: dict[str, dict[str, int]] = {"skipped": {}, "failed": {}}
        for status, code, n in conn.execute(
            jobs(
                sa.select(JOBS.c.status, JOBS.c.reason_code, sa.func.count()).group_by(
                    JOBS.c.status, JOBS.c.reason_code
                )
            )
        ):
            by_status[status] = by_status.get(status, 0) + int(n)
            if status in by_reason:
                key = code or "unknown"
                by_reason[status][key] = by_reason[status].get(key, 0) + int(n)
        lags = [
            max(0.0, (_utc(done) - _utc(crossed or created)).total_seconds() * 1000)  # type: ignore[operator]
            for created, crossed, done in conn.execute(
                scoped(
                    sa.select(JOBS.c.created_at, JOBS.c.crossed_at, JOBS.c.updated_at)
                    .where(JOBS.c.status == JobStatus.APPLIED.value)
                    .order_by(JOBS.c.updated_at.desc())
                    .limit(PERCENTILE_SAMPLE),
                    JOBS.c.session_id,
                    JOBS.c.updated_at,
                )
            )
        ]
        failures = [
            {
                "session_id": r.session_id,
                "job_id": r.job_id,
                "reason_code": r.reason_code,
                "reason": r.reason,
                "at": _iso(r.updated_at),
            }
            for r in conn.execute(
                scoped(
                    sa.select(
                        JOBS.c.session_id,
                        JOBS.c.job_id,
                        JOBS.c.reason_code,
                        JOBS.c.reason,
                        JOBS.c.updated_at,
                    )
                    .where(JOBS.c.status == JobStatus.FAILED.value)
                    .order_by(JOBS.c.updated_at.desc())
                    .limit(RECENT_FAILURES),
                    JOBS.c.session_id,
                    JOBS.c.updated_at,
                )
            )
        ]
        maskings = conn.execute(
            scoped(
                sa.select(sa.func.count(MASKINGS.c.id)),
                MASKINGS.c.session_id,
                MASKINGS.c.created_at,
            )
        ).scalar()
    return {
        "summary": {
            "total_summarizations": int(count),
            "total_chars_compacted": int(total),
            "sessions_compacted": int(sessions),
            "approx_tokens_saved": approx_tokens(int(total)),
            "jobs": {s.value: int(by_status.get(s.value, 0)) for s in JobStatus},
            "fallback_maskings": int(maskings or 0),
            "jobs_by_reason": by_reason,
            "lag_ms": _spread(lags),
            "summarizer_latency_ms": _spread(latencies),
            "llm_tokens": {
                "input": int(tokens_in),
                "output": int(tokens_out),
                "events": int(reported),
            },
            "recent_failures": failures,
            "since": since.isoformat() if since is not None else None,
        }
    }


def _iso(value: datetime | None) -> str | None:
    value = _utc(value)
    return value.isoformat() if value is not None else None


# --- the session list ------------------------------------------------------------------------


def _encode_cursor(sort: str, value: Any, session_id: str) -> str:
    if isinstance(value, datetime):
        value = {"t": _utc(value).isoformat()}  # type: ignore[union-attr]
    raw = json.dumps([sort, value, session_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str, sort: str) -> tuple[Any, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        got_sort, value, session_id = json.loads(raw)
        if isinstance(value, dict):
            value = datetime.fromisoformat(value["t"])
    except (binascii.Error, ValueError, TypeError, KeyError, UnicodeDecodeError):
        raise BadCursor(
            "cursor: not a cursor this API gave (pass next_cursor as it came)"
        ) from None
    if got_sort != sort:
        raise BadCursor(f"cursor: it belongs to another sort order than {sort!r}")
    field = sort.removeprefix("-")
    expected = {"last_activity": datetime, "chars": int, "compactions": int}.get(field, str)
    if not isinstance(session_id, str) or not isinstance(value, expected):
        raise BadCursor("cursor: not a cursor this API gave (pass next_cursor as it came)")
    if "\x00" in session_id or (isinstance(value, str) and "\x00" in value):
        # no session id holds one, and PostgreSQL refuses it in a query (issue 20, item 4)
        raise BadCursor("cursor: not a cursor this API gave (pass next_cursor as it came)")
    if isinstance(value, int) and not -(2**62) < value < 2**62:
        raise BadCursor("cursor: not a cursor this API gave (pass next_cursor as it came)")
    return value, session_id


def list_sessions(
    engine: Engine,
    tenant: str | None,
    *,
    q: str = "",
    sort: str = "-last_activity",
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of sessions and the cursor of the next one (None: last page).

    ``tenant``: only its sessions (None: every tenant's, for an admin key). ``q``: a
    substring of the session id. ``sort``: one of :data:`SORTS`, ``-`` first for
    descending; ties are broken by session id. Keyset pagination: a page does not shift
    when sessions are added meanwhile. Each session: ``session_id``, ``tenant``, ``kind``
    (``api`` or ``own agent``), ``messages`` and ``chars`` (the thread now; None for a thread offpath has not written
    since migration 0007), ``compactions`` (applied), ``last_activity`` (the last turn,
    ISO), ``jobs_in_flight`` (queued or running). Raises :class:`BadCursor`, and
    ``ValueError`` for an unknown sort.
    """
    field = sort.removeprefix("-")
    if field not in SORTS:
        raise ValueError(f"sort: one of {', '.join(SORTS)}, with - first for descending")
    desc = sort.startswith("-")
    per_session = (
        sa.select(
            JOBS.c.session_id,
            sa.func.count().filter(JOBS.c.status == JobStatus.APPLIED.value).label("compactions"),
            sa.func.count().filter(JOBS.c.status.in_(IN_FLIGHT)).label("in_flight"),
        )
        .group_by(JOBS.c.session_id)
        .subquery()
    )
    base = sa.select(
        SESSIONS.c.session_id,
        SESSIONS.c.tenant,
        SESSIONS.c.kind,
        SESSIONS.c.messages,
        SESSIONS.c.chars,
        SESSIONS.c.last_activity,
        sa.func.coalesce(per_session.c.compactions, 0).label("compactions"),
        sa.func.coalesce(per_session.c.in_flight, 0).label("jobs_in_flight"),
    ).select_from(
        SESSIONS.outerjoin(per_session, per_session.c.session_id == SESSIONS.c.session_id)
    )
    if tenant is not None:
        base = base.where(SESSIONS.c.tenant == tenant)
    if q:
        escaped = q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        base = base.where(SESSIONS.c.session_id.like(f"%{escaped}%", escape="\\"))
    rows = base.subquery()
    key = sa.func.coalesce(rows.c.chars, -1) if field == "chars" else rows.c[field]
    sid = rows.c.session_id
    query = sa.select(rows)
    if cursor:
        value, after = _decode_cursor(cursor, sort)
        if field == "session_id":
            query = query.where(sid < after if desc else sid > after)
        elif desc:
            query = query.where((key < value) | ((key == value) & (sid < after)))
        else:
            query = query.where((key > value) | ((key == value) & (sid > after)))
    order = [key.desc(), sid.desc()] if desc else [key.asc(), sid.asc()]
    if field == "session_id":
        order = order[1:]
    with engine.connect() as conn:
        found = list(conn.execute(query.order_by(*order).limit(limit + 1)))
    page = [
        {
            "session_id": r.session_id,
            "tenant": r.tenant,
            "kind": r.kind or "api",
            "messages": r.messages,
            "chars": r.chars,
            "compactions": int(r.compactions),
            "last_activity": _iso(r.last_activity),
            "jobs_in_flight": int(r.jobs_in_flight),
        }
        for r in found[:limit]
    ]
    next_cursor = None
    if len(found) > limit:
        last = found[limit - 1]
        value = last.chars if field == "chars" else getattr(last, field)
        if field == "chars" and value is None:
            value = -1
        next_cursor = _encode_cursor(sort, value, last.session_id)
    return page, next_cursor


def forget_rows(engine: Engine, session_id: str) -> dict[str, int]:
    """Delete a session's job rows, usage events, fallback maskings and its ``sessions`` row, in
    one transaction (its archive: :func:`offpath.stores.archive.forget`). Returns how many
    rows of each went."""
    with engine.begin() as conn:
        return {
            "jobs": conn.execute(sa.delete(JOBS).where(JOBS.c.session_id == session_id)).rowcount,
            "usage_events": conn.execute(
                sa.delete(EVENTS).where(EVENTS.c.session_id == session_id)
            ).rowcount,
            "fallback_maskings": conn.execute(
                sa.delete(MASKINGS).where(MASKINGS.c.session_id == session_id)
            ).rowcount,
            "sessions": conn.execute(
                sa.delete(SESSIONS).where(SESSIONS.c.session_id == session_id)
            ).rowcount,
        }


def has_rows(engine: Engine, session_id: str) -> bool:
    """offpath knows the session: it has an owner row or job rows."""
    with engine.connect() as conn:
        for table in (SESSIONS, JOBS):
            q = sa.select(table.c.session_id).where(table.c.session_id == session_id).limit(1)
            if conn.execute(q).first() is not None:
                return True
    return False


SortOrder = Literal[
    "last_activity",
    "-last_activity",
    "chars",
    "-chars",
    "compactions",
    "-compactions",
    "session_id",
    "-session_id",
]
