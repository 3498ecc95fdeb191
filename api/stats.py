"""``/stats`` (per tenant; an admin key sees all), ``/sessions/{id}/stats``, ``/healthz`` and
``/readyz`` (no key needed)."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse

from offpath.api.schemas.admin import HealthOut, ReadyOut
from offpath.api.schemas.answers import SessionStatsOut, StatsOut
from offpath.api.schemas.problems import READ, errors
from offpath.compaction.accounting import total_chars
from offpath.compaction.tokens import TokenCounter
from offpath.coordination.admin import read_session
from offpath.coordination.runtime import Runtime
from offpath.stores.db.engine import ping
from offpath.stores.usage.sessions import has_rows
from offpath.stores.usage.stats_body import stats

from .deps import Caller, SessionId, check_readable, no_session, rt_of

log = logging.getLogger("offpath.api")

router = APIRouter(tags=["stats"])

#: ``?since=`` as a duration: a number and a unit (seconds, minutes, hours, days, weeks).
DURATION = re.compile(r"^(\d{1,6})([smhdw])$")
UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(value: str | None) -> datetime | None:
    """``?since=``: an ISO 8601 datetime (UTC if it has no offset) or a duration back from now
    (``90s``, ``15m``, ``1h``, ``7d``, ``2w``); None: all time. 422 naming the parameter
    for anything else."""
    if value is None or value == "":
        return None
    try:
        if m := DURATION.match(value):
            return datetime.now(UTC) - timedelta(**{UNITS[m.group(2)]: int(m.group(1))})
        at = datetime.fromisoformat(value)
    except (ValueError, OverflowError):
        raise HTTPException(
            status_code=422,
            detail="since: an ISO 8601 datetime (2026-12-01T09:00:00Z) or a duration back "
            "from now (90s, 15m, 1h, 7d, 2w)",
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


Since = Annotated[
    str | None,
    Query(
        max_length=64,
        description="Only what happened since then: an ISO 8601 datetime or a duration back "
        "from now (90s, 15m, 1h, 7d, 2w)",
    ),
]


@router.get("/stats", response_model=StatsOut, response_model_exclude_unset=True, responses=READ)
def read_stats(request: Request, caller: Caller, since: Since = None) -> dict[str, Any]:
    """Aggregates over the usage tables (the seed's ``summary`` fields and ours: jobs by status
    and reason, compaction lag and summarizer latency percentiles, the tokens the LLM
    reported, the latest failures), for the caller's tenant (all tenants for an admin
    key); ``since``: a time window (:func:`offpath.stores.usage.stats`)."""
    start = parse_since(since)
    tenant = None if caller.admin else caller.tenant
    return stats(rt_of(request).engine, tenant=tenant, since=start)


@router.get(
    "/sessions/{session_id}/stats",
    response_model=SessionStatsOut,
    response_model_exclude_unset=True,
    responses=READ,
)
def read_session_stats(
    session_id: SessionId, request: Request, caller: Caller, since: Since = None
) -> dict[str, Any]:
    """One session's ``/stats`` figures (``since``: a time window), and its thread now
    (messages, chars and tokens in ``o200k_base``, read from its checkpoint: offpath's, or
    a team's own agent's checkpointer)."""
    start = parse_since(since)
    rt = rt_of(request)
    check_readable(rt, caller, session_id)
    messages = read_session(rt, session_id)[1].messages
    if not messages and not has_rows(rt.engine, session_id):
        raise no_session(session_id)
    body = stats(rt.engine, since=start, session_id=session_id)
    return {
        "session_id": session_id,
        "messages": len(messages),
        "chars": total_chars(messages),
        "tokens": TokenCounter(max_cached=0).count(messages),
        **body,
    }


@router.get(
    "/healthz",
    response_class=JSONResponse,
    responses={
        200: {"model": HealthOut, "description": "Everything answers"},
        503: {"model": HealthOut, "description": "The broker, database or checkpointer is down"},
        **errors(400),
    },
)
def healthz(request: Request) -> JSONResponse:
    """Reachability of the broker, the usage database and the checkpointer (503 if one is
    down), and when the reconciler last ran. Needs no key. Liveness: whether any worker
    consumes the jobs is ``/readyz``'s question."""
    status = reachability(rt_of(request))
    ok = all(v == "ok" for v in status.values())
    status["reconciler"] = reconciler_status(rt_of(request))  # reported, not required
    return JSONResponse(status_code=200 if ok else 503, content={"ok": ok, **status})


@router.get(
    "/readyz",
    response_class=JSONResponse,
    responses={
        200: {"model": ReadyOut, "description": "Everything answers and workers consume"},
        503: {
            "model": ReadyOut,
            "description": "A store is down, or no worker consumes a queue (``workers`` says)",
        },
        **errors(400),
    },
)
def readyz(request: Request) -> JSONResponse:
    """Readiness to compact: ``/healthz``'s checks, and a worker consuming each queue offpath
    publishes to (asked through the broker with Celery's ``active_queues``, waiting at most
    1 s, the answer reused for 10 s: :mod:`offpath.coordination.consumers`). 503 when a store is
    down or a queue has no consumer, ``workers`` naming the queue and the broker. A broker
    that cannot ask workers (the demo's SQLAlchemy transport) says ``unknown`` and does not
    fail it. Needs no key (issue 21, item 3)."""
    import time

    from offpath.coordination.consumers import readiness, watch_for

    rt = rt_of(request)
    status: dict[str, Any] = reachability(rt)
    ok = all(v == "ok" for v in status.values())
    status["reconciler"] = reconciler_status(rt)
    settings = rt.settings
    found = watch_for(settings).get()
    ready, queues, message = readiness(found, [settings.celery_queue], settings.broker_url)
    body = {"ok": ok and ready, **status, "workers": message, "queues": queues}
    body["checked_s_ago"] = round(time.time() - found.at, 1) if found.at else None
    body["warnings"] = fixed_part_warnings(rt) if status["database"] == "ok" else []
    return JSONResponse(status_code=200 if body["ok"] else 503, content=body)


def fixed_part_warnings(rt: Runtime) -> list[str]:
    """One line when sessions have a fixed part (system prompt) over their threshold: every
    model call of theirs is over it, whatever a compaction removes; the sizes, and the
    setting to change. Empty when there is none or it cannot be read."""
    from offpath.compaction.planner import thread_budget
    from offpath.stores.tenants import fixed_over

    try:
        n, rows = fixed_over(rt.engine)
    except Exception as exc:  # reported by the database check, not here
        log.debug("fixed parts not read: %s", exc)
        return []
    if not n:
        return []
    each = ", ".join(f"{sid!r} ({fixed:,} > {threshold:,})" for sid, fixed, threshold in rows)
    advised = thread_budget(rt.settings, max(fixed for _, fixed, _ in rows)).advised
    return [
        f"{n} session(s) have a fixed part (system prompt and what no compaction removes) over "
        f"their threshold, so every model call of theirs is over it: {each}"
        f"{', ...' if n > len(rows) else ''}. Set SUMMARIZATION_THRESHOLD_CHARS to at least "
        f"{advised:,} (the largest fixed part, the keep window and a summary under the prepare "
        "floor), or shorten the system prompt"
    ]


def reachability(rt: Runtime) -> dict[str, str]:
    """``ok`` or ``error: ...`` for the broker, the usage database and the checkpointer."""
    checks = {
        "broker": rt.ping_broker,
        "database": lambda: ping(rt.engine),
        "checkpointer": rt.checkpoints.ping,
    }
    status: dict[str, str] = {}
    for name, check in checks.items():
        try:
            check()
            status[name] = "ok"
        except Exception as exc:
            status[name] = f"error: {type(exc).__name__}: {exc}"[:300]
    return status


def reconciler_status(rt: Runtime) -> str:
    """When the reconciler last ran (``offpath beat`` with a worker), as /healthz reports it."""
    from offpath.worker.reconciler import seconds_since_last_pass

    try:
        ago = seconds_since_last_pass(rt)
    except Exception as exc:
        return f"unknown: {type(exc).__name__}"
    if ago is None:
        return "no pass seen: is `offpath beat` running?"
    late = ago > 3 * rt.settings.reconcile_interval_s
    return f"{'late: ' if late else 'ok: '}last pass {ago:.0f}s ago"
