"""The web UI at ``/ui``: a dashboard, the sessions list and one session's page.

Server-rendered Jinja2 templates (``api/templates/``) and one small plain script
(``api/static/ui.js``, no build step, nothing from a CDN). Every page has regions
(``data-region``) that the script refreshes every 2 s from ``/ui/live/...``, which
answers ``{"regions": {name: html}}`` rendered by the same partial templates.

Auth is the API's: the key is entered once on ``/ui/login`` and kept in the
``offpath_key`` cookie (HttpOnly, SameSite=Strict), which the JSON endpoints accept
too (:func:`api.deps.principal`); a state-changing request authenticated by the
cookie must also send the ``X-Offpath-UI`` header, which the script adds and a
cross-site form cannot. ``AUTH_DISABLED=true`` (the embedded demo) needs no login.

Pages read the service layer in-process (:mod:`api.ui_data`); the dashboard's figures
are the ``/stats`` body itself, each widget tagged with its JSON path (``data-stat``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
)
from fastapi.security.utils import get_authorization_scheme_param
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool

from offpath.api.ui_data import listing
from offpath.api.ui_data.chart import size_chart
from offpath.api.ui_data.dashboard import dashboard_stats, fmt, fmt_ms, session_widgets, widgets
from offpath.api.ui_data.listing import SORTS, session_counts
from offpath.api.ui_data.thread import (
    fixed_part_of,
    job_timeline,
    originals_by_summary,
    originals_totals,
    own_summaries,
    session_version,
    thread_items,
    tokens_of,
    waiting_job,
)
from offpath.compaction.accounting import total_chars
from offpath.coordination.admin import read_session
from offpath.stores.tenants import Principal, principal_of
from offpath.stores.usage import stats_body
from offpath.stores.usage.sessions import BadCursor

from .deps import KEY_COOKIE, UI_HEADER, SessionId, check_readable, principal, rt_of
from .stats import Since, parse_since

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=HERE / "templates")
templates.env.filters["num"] = fmt
templates.env.filters["ms"] = fmt_ms
templates.env.filters["totals"] = originals_totals
STATIC = HERE / "static"
#: The files ``/ui/static/`` serves, and their media types (nothing else is served).
STATIC_FILES = {"ui.js": "text/javascript", "ui.css": "text/css"}

#: How often the pages poll ``/ui/live/...``, in milliseconds.
POLL_MS = 2000
#: Pages may load only their own script and style, and be framed by nobody.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)

router = APIRouter(prefix="/ui", include_in_schema=False)


class LoginNeeded(Exception):
    """The request has no valid key: pages redirect to the login page, live data says 401."""


def caller_of(request: Request) -> Principal:
    """The caller, by ``Authorization: Bearer`` or the UI's cookie (:func:`api.deps.principal`);
    raises :class:`LoginNeeded` without a valid key."""
    scheme, token = get_authorization_scheme_param(request.headers.get("Authorization"))
    credentials = None
    if scheme.lower() == "bearer" and token:
        from fastapi.security import HTTPAuthorizationCredentials

        credentials = HTTPAuthorizationCredentials(scheme=scheme, credentials=token)
    try:
        return principal(request, credentials)
    except HTTPException as exc:
        if exc.status_code == 401:
            raise LoginNeeded(str(exc.detail)) from None
        raise


def page(request: Request, template: str, context: dict[str, Any], status: int = 200) -> Response:
    """A rendered page with the UI's security headers."""
    response = templates.TemplateResponse(
        request,
        template,
        {
            "poll_ms": POLL_MS,
            "ui_header": UI_HEADER,
            "auth_disabled": rt_of(request).settings.auth_disabled,
            **context,
        },
        status_code=status,
    )
    return secured(response)


def secured(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
    return response


def is_page(path: str) -> bool:
    """``path`` is one of the UI's pages (not the JSON its scripts fetch under ``/ui/live/``,
    nor a static file): a request refused there is answered with a page."""
    return (path == "/ui" or path.startswith("/ui/")) and not path.startswith(
        ("/ui/live/", "/ui/static/")
    )


def refusal_page(scope: dict[str, Any], detail: str) -> Response | None:
    """The UI's 422 page for a request refused before the app reads it (a NUL in its query:
    :class:`~api.limits.middleware.BodyLimit`), with a link to the page without the query;
    None for a path outside ``/ui`` (answered as JSON)."""
    path = str(scope.get("path", ""))
    if not is_page(path):
        return None
    html = templates.get_template("bad_request.html").render(
        detail=detail, back=path, poll_ms=POLL_MS, ui_header=UI_HEADER, auth_disabled=False
    )
    return secured(HTMLResponse(html, status_code=422))


def to_login(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/ui/login?next={quote(target, safe='')}", status_code=303)


def safe_next(value: str | None) -> str:
    """Where to go after logging in: a path under ``/ui`` only (no open redirect)."""
    if value and value.startswith("/ui") and not value.startswith("//") and "\\" not in value:
        return value
    return "/ui"


def check_same_origin(request: Request) -> None:
    """403 when a form comes from another site: the host of its ``Origin`` header (browsers
    send it with every POST) is not the ``Host`` it was sent to. Hosts only, not schemes:
    behind a proxy that ends TLS the API sees http while the browser says https."""
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
        raise HTTPException(status_code=403, detail="a form posted from another site")


# --- login ------------------------------------------------------------------------------


@router.get("/login")
def login_page(request: Request, next: str = "/ui") -> Response:  # noqa: A002 - the query name
    """The login form: one field, the API key."""
    if rt_of(request).settings.auth_disabled:
        return RedirectResponse(safe_next(next), status_code=303)
    return page(request, "login.html", {"next": safe_next(next), "error": None})


@router.post("/login")
async def login(request: Request) -> Response:
    """Check the key (form field ``key``) and keep it in the ``offpath_key`` cookie: HttpOnly
    (scripts never read it), SameSite=Strict (no other site's request carries it), Secure
    over HTTPS; a wrong key shows the form again with 401. A form posted from another
    site (its ``Origin``) gets 403: nobody is logged in with someone else's key."""
    check_same_origin(request)
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    key = (form.get("key") or [""])[0].strip()
    target = safe_next((form.get("next") or ["/ui"])[0])
    rt = rt_of(request)
    found = await run_in_threadpool(principal_of, rt.engine, key) if key else None
    if found is None:
        error = "unknown or revoked API key" if key else "enter an API key"
        return page(request, "login.html", {"next": target, "error": error}, status=401)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        KEY_COOKIE,
        key,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    """Forget the key cookie (403 for a form posted from another site)."""
    check_same_origin(request)
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(KEY_COOKIE, path="/", httponly=True, samesite="strict")
    return response


# --- pages ------------------------------------------------------------------------------


#: The dashboard's time windows: ``?since=`` values (as ``/stats`` takes them) and labels.
WINDOWS = {"": "all time", "1h": "last hour", "24h": "last 24 hours", "7d": "last 7 days"}


def dashboard_context(request: Request, caller: Principal, since: str | None) -> dict[str, Any]:
    """The ``/stats`` figures (``since``: as ``/stats?since=`` takes it; 422 if it is not
    one), the size chart and the recent failures."""
    rt = rt_of(request)
    stats = dashboard_stats(rt, caller, parse_since(since))
    return {
        "stats": stats,
        "widgets": widgets(stats),
        "chart": size_chart(rt, caller),
        "failures": stats["summary"].get("recent_failures") or [],
        "since": since or "",
        "windows": WINDOWS,
        "caller": caller,
    }


DASHBOARD_REGIONS = {
    "widgets": "_widgets.html",
    "chart": "_chart.html",
    "failures": "_failures.html",
}


def not_understood(request: Request, exc: HTTPException, back: str) -> Response:
    """A page's 422 (a ``?since=`` or a cursor it cannot read) as a page saying why, with a
    link to ``back`` (the page without the query); any other error raised as it is."""
    if exc.status_code != 422:
        raise exc
    return page(request, "bad_request.html", {"detail": exc.detail, "back": back}, status=422)


@router.get("")
@router.get("/")
def dashboard(request: Request, since: Since = None) -> Response:
    """The dashboard: the ``/stats`` figures (``?since=`` a window, as ``/stats`` takes it),
    thread size over time, recent failures."""
    try:
        caller = caller_of(request)
    except LoginNeeded:
        return to_login(request)
    try:
        context = dashboard_context(request, caller, since)
    except HTTPException as exc:
        return not_understood(request, exc, "/ui")
    live = "/ui/live/dashboard" + (f"?since={quote(since)}" if since else "")
    return page(request, "dashboard.html", {**context, "live": live})


def sessions_context(
    request: Request, caller: Principal, q: str, sort: str, order: str, cursor: str | None
) -> dict[str, Any]:
    """A page of the sessions list; 422 for a ``sort`` not in :data:`SORTS`, an ``order``
    neither ``asc`` nor ``desc``, or a cursor the list did not give."""
    if sort not in SORTS:
        raise HTTPException(
            status_code=422, detail=f"sort: one of {', '.join(SORTS)}, not {sort[:40]!r}"
        )
    if order not in ("", "asc", "desc"):
        raise HTTPException(status_code=422, detail=f"order: asc or desc, not {order[:40]!r}")
    try:
        rows, next_cursor = listing.session_page(
            rt_of(request), caller, q=q, sort=sort, order=order, cursor=cursor or None
        )
    except BadCursor as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    order = order or SORTS[sort]
    more = None
    if next_cursor:
        more = "/ui/sessions?" + urlencode(
            {"q": q, "sort": sort, "order": order, "cursor": next_cursor}
        )
    return {
        "rows": rows,
        "q": q,
        "sort": sort,
        "order": order,
        "sorts": SORTS,
        "next_page": more,
        "first_page": bool(cursor),
        "caller": caller,
        "counts": session_counts(rt_of(request), caller),
        "threshold": rt_of(request).settings.summarization_threshold_chars,
    }


SESSIONS_REGIONS = {"table": "_sessions_table.html"}
SearchQuery = Query("", max_length=128, description="part of a session id")
Order = Query("", max_length=64, description="asc or desc (default: the sort's own)")
Cursor = Query(None, max_length=512, description="the next page's cursor")


@router.get("/sessions")
def sessions_page(
    request: Request,
    q: str = SearchQuery,
    sort: str = "last_activity",
    order: str = Order,
    cursor: str | None = Cursor,
) -> Response:
    """The sessions list: size, compactions, last activity; sortable, searchable by id,
    50 a page."""
    try:
        caller = caller_of(request)
    except LoginNeeded:
        return to_login(request)
    try:
        context = sessions_context(request, caller, q, sort, order, cursor)
    except HTTPException as exc:
        return not_understood(request, exc, "/ui/sessions")
    live = f"/ui/live/sessions?{request.url.query}" if request.url.query else "/ui/live/sessions"
    return page(request, "sessions.html", {**context, "live": live})


def session_context(request: Request, caller: Principal, session_id: str) -> dict[str, Any]:
    """One session: its thread, the originals behind each summary, its jobs; 404 if the
    caller may not see it or it has neither a thread nor a job."""
    rt = rt_of(request)
    check_readable(rt, caller, session_id)
    source, thread = read_session(rt, session_id)
    messages = thread.messages
    jobs = job_timeline(rt, session_id)
    if not messages and not jobs:
        raise HTTPException(status_code=404, detail=f"no session {session_id!r}")
    own = own_summaries(rt, session_id)  # a client's summary marker is not offpath's
    items = thread_items(messages, own)
    summaries = [i["id"] for i in items if i["summary"]]
    kept = [m.id for m in messages if m.id not in summaries]  # a summary takes a removed id
    originals, archived = originals_by_summary(rt, session_id, summaries, own, kept)
    stats = stats_body.stats(rt.engine, session_id=session_id)  # GET /sessions/{id}/stats's
    return {
        "stats": stats,
        "saved": session_widgets(stats),
        "session_id": session_id,
        "kind": source.kind,
        "items": items,
        "originals": originals,
        "archived": archived,
        "messages": len(messages),
        "chars": total_chars(messages),
        "tokens": tokens_of(messages),
        "threshold": rt.settings.summarization_threshold_chars,
        **fixed_part_of(rt, session_id, messages),  # fixed, fixed_warning
        "jobs": jobs,
        "waiting": waiting_job(rt, jobs),
        "caller": caller,
    }


SESSION_REGIONS = {"header": "_session_header.html", "thread": "_thread.html", "jobs": "_jobs.html"}


@router.get("/sessions/{session_id}")
def session_page(session_id: SessionId, request: Request) -> Response:
    """One session: the thread as the model sees it, summaries expandable to the originals
    they replaced, the timeline of its jobs and a "compact now" button."""
    try:
        caller = caller_of(request)
        context = session_context(request, caller, session_id)
    except LoginNeeded:
        return to_login(request)
    except HTTPException as exc:
        if exc.status_code != 404:
            raise
        return page(request, "not_found.html", {"detail": exc.detail}, status=404)
    live = f"/ui/live/sessions/{quote(session_id, safe='')}"
    return page(request, "session.html", {**context, "live": live})


# --- live regions -------------------------------------------------------------------------


def regions(
    request: Request, parts: dict[str, str], context: dict[str, Any], version: str | None = None
) -> Response:
    """``{"regions": {name: html}, "version"}``: each partial template rendered with
    ``context``; ``version`` (if any) is what the page sends back as ``?v=``."""
    env = templates.env
    body = {
        name: env.get_template(template).render({"request": request, **context})
        for name, template in parts.items()
    }
    return secured(JSONResponse({"regions": body, "version": version}))


def _live(request: Request, build: Any, parts: dict[str, str], version: Any = None) -> Response:
    """The regions for the caller (401 without a key); with ``version`` (caller -> str), an
    empty ``regions`` when the page's ``?v=`` says it has that version already."""
    try:
        caller = caller_of(request)
    except LoginNeeded as exc:
        return JSONResponse(status_code=401, content={"detail": str(exc)})
    now = version(caller) if version else None
    if now is not None and request.query_params.get("v") == now:
        return secured(JSONResponse({"regions": {}, "version": now}))
    return regions(request, parts, build(caller), now)


@router.get("/live/dashboard")
def live_dashboard(request: Request, since: Since = None) -> Response:
    """The dashboard's regions, for the page's polling."""
    return _live(request, lambda c: dashboard_context(request, c, since), DASHBOARD_REGIONS)


@router.get("/live/sessions")
def live_sessions(
    request: Request,
    q: str = SearchQuery,
    sort: str = "last_activity",
    order: str = Order,
    cursor: str | None = Cursor,
) -> Response:
    """The sessions table, for the page's polling."""
    return _live(
        request, lambda c: sessions_context(request, c, q, sort, order, cursor), SESSIONS_REGIONS
    )


@router.get("/live/sessions/{session_id}")
def live_session(session_id: SessionId, request: Request) -> Response:
    """One session's regions (header, thread, jobs), for the page's polling; nothing but its
    version while ``?v=`` is the version it has (:func:`api.ui_data.session_version`)."""

    def version(caller: Principal) -> str:
        check_readable(rt_of(request), caller, session_id)
        return session_version(rt_of(request), session_id)

    build = lambda c: session_context(request, c, session_id)  # noqa: E731
    return _live(request, build, SESSION_REGIONS, version)


@router.get("/static/{name}")
def static(name: str) -> Response:
    """The UI's own script and stylesheet (no auth: the login page needs them)."""
    if name not in STATIC_FILES:
        raise HTTPException(status_code=404, detail="no such file")
    return FileResponse(
        STATIC / name,
        media_type=STATIC_FILES[name],
        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
    )
