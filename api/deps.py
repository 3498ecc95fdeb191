"""What the routes share: the runtime, who is calling (API keys), and session access.

Every route but ``/healthz`` needs ``Authorization: Bearer <key>`` (or the UI's
``offpath_key`` cookie); a request with a body is refused before its body is read
(:func:`body_gate`). A session belongs to the tenant whose key first wrote to it (a
write that is refused claims nothing); another tenant gets 404 (not 403: ids do not
leak). ``AUTH_DISABLED=true`` makes every caller the admin of tenant ``default`` (the
embedded demo).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from starlette.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from offpath.coordination.outages import cause, database_unavailable
from offpath.coordination.runtime import Runtime
from offpath.stores.tenants import (
    DEFAULT_TENANT,
    Principal,
    forget_session,
    owner_of,
    principal_of,
    session_of,
    take_session,
)

from .limits.middleware import GateUnavailable

log = logging.getLogger("offpath.api")

#: A thread id (a path's ``{session_id}``): not dots only, as clients and proxies rewrite "."
#: and ".." path segments (a session made so could be listed but not read).
SESSION_ID_PATTERN = r"^[A-Za-z0-9._:@-]*[A-Za-z0-9_:@-][A-Za-z0-9._:@-]*$"
#: :data:`SESSION_ID_PATTERN` in words (what a 422 says, never the pattern).
SESSION_ID_RULE = "a thread id is 1-128 letters, digits or . _ : @ -, not dots only"
SessionId = Annotated[
    str,
    Path(
        pattern=SESSION_ID_PATTERN,
        max_length=128,
        description="Thread id: 1-128 letters, digits or . _ : @ -, not dots only",
    ),
]

#: The cookie the web UI keeps the key in (HttpOnly, SameSite=Strict: :mod:`api.ui`).
KEY_COOKIE = "offpath_key"
#: The header the UI's own scripts send with a state-changing request authenticated by the
#: cookie (a cross-site form cannot set it): without it such a request gets 403.
UI_HEADER = "X-Offpath-UI"
#: Methods that change nothing, which need no :data:`UI_HEADER`.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

bearer = HTTPBearer(
    auto_error=False,
    description="An API key (`offpath keys create --tenant NAME`), as `Authorization: Bearer <key>`",
)


#: The 401 answers.
MISSING_KEY = (
    "missing API key: send Authorization: Bearer <key> "
    "(create one with `offpath keys create --tenant NAME`)"
)
UNKNOWN_KEY = "unknown or revoked API key"


def missing_key(request: HTTPConnection) -> str:
    """The 401's words for a request without a key: :data:`MISSING_KEY`, naming the scheme
    it sent instead when it sent one (``Authorization: Basic ...`` is not read)."""
    scheme, _ = get_authorization_scheme_param(request.headers.get("authorization"))
    if scheme and scheme.lower() != "bearer":
        return f"Authorization: {scheme[:20]} is not read: {MISSING_KEY}"
    return MISSING_KEY


#: The 503 of a request a database did not answer (every route may give it), and its
#: ``Retry-After`` (s).
DATABASE_RETRY_AFTER_S = 5
DATABASE_DOWN = (
    "a database (the usage tables or the checkpointer) did not answer: retry in "
    f"{DATABASE_RETRY_AFTER_S} s"
)


def rt_of(request: HTTPConnection) -> Runtime:
    return request.app.state.rt


def presented_key(
    request: HTTPConnection, credentials: HTTPAuthorizationCredentials | None
) -> str | None:
    """The key a request sends: its bearer token, else the UI's cookie."""
    return credentials.credentials if credentials else request.cookies.get(KEY_COOKIE)


def key_digest(request: HTTPConnection) -> str:
    """Who sends a request, for the bounds per key (bytes in flight, event streams): the
    first 16 hex chars of the SHA-256 of the key it presents (its bearer token, else the UI's
    cookie), "" for none. Whether the key is valid is checked elsewhere."""
    scheme, token = get_authorization_scheme_param(request.headers.get("authorization"))
    key = token if scheme.lower() == "bearer" and token else request.cookies.get(KEY_COOKIE)
    return hashlib.sha256(key.encode()).hexdigest()[:16] if key else ""


def sender(scope: dict[str, Any]) -> str:
    """:func:`key_digest` of the request of ``scope`` (:class:`api.limits.BodyLimit`'s
    ``who``)."""
    return key_digest(HTTPConnection(scope))


async def body_gate(scope: dict[str, Any]) -> str | None:
    """Why the request of ``scope`` may not send a body (the 401 answer: no key, or an
    unknown one), or None; :class:`api.limits.BodyLimit` asks before it reads one byte of
    a body (an unauthenticated body is never read nor parsed). The route still checks the
    caller (the UI header, the tenant) as for any request."""
    request = HTTPConnection(scope)
    rt = rt_of(request)
    if rt.settings.auth_disabled:
        return None
    key = presented_key(request, await bearer(request))
    if not key:
        return missing_key(request)
    try:
        found = await run_in_threadpool(principal_of, rt.engine, key)
    except Exception as exc:
        if not database_unavailable(exc):
            raise
        log.warning("API key not checked: %s", cause(exc))
        raise GateUnavailable(DATABASE_DOWN, DATABASE_RETRY_AFTER_S) from None
    return None if found is not None else UNKNOWN_KEY


def principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)] = None,
) -> Principal:
    """The caller, from its API key; 401 without a valid one."""
    rt = rt_of(request)
    if rt.settings.auth_disabled:
        return Principal(DEFAULT_TENANT, admin=True)
    key = presented_key(request, credentials)
    if key and not credentials and request.method not in SAFE_METHODS:
        if not request.headers.get(UI_HEADER):
            raise HTTPException(
                status_code=403,
                detail=f"a {request.method} authenticated by the UI's cookie must send "
                f"the {UI_HEADER} header (or use Authorization: Bearer <key>)",
            )
    if not key:
        raise HTTPException(
            status_code=401, detail=missing_key(request), headers={"WWW-Authenticate": "Bearer"}
        )
    found = principal_of(rt.engine, key)
    if found is None:
        raise HTTPException(
            status_code=401, detail=UNKNOWN_KEY, headers={"WWW-Authenticate": "Bearer"}
        )
    return found


Caller = Annotated[Principal, Depends(principal)]


def no_session(session_id: str) -> HTTPException:
    return HTTPException(status_code=404, detail=f"no session {session_id!r}")


def check_readable(rt: Runtime, caller: Principal, session_id: str) -> None:
    """404 unless ``caller`` may read ``session_id`` (its tenant owns it, or an admin)."""
    if not caller.sees(owner_of(rt.engine, session_id)):
        raise no_session(session_id)


#: The 409 of a write to a team's own agent's thread.
OWN_AGENT_THREAD = (
    "session {!r} is a thread of a team's own agent (kind 'own agent'): offpath never writes "
    "its checkpoint; its turns come from the agent's own runs"
)


def check_writable(rt: Runtime, caller: Principal, session_id: str) -> bool:
    """404 if another tenant owns ``session_id``, 409 if it is a team's own agent's thread
    (offpath never writes it); True when nobody owns it yet (a write would create it).
    Claims nothing: :func:`take_writable` does, once the write is sure."""
    found = session_of(rt.engine, session_id)
    if found is not None and not caller.sees(found.tenant):
        raise no_session(session_id)
    if found is not None and found.own_agent:
        raise HTTPException(status_code=409, detail=OWN_AGENT_THREAD.format(session_id))
    return found is None


def take_writable(rt: Runtime, caller: Principal, session_id: str) -> None:
    """Make a new session ``caller``'s; 404 if another tenant owns it (an admin may write).
    Called under the thread's lock, once the write has passed every check: a refused
    request claims nothing."""
    owner = take_session(rt.engine, session_id, caller.tenant)
    if not caller.sees(owner):
        raise no_session(session_id)


def give_back(rt: Runtime, session_id: str) -> None:
    """Forget the owner of a session whose first write failed after :func:`take_writable`
    (nothing of it was kept): the id is free again, as if it had never been asked for."""
    forget_session(rt.engine, session_id)
