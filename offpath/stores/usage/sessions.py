"""The session list (:func:`list_sessions`: search, sort and keyset pages with opaque
cursors), whether offpath knows a session (:func:`has_rows`) and forgetting a session's
rows (:func:`forget_rows`)."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from offpath.stores.db.tables import EVENTS, JOBS, MASKINGS, JobStatus, as_utc
from offpath.stores.tenants import SESSIONS
from offpath.stores.usage.stats_body import iso_or_none

#: Sort keys of the session list (``-`` before one: descending).
SORTS = ("last_activity", "chars", "compactions", "session_id")
IN_FLIGHT = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)


class BadCursor(ValueError):
    """A cursor this API did not give, or given with another sort order."""


def _encode_cursor(sort: str, value: Any, session_id: str) -> str:
    if isinstance(value, datetime):
        value = {"t": as_utc(value).isoformat()}  # type: ignore[union-attr]
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
        # no session id holds one, and PostgreSQL refuses it in a query
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
            "last_activity": iso_or_none(r.last_activity),
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
