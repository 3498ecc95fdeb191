"""``/stats`` (per tenant; an admin key sees all) and ``/healthz`` (no key needed)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.deps import Caller, rt_of
from api.schemas import ANY_ROUTE, HealthOut, StatsOut, errors
from offpath.service import db
from offpath.service.runtime import Runtime

router = APIRouter(tags=["stats"])


@router.get(
    "/stats", response_model=StatsOut, response_model_exclude_unset=True, responses=ANY_ROUTE
)
def read_stats(request: Request, caller: Caller) -> dict[str, Any]:
    """Aggregates over the usage tables (the seed's ``summary`` fields and ours), for the
    caller's tenant (all tenants for an admin key)."""
    return db.stats(rt_of(request).engine, tenant=None if caller.admin else caller.tenant)


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
    down), and when the reconciler last ran. Needs no key."""
    rt = rt_of(request)
    checks = {
        "broker": rt.ping_broker,
        "database": lambda: db.ping(rt.engine),
        "checkpointer": rt.checkpoints.ping,
    }
    status: dict[str, str] = {}
    for name, check in checks.items():
        try:
            check()
            status[name] = "ok"
        except Exception as exc:
            status[name] = f"error: {type(exc).__name__}: {exc}"[:300]
    ok = all(v == "ok" for v in status.values())
    status["reconciler"] = reconciler_status(rt)  # reported, not required (demo: no beat)
    return JSONResponse(status_code=200 if ok else 503, content={"ok": ok, **status})


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
