"""The ``/stats`` body (:func:`stats`): compactions, savings, jobs by status and reason, lags,
the summarizer's latency and tokens, recent failures and maskings, for a tenant, a time
window or one session, computed in SQL."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from offpath.compaction.accounting import approx_tokens
from offpath.stores.db.tables import EVENTS, JOBS, MASKINGS, JobStatus, as_utc
from offpath.stores.usage.totals import bought_counts, percentiles, saved_chars_expr

#: At most this many recent values enter a percentile (lag, latency) of ``/stats``.
PERCENTILE_SAMPLE = 10_000
#: How many recent failed jobs ``/stats`` lists.
RECENT_FAILURES = 10


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
    folded into the next one is not counted as saved again),
    ``sessions_compacted``, ``approx_tokens_saved`` (chars / 4), ``total_tokens_compacted``
    (the same reduction in tokens as each thread's model counts them: its chars saved over
    that thread's chars per token, chars / 4 for a compaction whose thread had no measure)
    and ``tokens_counted_compactions`` (how many were counted so), ``jobs`` (count by status),
    (a reverted compaction counts in ``total_summarizations``, in the summarizer's latency
    and tokens, and in ``jobs.reverted``, but not in the chars, tokens saved or sessions
    compacted: what it removed is back)
    ``fallback_maskings``, and: ``jobs_by_reason`` (skipped and failed jobs by reason code),
    ``lag_ms`` and ``summarizer_latency_ms`` (``count``, ``p50``, ``p99`` in ms, over the
    latest :data:`PERCENTILE_SAMPLE`), ``llm_tokens`` (``input``, ``output``: what the
    summarizer's LLM reported, over ``events`` compactions that reported any; the prompt
    holds the removed messages, so ``input`` is the real-token counterpart of the chars
    estimate), ``recent_failures`` (the latest failed jobs), ``summaries_not_applied`` (the
    summaries paid for and never applied: :func:`_not_applied`) and ``since`` (ISO, or None).
    """
    from offpath.stores.tenants import SESSIONS

    def scoped(query: Any, column: Any, at: Any) -> Any:
        if tenant is not None:
            mine = sa.select(SESSIONS.c.session_id).where(SESSIONS.c.tenant == tenant)
            query = query.where(column.in_(mine))
        if session_id is not None:
            query = query.where(column == session_id)
        if since is not None:
            query = query.where(at >= since)
        return query

    summ = EVENTS.c.metadata["summarization"].as_boolean()
    chars = saved_chars_expr()
    # a reverted compaction ran (its usage event stays) but removes nothing now
    reverted = sa.select(JOBS.c.job_id).where(JOBS.c.status == JobStatus.REVERTED.value)
    in_effect = sa.or_(EVENTS.c.job_id.is_(None), EVENTS.c.job_id.not_in(reverted))
    events = lambda q: scoped(q, EVENTS.c.session_id, EVENTS.c.created_at)  # noqa: E731
    jobs = lambda q: scoped(q, JOBS.c.session_id, JOBS.c.created_at)  # noqa: E731
    with engine.connect() as conn:
        counted = EVENTS.c.metadata["tokens_saved"].as_integer()
        tokens = sa.func.coalesce(counted, chars // 4)  # not counted: chars / 4, as approx_tokens
        row: tuple[Any, ...] = (  # (rows as tuples: their values typed Any)
            conn.execute(
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
                        sa.func.coalesce(sa.func.sum(sa.case((in_effect, tokens), else_=0)), 0),
                        sa.func.count(EVENTS.c.id).filter(in_effect & counted.is_not(None)),
                    ).where(summ.is_(True))
                )
            ).one()
        )
        count, total, sessions, tokens_in, tokens_out, reported, saved_tokens, exact = row
        timed: Iterable[tuple[Any, ...]] = conn.execute(
            events(
                sa.select(EVENTS.c.latency_ms)
                .where(summ.is_(True))
                .order_by(EVENTS.c.id.desc())
                .limit(PERCENTILE_SAMPLE)
            )
        )
        latencies = [float(v) for (v,) in timed]
        by_status: dict[str, int] = {}
        by_reason: dict[str, dict[str, int]] = {"skipped": {}, "failed": {}}
        by_code: Iterable[tuple[Any, ...]] = conn.execute(
            jobs(
                sa.select(JOBS.c.status, JOBS.c.reason_code, sa.func.count()).group_by(
                    JOBS.c.status, JOBS.c.reason_code
                )
            )
        )
        for status, code, n in by_code:
            by_status[status] = by_status.get(status, 0) + int(n)
            if status in by_reason:
                key = code or "unknown"
                by_reason[status][key] = by_reason[status].get(key, 0) + int(n)
        applied: Iterable[tuple[Any, ...]] = conn.execute(
            scoped(
                sa.select(JOBS.c.created_at, JOBS.c.crossed_at, JOBS.c.updated_at)
                .where(JOBS.c.status == JobStatus.APPLIED.value)
                .order_by(JOBS.c.updated_at.desc())
                .limit(PERCENTILE_SAMPLE),
                JOBS.c.session_id,
                JOBS.c.updated_at,
            )
        )
        lags = [
            max(0.0, (as_utc(done) - as_utc(crossed or created)).total_seconds() * 1000)  # type: ignore[operator]
            for created, crossed, done in applied
        ]
        failures = [
            {
                "session_id": r.session_id,
                "job_id": r.job_id,
                "reason_code": r.reason_code,
                "reason": r.reason,
                "at": iso_or_none(r.updated_at),
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
        # summaries paid for and not applied: still waiting for their thread, or ended
        # without applying it
        bought_row: tuple[Any, ...] = conn.execute(jobs(sa.select(*bought_counts()))).one()
        waiting, dropped, used = bought_row
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
            "total_tokens_compacted": int(saved_tokens),
            "tokens_counted_compactions": int(exact),
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
            "summaries_not_applied": _not_applied(int(waiting), int(dropped), int(used)),
            "since": since.isoformat() if since is not None else None,
        }
    }


def _not_applied(waiting: int, dropped: int, used: int) -> dict[str, Any]:
    """The summaries paid for (``paid``: applied, waiting or dropped), those prepared and
    waiting for their thread (``waiting``), those ended without being applied (``dropped``:
    stale, expired, superseded, failed), and the share never applied so far (``share``:
    waiting and dropped over paid; None when none was paid for)."""
    paid = used + waiting + dropped
    share = round((waiting + dropped) / paid, 4) if paid else None
    return {"paid": paid, "waiting": waiting, "dropped": dropped, "share": share}


def iso_or_none(value: datetime | None) -> str | None:
    """``value`` as ISO 8601 (naive means UTC); None stays None."""
    value = as_utc(value)
    return value.isoformat() if value is not None else None
