"""What the routes share: the runtime, who is calling (API keys), and session access.

Every route but ``/healthz`` needs ``Authorization: Bearer <key>`` (or the UI's
``offpath_key`` cookie). A session belongs to the tenant whose key first wrote to
it; another tenant gets 404 (not 403: ids do not leak). ``AUTH_DISABLED=true``
makes every caller the admin of tenant ``default`` (the embedded demo).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from offpath.service.runtime import Runtime
from offpath.service.tenants import DEFAULT_TENANT, Principal, owner_of, principal_of, take_session

SessionId = Annotated[
    str,
    Path(
        # not dots only: clients and proxies rewrite "." and ".." path segments (a session
        # made so could be listed but not read)
        pattern=r"^[A-Za-z0-9._:@-]*[A-Za-z0-9_:@-][A-Za-z0-9._:@-]*$",
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


def rt_of(request: Request) -> Runtime:
    return request.app.state.rt


def principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)] = None,
) -> Principal:
    """The caller, from its API key; 401 without a valid one."""
    rt = rt_of(request)
    if rt.settings.auth_disabled:
        return Principal(DEFAULT_TENANT, admin=True)
    key = credentials.credentials if credentials else request.cookies.get(KEY_COOKIE)
    if key and not credentials and request.method not in SAFE_METHODS:
        if not request.headers.get(UI_HEADER):
            raise HTTPException(
                status_code=403,
                detail=f"a {request.method} authenticated by the UI's cookie must send "
                f"the {UI_HEADER} header (or use Authorization: Bearer <key>)",
            )
    if not key:
        raise HTTPException(
            status_code=401,
            detail="missing API key: send Authorization: Bearer <key> "
            "(create one with `offpath keys create --tenant NAME`)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    found = principal_of(rt.engine, key)
    if found is None:
        raise HTTPException(
            status_code=401,
            detail="unknown or revoked API key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return found


Caller = Annotated[Principal, Depends(principal)]


def no_session(session_id: str) -> HTTPException:
    return HTTPException(status_code=404, detail=f"no session {session_id!r}")


def check_readable(rt: Runtime, caller: Principal, session_id: str) -> None:
    """404 unless ``caller`` may read ``session_id`` (its tenant owns it, or an admin)."""
    if not caller.sees(owner_of(rt.engine, session_id)):
        raise no_session(session_id)


def check_readable_or_new(rt: Runtime, caller: Principal, session_id: str) -> None:
    """404 if another tenant owns ``session_id`` (before taking its lock)."""
    owner = owner_of(rt.engine, session_id)
    if owner is not None and not caller.sees(owner):
        raise no_session(session_id)


def take_writable(rt: Runtime, caller: Principal, session_id: str) -> None:
    """Make a new session ``caller``'s; 404 if another tenant owns it (an admin may write)."""
    owner = take_session(rt.engine, session_id, caller.tenant)
    if not caller.sees(owner):
        raise no_session(session_id)
