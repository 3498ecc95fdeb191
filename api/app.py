"""The chat API (FastAPI): the app, its middleware and error answers; routes live in routers.

* :mod:`api.sessions`: chat turns, turn import, session reads;
* :mod:`api.stats`: ``/stats``, ``/healthz`` and ``/readyz``.

Every route but ``/healthz`` and ``/readyz`` needs an API key (:mod:`api.deps`). Requests are
bounded before they are parsed (:mod:`api.limits`), ``Host`` headers are checked
(``ALLOWED_HOSTS``), and error answers are one line that never echoes the input.
Run it with ``offpath api`` or ``uvicorn offpath.api.app:app``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import sqlalchemy.exc
from fastapi import Depends, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from offpath.agent.graph import open_runtime
from offpath.api.limits.checks import short
from offpath.api.limits.middleware import BodyLimit, HostCheck
from offpath.api.schemas.messages import SHAPE_TAGS
from offpath.api.schemas.problems import Invalid
from offpath.compaction.settings import Settings
from offpath.config import get_settings
from offpath.coordination.eviction import EvictingRedis, check_eviction
from offpath.coordination.hook import PostTurnHook
from offpath.coordination.locks import RunInProgress, ThreadBusy
from offpath.coordination.outages import cause, database_errors, database_unavailable
from offpath.coordination.runtime import Publisher, Runtime
from offpath.coordination.writers import apply_prepared

from . import admin, metrics, sessions, stats, ui
from .deps import (
    DATABASE_DOWN,
    DATABASE_RETRY_AFTER_S,
    SESSION_ID_PATTERN,
    SESSION_ID_RULE,
    body_gate,
    principal,
    sender,
)
from .streams import StreamHub

log = logging.getLogger("offpath.api")

#: How many per-field errors a 422 answer lists.
MAX_ERRORS = 20


def warn_if_redis_down(rt: Runtime) -> None:
    """One WARNING line at start-up when the broker or the lock store does not answer: the
    API starts all the same (turns do not need them), but should not start silently."""
    from kombu.utils.url import sanitize_url

    settings = rt.settings
    down: dict[str, list[str]] = {}
    errors: dict[str, str] = {}
    redis_conn = getattr(rt.locks, "redis", None)  # None with LOCK_BACKEND=database
    checks = [("broker", settings.celery_broker_url or settings.redis_url, rt.ping_broker)]
    if redis_conn is not None:
        checks.append(("lock store", settings.redis_url, redis_conn.ping))
    for role, url, ping in checks:
        try:
            ping()
        except Exception as exc:
            down.setdefault(url, []).append(role)
            errors.setdefault(url, f"{type(exc).__name__}: {exc}")
    for url, roles in down.items():
        log.warning(
            "%s at %s unreachable at start-up (%s): turns work, but compaction jobs are not "
            "queued until it is back",
            " and ".join(roles),
            sanitize_url(url),
            errors[url],
        )


async def watch_loop_lag(period_s: float = 0.05) -> None:
    """Observe how late the event loop wakes from a ``period_s`` sleep
    (``offpath_api_event_loop_lag_seconds``): a request that stalls the loop (a body parsed on it
    froze every request, /healthz too) shows there."""
    from offpath.metrics import LOOP_LAG

    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(period_s)
        LOOP_LAG.observe(max(0.0, loop.time() - started - period_s))


def create_app(settings: Settings | None = None, publish: Publisher | None = None) -> FastAPI:
    """The app; ``publish`` defaults to sending ``compact_session`` to the Celery broker."""
    settings = settings or get_settings()
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        logging.getLogger("alembic").setLevel(logging.WARNING)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        rt = open_runtime(settings, publish=publish, check_connections=True)
        rt.graph  # noqa: B018 - build the agent now: a bad AGENT_TOOLS fails start-up
        warn_if_redis_down(rt)
        try:
            check_eviction(settings, "the API")  # an evicted lease runs a job twice
        except EvictingRedis as exc:
            rt.close()
            app.state.refused = f"{exc}; the API not started"  # one line (RefusedStart)
            raise
        except Exception:
            rt.close()
            raise
        if settings.auth_disabled:
            log.warning(
                "AUTH_DISABLED=true: every caller is the admin of tenant 'default'; "
                "never expose this API beyond 127.0.0.1"
            )
        app.state.rt = rt
        app.state.hook = PostTurnHook(rt, apply=lambda s, j: apply_prepared(rt, s, j))
        app.state.streams = StreamHub(rt)
        log.info("api ready: checkpoints %s", type(rt.checkpoints.saver).__name__)
        watch = asyncio.create_task(watch_loop_lag())
        try:
            yield
        finally:
            watch.cancel()
            await app.state.streams.stop()
            rt.close()

    app = FastAPI(
        title="offpath",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,  # served below, behind the key like every route but the probes
        openapi_url=None,
    )
    app.state.refused = None
    app.add_middleware(RefusedStart)
    hosts = [h.strip() for h in settings.allowed_hosts.split(",") if h.strip()]
    app.add_middleware(HostCheck, allowed_hosts=hosts)
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.max_request_bytes,
        max_depth=settings.max_json_depth,
        max_values=settings.max_json_values,
        max_messages=settings.max_turn_messages,
        gate=body_gate,
        who=sender,
        page=ui.refusal_page,
    )
    app.include_router(sessions.router)
    app.include_router(stats.router)
    app.include_router(ui.router)
    app.include_router(admin.router)
    app.include_router(metrics.router)

    plain_openapi = app.openapi

    def openapi_document() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = database_503(our_422(plain_openapi()))
        return app.openapi_schema

    app.openapi = openapi_document  # type: ignore[method-assign]

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(principal)])
    def openapi() -> dict[str, Any]:
        return app.openapi()

    @app.get("/docs", include_in_schema=False, dependencies=[Depends(principal)])
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="offpath API")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        """One readable line in ``detail`` (the field and what is wrong), the list in
        ``errors``; the input is never echoed (10 MB in used to be 10 MB out). A body sent
        without a JSON ``Content-Type`` (``curl -d`` sends a form's) is not read as JSON:
        ``detail`` says so first. A thread id that is none says the rule in words, not its
        pattern. Under ``/ui`` the answer is the UI's 422 page (a link back to the page
        without the query, or to the sessions list for a path it cannot read)."""
        errors = []
        for e in exc.errors()[:MAX_ERRORS]:
            loc = [str(p) for p in e.get("loc", ())]
            msg = e.get("msg", "")
            if (e.get("ctx") or {}).get("pattern") == SESSION_ID_PATTERN:
                msg = SESSION_ID_RULE
            if e.get("type") == "json_invalid":  # its loc holds the char offset, not a field
                why = (e.get("ctx") or {}).get("error")
                at = f" at char {loc[1]}" if len(loc) > 1 else ""
                loc, msg = loc[:1], f"not valid JSON{at}" + (f" ({why})" if why else "")
            errors.append({"loc": loc, "msg": short(msg, 300), "type": e.get("type")})
        detail = "; ".join(
            f"{'.'.join(p for p in e['loc'] if p != 'body' and p not in SHAPE_TAGS) or 'body'}: "
            f"{e['msg']}"
            for e in errors
        )
        sent = request.headers.get("content-type", "")
        media = sent.split(";")[0].strip().lower()
        if any(e["loc"] == ["body"] for e in errors) and not (
            media == "application/json" or media.endswith("+json")
        ):
            detail = (
                f"the body was not read as JSON: send it with Content-Type: application/json "
                f"(got {short(sent, 100) or 'none'!r}; curl: -H 'Content-Type: application/json'); "
                + detail
            )
        if ui.is_page(request.url.path):
            in_query = all(e["loc"][:1] == ["query"] for e in errors)
            back = request.url.path if in_query else "/ui/sessions"
            context = {"detail": short(detail, 1000), "back": back}
            return ui.page(request, "bad_request.html", context, status=422)
        return JSONResponse(
            status_code=422, content={"detail": short(detail, 1000), "errors": errors}
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        """FastAPI's answer, but a 405's ``Allow`` lists the methods of every route on the
        path (Starlette lists only those of the first route it matched)."""
        if exc.status_code == 405:
            allowed = sorted(methods_of(request))
            exc = StarletteHTTPException(
                405, exc.detail, {**(exc.headers or {}), "Allow": ", ".join(allowed)}
            )
        return await http_exception_handler(request, exc)

    async def _database_down(_: Request, exc: Exception) -> JSONResponse:
        """A database did not answer (refused, dropped or silent connection, statement
        timeout; :func:`~offpath.coordination.outages.database_unavailable`): 503 with
        ``Retry-After`` on every route (each declares it), the driver's words in the log
        only. Any other database error (a constraint, a bad statement) stays a 500."""
        if not database_unavailable(exc):
            raise exc
        log.warning("503: a database did not answer: %s", cause(exc))
        return JSONResponse(
            status_code=503,
            content={"detail": DATABASE_DOWN},
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
        )

    for kind in (*database_errors(), sqlalchemy.exc.DBAPIError, psycopg.Error):
        app.add_exception_handler(kind, _database_down)

    @app.exception_handler(ThreadBusy)
    @app.exception_handler(RunInProgress)
    async def _busy(_: Request, exc: Exception) -> JSONResponse:
        """Another turn, or an agent run, holds the thread: 409 on every route that takes
        its lock (each declares it)."""
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    return app


class RefusedStart:
    """ASGI middleware: a start-up the API refuses for a reason it names in one line (an
    evicting Redis under ``REDIS_EVICTION_CHECK=refuse``; ``app.state.refused``) is reported
    in that line, as the worker reports it, instead of Starlette's traceback; the server
    still exits non-zero."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def said(message: dict[str, Any]) -> None:
            refused = getattr(scope["app"].state, "refused", None)
            if message["type"] == "lifespan.startup.failed" and refused:
                message = {**message, "message": refused}
            await send(message)

        await self.app(scope, receive, said)


#: The methods a 405's ``Allow`` may list.
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def methods_of(request: Request) -> set[str]:
    """The methods the app's routes answer on ``request``'s path: each method is matched
    against the router as a request would be (FastAPI nests included routers, whose
    routes have no ``methods`` to read: every ``Allow`` was empty)."""
    scope = request.scope
    return {
        method
        for method in METHODS
        if any(
            r.matches({**scope, "method": method})[0] is Match.FULL
            for r in request.app.router.routes
        )
    }


def our_422(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with our 422 body (:class:`~api.schemas.Invalid`: ``detail`` a string,
    ``errors`` a list) wherever FastAPI put its own ``HTTPValidationError``."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    ref = "#/components/schemas/Invalid"
    theirs = "#/components/schemas/HTTPValidationError"
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            answer = operation.get("responses", {}).get("422")
            media = (answer or {}).get("content", {}).get("application/json", {})
            if media.get("schema", {}).get("$ref") == theirs:
                media["schema"] = {"$ref": ref}
                answer["description"] = "The request is not valid; nothing was written"
    if "Invalid" not in schemas:
        invalid = Invalid.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(invalid.pop("$defs", {}))
        schemas["Invalid"] = invalid
    for name in ("HTTPValidationError", "ValidationError"):  # unless still referred to
        others = {k: v for k, v in schemas.items() if k != name}
        if f'"#/components/schemas/{name}"' not in json.dumps([document["paths"], others]):
            schemas.pop(name, None)
    return document


#: What a route's 503 says when the database is not the only reason it gives.
DATABASE_503 = "a database did not answer (retry after Retry-After seconds)"


def database_503(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with the 503 every operation may answer when a database does not
    (:data:`~api.deps.DATABASE_DOWN`, a :class:`~api.schemas.Problem`): added where an
    operation declares no 503, named in the description of a :class:`~api.schemas.Problem`
    503 it declares for other reasons. The probes (``/healthz``, ``/readyz``) declare their
    own 503 body, which says which store is down."""
    ref = "#/components/schemas/Problem"
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            answers = operation.setdefault("responses", {})
            answer = answers.get("503")
            if answer is None:
                answers["503"] = {
                    "description": DATABASE_503[0].upper() + DATABASE_503[1:],
                    "content": {"application/json": {"schema": {"$ref": ref}}},
                }
                continue
            media = answer.get("content", {}).get("application/json", {})
            if media.get("schema", {}).get("$ref") == ref:
                answer["description"] = f"{answer['description']}; or {DATABASE_503}"
    return document


_app: FastAPI | None = None


def __getattr__(name: str) -> Any:
    """``app``: the app of the environment's settings (``uvicorn offpath.api.app:app``), made
    on first use, so that importing :func:`create_app` to give it settings reads nothing
    from the environment (DESIGN.md invariant 19)."""
    global _app
    if name == "app":
        if _app is None:
            _app = create_app()
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
