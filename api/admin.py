"""Session admin routes: list sessions, delete one, compact one now, read the
originals its compactions removed. Per tenant, as every session route: another tenant's
session is 404, an admin key sees every tenant's.

The logic is in :mod:`offpath.coordination.admin` (compact, delete) and
:mod:`offpath.stores.usage` (the list, from the usage tables: no checkpoint is read).
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response
from langchain_core.messages import messages_from_dict
from redis.exceptions import RedisError

from offpath.api.schemas.admin import ArchiveOut, CompactOut, RevertOut, SessionsOut
from offpath.api.schemas.problems import ANY_ROUTE, READ, Problem, errors
from offpath.compaction.formats import message_json
from offpath.coordination.admin import (
    JobInFlight,
    NothingToCompact,
    NotQueued,
    compact_now,
    delete_session,
)
from offpath.coordination.locks import LockUnavailable, RunInProgress, ThreadBusy
from offpath.coordination.revert import NoSuchJob, RevertRefused, revert
from offpath.coordination.runtime import Runtime
from offpath.stores import archive
from offpath.stores.checkpoints import read_messages
from offpath.stores.usage.sessions import BadCursor, SortOrder, has_rows, list_sessions

from .deps import Caller, SessionId, check_readable, no_session, rt_of

router = APIRouter(prefix="/sessions", tags=["admin"])

#: The 409 of compact now while a chat run holds the thread (its prepared compaction waits).
RUN_HOLDS_IT = (
    "a chat run holds the session: its compaction prepared ahead is applied by the run's "
    "middleware at its next model call over the threshold, or here once the run ends; try again"
)
#: The 503 of compact now when the thread's lock cannot be asked for.
LOCK_STORE_DOWN = "the lock store is unreachable: try again once it is back"

UNREACHABLE: dict[int | str, dict[str, Any]] = {
    503: {"model": Problem, "description": "The broker or the lock store is unreachable"}
}


def known(rt: Runtime, session_id: str) -> bool:
    """offpath has the session: rows in the usage tables, or a thread in its checkpointer."""
    return has_rows(rt.engine, session_id) or bool(read_messages(rt.checkpoints.saver, session_id))


@router.get("", response_model=SessionsOut, responses={**ANY_ROUTE, **errors(422)})
def sessions(
    request: Request,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=200, description="Sessions per page")] = 50,
    cursor: Annotated[
        str | None, Query(max_length=512, description="next_cursor of the previous page")
    ] = None,
    q: Annotated[str, Query(max_length=128, description="A substring of the session id")] = "",
    sort: Annotated[
        SortOrder,
        Query(description="last_activity, chars, compactions or session_id; - first: descending"),
    ] = "-last_activity",
) -> dict[str, Any]:
    """A page of the caller's sessions (every tenant's for an admin key): size (messages and
    chars after offpath's last write), applied compactions, last activity, jobs in flight.
    Keyset-paginated: pass ``next_cursor`` back as ``cursor`` (with the same ``sort``)."""
    rt = rt_of(request)
    try:
        page, next_cursor = list_sessions(
            rt.engine,
            None if caller.admin else caller.tenant,
            q=q,
            sort=sort,
            limit=limit,
            cursor=cursor or None,
        )
    except BadCursor as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    return {"sessions": page, "next_cursor": next_cursor}


@router.delete(
    "/{session_id}",
    status_code=204,
    response_class=Response,
    responses={204: {"description": "Deleted"}, **errors(400, 401, 404, 409, 422)},
)
def delete(session_id: SessionId, request: Request, caller: Caller) -> Response:
    """Delete the session: its checkpoints, archived originals, job rows, usage events and
    fallback maskings (``/stats`` no longer counts it). 409 while a turn or a compaction
    job runs on it."""
    rt = rt_of(request)
    check_readable(rt, caller, session_id)
    if not known(rt, session_id):
        raise no_session(session_id)
    try:
        delete_session(rt, session_id)
    except JobInFlight as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from None
    return Response(status_code=204)


@router.post(
    "/{session_id}/compact",
    status_code=202,
    response_model=CompactOut,
    responses={**errors(400, 401, 404, 409, 422), **UNREACHABLE},
)
def compact(session_id: SessionId, request: Request, caller: Caller) -> dict[str, Any]:
    """Compact the session now, under its threshold too: a job is queued (follow it at
    ``GET /sessions/{id}/compactions``) if the planner finds a cut (the keep window, whole
    tool-call pairs, at least 4 messages removed, more chars removed than the summary adds);
    else 422 saying why. 409 while a job is queued or running, during the failure backoff, or
    while a chat run holds the thread and a compaction prepared ahead waits for it. A compaction already prepared is applied at once (``status: applied``). A team's
    own agent's thread (``kind: own agent``): the worker prepares the compaction and the
    agent's middleware applies it at the thread's next model call (``detail`` says so;
    ``status: prepared`` when one was prepared already)."""
    rt = rt_of(request)
    check_readable(rt, caller, session_id)
    try:
        done = compact_now(rt, session_id)
    except LookupError:
        raise no_session(session_id) from None
    except JobInFlight as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from None
    except RunInProgress:  # a compaction prepared ahead, and a chat run holds the thread
        raise HTTPException(status_code=409, detail=RUN_HOLDS_IT) from None
    except LockUnavailable as exc:
        if isinstance(exc.__cause__, RedisError):
            raise HTTPException(status_code=503, detail=LOCK_STORE_DOWN) from None
        raise HTTPException(status_code=409, detail=f"the session is busy: {exc}") from None
    except NothingToCompact as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    except NotQueued as exc:
        raise HTTPException(status_code=503, detail=str(exc)) from None
    detail = done.detail or (
        f"follow it at GET /sessions/{session_id}/compactions"
        if done.status == "queued"
        else "the compaction prepared ahead is in the thread"
    )
    return {"job_id": done.job_id, "status": done.status, "kind": done.kind, "detail": detail}


JobId = Annotated[
    str,
    Path(
        pattern=r"^[A-Za-z0-9_-]+$", max_length=64, description="A job id, as /compactions lists it"
    ),
]
#: Why a revert may be refused (a 409 of its own: the generic one speaks of turns only).
NOT_REVERTIBLE: dict[int | str, dict[str, Any]] = {
    409: {
        "model": Problem,
        "description": "The compaction cannot be reverted now: not applied (or reverted "
        "already), folded into a later compaction, a later compaction is in the thread, a turn, "
        "a run or a job holds the thread, or the thread is a team's own agent's",
    }
}


@router.post(
    "/{session_id}/compactions/{job_id}/revert",
    response_model=RevertOut,
    responses={**errors(400, 401, 404, 422), **NOT_REVERTIBLE},
)
def revert_compaction(
    session_id: SessionId, job_id: JobId, request: Request, caller: Caller
) -> dict[str, Any]:
    """Undo the session's latest compaction (issue 19): its removed messages go back in place of
    its summary, in their order and byte for byte as archived; the kept tool results it
    shortened are restored and a request copy it added goes; later messages stay. The job
    ends ``reverted``; the thread is not compacted again before it has grown by a compaction's
    worth. 404: no such job on the session (or another tenant's); 409 says why not now."""
    rt = rt_of(request)
    check_readable(rt, caller, session_id)
    try:
        done = revert(rt, session_id, job_id)
    except NoSuchJob as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from None
    except (RevertRefused, ThreadBusy) as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from None
    return {
        "job_id": done.job_id,
        "status": "reverted",
        "messages_restored": done.messages_restored,
        "results_restored": done.results_restored,
        "messages": done.messages,
        "chars": done.chars,
    }


def _offset(cursor: str | None) -> int:
    if not cursor:
        return 0
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        kind, _, value = text.partition(":")
        if kind == "o" and value.isdigit() and len(value) < 12:
            return int(value)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        pass
    raise HTTPException(
        status_code=422, detail="cursor: not a cursor this API gave (pass next_cursor as it came)"
    )


def _cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"o:{offset}".encode()).decode().rstrip("=")


def archived_json(row: dict[str, Any]) -> dict[str, Any]:
    """One archive row as ``/archive`` shows it: where it was, and the message in the
    transcript format."""
    (message,) = messages_from_dict([row["message"]])
    m = message_json(message)
    at = row.get("created_at")
    return {
        "message_id": row["message_id"],
        "summary_id": row["summary_id"],
        "job_id": row["job_id"] or None,  # "" in the table: shortened on arrival
        "position": row["position"],
        "created_at": at.isoformat() if at is not None else None,
        "type": m["type"],
        "content": m["content"],
        "tool_calls": m.get("tool_calls", []),
        "tool_call_id": m.get("tool_call_id"),
        "name": m.get("name"),
    }


@router.get("/{session_id}/archive", response_model=ArchiveOut, responses=READ)
def read_archive(
    session_id: SessionId,
    request: Request,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=500, description="Messages per page")] = 100,
    cursor: Annotated[
        str | None, Query(max_length=64, description="next_cursor of the previous page")
    ] = None,
    summary_id: Annotated[
        str | None,
        Query(
            max_length=200,
            description="Only the originals the summary message with this id replaced",
        ),
    ] = None,
) -> dict[str, Any]:
    """The original messages the session's compactions removed (the archive), oldest
    compaction first, in thread order within one; paginated."""
    rt = rt_of(request)
    check_readable(rt, caller, session_id)
    offset = _offset(cursor)
    rows, total = archive.read(rt.engine, session_id, offset, limit, summary_id=summary_id)
    if not rows and not offset and not known(rt, session_id):
        raise no_session(session_id)
    end = offset + len(rows)
    return {
        "session_id": session_id,
        "messages": [archived_json(r) for r in rows],
        "total": total,
        "next_cursor": _cursor(end) if end < total else None,
    }
