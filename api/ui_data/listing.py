"""The sessions list (:func:`session_page`, :func:`session_counts`: ``GET /sessions``' rows)
and a session's reads the chart and the session page share (:func:`thread_of`,
:func:`activity_of`; naive SQLite datetimes read as UTC).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from langchain_core.messages import BaseMessage

from offpath.coordination.admin import read_session
from offpath.coordination.runtime import Runtime
from offpath.stores.db.tables import JOBS, JobStatus
from offpath.stores.tenants import SESSIONS, Principal
from offpath.stores.usage.sessions import list_sessions

#: The sessions list's sort keys, each with its default order.
SORTS = {"last_activity": "desc", "chars": "desc", "compactions": "desc", "session_id": "asc"}
#: Sessions per page of the list.
PAGE_SIZE = 50


def session_page(
    rt: Runtime,
    caller: Principal,
    q: str = "",
    sort: str = "last_activity",
    order: str = "",
    cursor: str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the caller's sessions whose id contains ``q``, sorted by ``sort`` (one of
    :data:`SORTS`; ``order``: asc or desc, default per :data:`SORTS`), and the cursor of
    the next page: what ``GET /sessions`` answers (:func:`offpath.stores.usage.list_sessions`:
    ``session_id``, ``tenant``, ``messages``, ``chars``, ``compactions``, ``last_activity``,
    ``jobs_in_flight``). Raises :class:`~offpath.stores.usage.BadCursor`, :class:`ValueError`
    for a sort or an order it does not have."""
    if sort not in SORTS or order not in ("", "asc", "desc"):
        raise ValueError(f"sort {sort!r} or order {order!r} is not one the list has")
    desc = (order or SORTS[sort]) == "desc"
    return list_sessions(
        rt.engine,
        None if caller.admin else caller.tenant,
        q=q,
        sort=("-" if desc else "") + sort,
        limit=PAGE_SIZE,
        cursor=cursor,
    )


def session_counts(rt: Runtime, caller: Principal) -> dict[str, int]:
    """``{"sessions", "compacted"}``: how many sessions the caller's list holds (all pages,
    no search) and how many of them have an applied compaction, as the list counts them
    (:func:`offpath.stores.usage.list_sessions`' ``compactions``). The dashboard's
    "sessions compacted" (all time) is the second figure."""
    applied = (
        sa.select(JOBS.c.session_id)
        .where(JOBS.c.status == JobStatus.APPLIED.value)
        .distinct()
        .subquery()
    )
    mine = sa.true() if caller.admin else SESSIONS.c.tenant == caller.tenant
    q = (
        sa.select(sa.func.count(), sa.func.count(applied.c.session_id))
        .select_from(SESSIONS.outerjoin(applied, applied.c.session_id == SESSIONS.c.session_id))
        .where(mine)
    )
    with rt.engine.connect() as conn:
        sessions, compacted = conn.execute(q).one()
    return {"sessions": int(sessions), "compacted": int(compacted)}


def thread_of(rt: Runtime, session_id: str) -> list[BaseMessage]:
    """The thread's messages as the model sees them ([] if there is none): from offpath's
    checkpointer, or for a thread of a team's own agent (the middleware), from the agent's
    checkpointer (:func:`offpath.coordination.admin.read_session`)."""
    return read_session(rt, session_id)[1].messages


def activity_of(
    rt: Runtime, session_id: str
) -> tuple[datetime | None, datetime | None, int | None]:
    """When the session was created and last written to, and its size in chars after
    offpath's last write to it (its ``sessions`` row: no checkpoint is read; Nones for a
    thread offpath does not own)."""
    with rt.engine.connect() as conn:
        row = conn.execute(
            sa.select(SESSIONS.c.created_at, SESSIONS.c.last_activity, SESSIONS.c.chars).where(
                SESSIONS.c.session_id == session_id
            )
        ).first()
    if row is None:
        return None, None, None
    return utc_aware(row.created_at), utc_aware(row.last_activity), row.chars


def utc_aware(value: datetime) -> datetime:
    """SQLite hands back naive datetimes: they are UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def iso_seconds(value: datetime | None) -> str | None:
    """``value`` as ISO 8601 UTC to the second (naive means UTC); None stays None."""
    return None if value is None else utc_aware(value).isoformat(timespec="seconds")
