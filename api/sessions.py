"""Session routes: chat turns (a run of the API's own agent), turn import, reads.

Routes are thin: a write route checks the caller owns the session, takes the
thread's lock, runs or appends the turn through the shared LangGraph graph and
answers; the post-turn hook and the checkpoint pruning run after the response
(FastAPI background tasks). Beside the routes: :mod:`api.session_turns` (around a turn's
write) and :mod:`api.session_jobs` (the jobs as ``/compactions`` and ``/events`` show them).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, BackgroundTasks, Depends, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials
from langchain_core.messages import BaseMessage, HumanMessage, messages_to_dict
from starlette.concurrency import run_in_threadpool

from offpath.api.limits.offloop import OffLoopBody
from offpath.api.schemas.answers import ChatOut, CompactionsOut, SessionOut, TurnOut
from offpath.api.schemas.problems import READ, WRITE, errors
from offpath.api.schemas.requests import ChatIn, TurnIn
from offpath.compaction.accounting import total_chars
from offpath.compaction.formats import ConversationFormatError, message_json, to_messages
from offpath.compaction.tracking import KEY as PRIVATE_KEY
from offpath.compaction.tracking import ThreadSize
from offpath.compaction.turns import TurnError, check_messages, validate_turn
from offpath.coordination.admin import read_session
from offpath.coordination.logs import tag
from offpath.coordination.outages import cause, database_unavailable, is_outage
from offpath.coordination.undo import finish_undo, undo_run
from offpath.stores.checkpoints import read_thread, thread_config
from offpath.stores.db.job_queries import jobs_of
from offpath.stores.tenants import note_size
from offpath.stores.updates import job_updates
from offpath.stores.usage.sessions import has_rows

from .deps import (
    DATABASE_DOWN,
    DATABASE_RETRY_AFTER_S,
    Caller,
    SessionId,
    bearer,
    check_readable,
    check_writable,
    give_back,
    key_digest,
    no_session,
    presented_key,
    rt_of,
    take_writable,
)
from .session_jobs import EVENTS_KEEPALIVE_S as EVENTS_KEEPALIVE_S
from .session_jobs import EVENTS_MAX_S as EVENTS_MAX_S
from .session_jobs import EVENTS_POLL_S as EVENTS_POLL_S
from .session_jobs import EVENTS_RETRY_MS as EVENTS_RETRY_MS
from .session_jobs import backoff_json, job_json, lease_json
from .session_turns import offload, run_turn, state_of, summary_text
from .session_turns import prune as prune
from .streams import (
    RETRY_AFTER_S,
    Stream,
    StreamHub,
    TooManyStreams,
    event_stream,
    identity_of,
)

log = logging.getLogger("offpath.api")

#: JSON bodies are parsed and validated off the event loop (:class:`api.limits.OffLoopBody`).
router = APIRouter(prefix="/sessions", tags=["sessions"], route_class=OffLoopBody)

NO_LLM = (
    "no LLM is configured for chat turns: set OPENAI_API_KEY (and OPENAI_BASE_URL for any "
    "OpenAI-compatible endpoint) in .env and restart the API; POST /sessions/{id}/turns "
    "appends turns produced elsewhere without an LLM"
)


def after_write(
    request: Request,
    tasks: BackgroundTasks,
    session_id: str,
    messages: Sequence[BaseMessage],
    chars: int | None = None,
    idle_s: float | None = None,
) -> None:
    """After the response: the post-turn hook (``messages``: an imported turn's thread,
    ``chars``: its size, if known; ``idle_s``: how long the thread was idle before the turn)
    and the pruning of old checkpoints."""
    rt = rt_of(request)
    if messages:
        tasks.add_task(request.app.state.hook, session_id, messages, chars, idle_s)
    if chars is not None:  # the session list's size (GET /sessions)
        tasks.add_task(note_size, rt.engine, session_id, len(messages), chars)
    tasks.add_task(prune, rt, session_id)


#: A chat turn's 503 when the lock or lease store (Redis) did not answer during its run.
STORE_DOWN = f"the lock store did not answer: retry in {DATABASE_RETRY_AFTER_S} s"


@router.post(
    "/{session_id}/messages",
    response_model=ChatOut,
    response_model_exclude_unset=True,
    responses={**WRITE, **errors(502, 503)},
)
def chat(
    session_id: SessionId, body: ChatIn, request: Request, tasks: BackgroundTasks, caller: Caller
) -> dict[str, Any]:
    """One chat turn: a run of the API's own agent (its tools, offpath's middleware compacting
    during the run). Answers the reply and what the run added."""
    rt = rt_of(request)
    settings = rt.settings
    if not (settings.llm_configured or settings.chat_model == "scripted"):
        raise HTTPException(status_code=503, detail=NO_LLM)
    if len(body.content) > settings.max_message_chars:
        raise HTTPException(
            status_code=422,
            detail=f"content: {len(body.content)} chars; at most "
            f"{settings.max_message_chars} are accepted (MAX_MESSAGE_CHARS)",
        )
    check_writable(rt, caller, session_id)
    human = HumanMessage(id=str(uuid.uuid4()), content=body.content)
    config = thread_config(session_id)
    with rt.locks.turn(session_id, run=True):
        new_session = check_writable(rt, caller, session_id)  # again, under the lock
        take_writable(rt, caller, session_id)  # the first writer owns it
        finish_undo(rt, session_id)  # a failed run's messages go before this run's land
        prior = state_of(rt, session_id).get("messages", [])
        before = {m.id for m in prior}
        try:
            values, produced = run_turn(rt, human, config, before)
        except Exception as exc:
            undo_run(rt, session_id, before, str(human.id))
            if new_session:  # nothing of the turn is kept: neither is the claim
                give_back(rt, session_id)
            if is_outage(exc):  # a store did not answer, not the chat model
                log.warning(
                    "[%s] chat turn failed: a store did not answer: %s", tag(session_id), cause(exc)
                )
                raise HTTPException(
                    status_code=503,
                    detail=DATABASE_DOWN if database_unavailable(exc) else STORE_DOWN,
                    headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
                ) from None
            log.warning("[%s] chat turn failed: %s", tag(session_id), exc)
            raise HTTPException(status_code=502, detail=f"the chat model failed: {exc}") from exc
    messages = values["messages"]
    added = produced
    after_write(request, tasks, session_id, ())
    tasks.add_task(note_size, rt.engine, session_id, len(messages), total_chars(messages))
    return {
        "session_id": session_id,
        "reply": message_json(messages[-1]),
        "messages": len(messages),
        "chars": total_chars(messages),
        "run": {
            "messages": len(added),
            "chars": total_chars(added),
            "tool_calls": sum(len(getattr(m, "tool_calls", None) or []) for m in added),
            # a compaction was applied during the run (the summary is new or changed)
            "compacted": summary_text(messages) not in ("", summary_text(prior)),
        },
    }


@router.post(
    "/{session_id}/turns",
    response_model=TurnOut,
    response_model_exclude_unset=True,
    responses=WRITE,
)
def append_turn(
    session_id: SessionId, body: TurnIn, request: Request, tasks: BackgroundTasks, caller: Caller
) -> dict[str, Any]:
    """Append a completed turn produced elsewhere; 422 names what is wrong, nothing is written."""
    rt = rt_of(request)
    settings = rt.settings
    if body.state is not None:
        if "messages" in body.state:
            raise HTTPException(
                status_code=422,
                detail='state: "messages" is reserved; send messages in the messages list',
            )
        state_chars = len(orjson.dumps(body.state).decode())
        if state_chars > settings.max_state_chars:
            raise HTTPException(
                status_code=422,
                detail=f"state: {state_chars} chars; at most {settings.max_state_chars} are accepted "
                "(MAX_STATE_CHARS)",
            )
    try:
        # every check that needs no thread comes before the owner is looked at: a refused
        # turn answers the same whoever owns the id, and claims nothing
        new = check_messages(
            to_messages(body.message_dicts()),
            max_messages=settings.max_turn_messages,
            max_message_chars=settings.max_message_chars,
        )
    except (ConversationFormatError, TurnError) as exc:
        raise HTTPException(status_code=422, detail=str(exc)) from None
    check_writable(rt, caller, session_id)
    with rt.locks.turn(session_id):
        new_session = check_writable(rt, caller, session_id)  # again, under the lock
        finish_undo(rt, session_id)  # a failed run's messages go before this turn's land
        # one read of the thread: the write below starts from it (no second read), and the
        # thread's size is advanced over the new messages only (kept in the private key the
        # middleware keeps it in), so nothing here walks the whole thread
        thread = read_thread(rt.checkpoints.saver, session_id)
        written = thread.written_at  # the thread's last write: idle since then
        idle_s = None if written is None else max(0.0, time.time() - written)
        values = thread.base.checkpoint["channel_values"] if thread.base else {}
        current = thread.messages
        private = values.get(PRIVATE_KEY) or {}
        size = ThreadSize.from_state(private.get("size")).advance(current)
        try:
            new, warnings = validate_turn(
                current,
                new,
                max_messages=settings.max_turn_messages,
                max_message_chars=settings.max_message_chars,
                open_calls=size.open,
                checked=True,
            )
        except TurnError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
        new = offload(rt, session_id, new, len(current))
        messages = [*current, *new]  # what add_messages makes of them: the ids are all new
        size = size.advance(messages)
        update: dict[str, Any] = {
            "messages": new,
            PRIVATE_KEY: {**private, "size": size.to_state()},
        }
        if body.state:
            update["context"] = {**values.get("context", {}), **body.state}
        take_writable(rt, caller, session_id)  # the first writer owns it
        try:
            rt.patch(session_id, update, thread.base)
        except BaseException:
            if new_session:  # nothing was written: the id stays free
                give_back(rt, session_id)
            raise
    after_write(request, tasks, session_id, messages, size.chars, idle_s)
    return {
        "session_id": session_id,
        "appended": len(new),
        "messages": len(messages),
        "chars": size.chars,
        "warnings": [{"code": w.code, "message": w.message} for w in warnings],
    }


@router.get(
    "/{session_id}/messages",
    response_model=SessionOut,
    response_model_exclude_unset=True,
    responses=READ,
)
def read_messages(
    session_id: SessionId,
    request: Request,
    caller: Caller,
    format: Literal["transcript", "langchain"] = Query(  # noqa: A002 - the query name
        "transcript",
        description="transcript: LangChain dicts (type/content/tool_calls/...); langchain: "
        "langchain_core's messages_to_dict, lossless",
    ),
) -> dict[str, Any]:
    """The thread's messages, its size and its other state keys; ``kind``: ``api``, or ``own
    agent`` for a thread of a team's own agent, read from the agent's checkpointer."""
    rt = rt_of(request)
    check_readable(rt, caller, session_id)
    source, thread = read_session(rt, session_id)
    if source.own_agent:
        values = thread.base.checkpoint.get("channel_values", {}) if thread.base else {}
        values = {**values, "messages": thread.messages} if thread.base else values
    else:
        values = state_of(rt, session_id)
    if not values:
        raise no_session(session_id)
    messages = values.get("messages", [])
    return {
        "session_id": session_id,
        "kind": source.kind,
        "messages": (
            messages_to_dict(messages)
            if format == "langchain"
            else [message_json(m) for m in messages]
        ),
        "chars": total_chars(messages),
        "state": values.get("context", {}),
    }


@router.get(
    "/{session_id}/compactions",
    response_model=CompactionsOut,
    response_model_exclude_unset=True,
    responses=READ,
)
def read_compactions(session_id: SessionId, request: Request, caller: Caller) -> dict[str, Any]:
    """The thread's compaction jobs, oldest first, and how each ended; who holds the thread
    now (``lease``) and the failure backoff, if one is running."""
    rt = rt_of(request)
    check_readable(rt, caller, session_id)
    rows = jobs_of(rt.engine, session_id)
    if not rows and not state_of(rt, session_id):
        raise no_session(session_id)
    return {
        "session_id": session_id,
        "jobs": [job_json(r) for r in rows],
        "lease": lease_json(rt, session_id),
        "backoff": backoff_json(rt, session_id),
    }


# --- GET /sessions/{id}/events ---------------------------------------------------------------


@router.get(
    "/{session_id}/events",
    # not in the OpenAPI document: a stream that does not end (a fuzzer's request times out on
    # it); the README documents it
    include_in_schema=False,
    response_class=StreamingResponse,
)
async def events(
    session_id: SessionId,
    request: Request,
    caller: Caller,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)] = None,
) -> StreamingResponse:
    """Server-sent events (``text/event-stream``): the thread's compaction progress, live
    (issue 21, item 4). Each event's ``data`` is the params of an Agent Client Protocol
    ``session/update`` notification, ``{"sessionId": ..., "update": {"sessionUpdate":
    "compaction_update", "compactionId", "status" (in_progress, completed, failed,
    cancelled), "charsBefore", "charsAfter", "reason"}}`` (:mod:`offpath.stores.updates`
    says how a job's status maps), and ``at``: when the job's row changed (ISO 8601). The
    first event is the thread's latest job as it stands (none: no job yet); then one per
    change, whoever made it (the API, the worker, a team's own agent's middleware), read by
    the process's one poller (:mod:`api.streams`). Per tenant like every session route (404
    for another's); at most :data:`~api.streams.STREAMS_PER_KEY` per key and
    :data:`~api.streams.STREAMS_MAX` per process (429 with ``Retry-After``); it ends when the key is revoked or the session
    deleted, and after :data:`EVENTS_MAX_S` (the browser's ``EventSource`` reconnects)."""
    rt = rt_of(request)
    hub: StreamHub = request.app.state.streams
    await run_in_threadpool(check_readable, rt, caller, session_id)
    first = await run_in_threadpool(job_updates, rt.engine, session_id)
    identity = await run_in_threadpool(identity_of, rt, session_id)
    if not first and not await run_in_threadpool(has_rows, rt.engine, session_id):
        raise no_session(session_id)
    key = presented_key(request, credentials)
    stream = Stream(session_id, caller, key, key_digest(request), identity)
    try:
        hub.open(stream)
    except TooManyStreams as exc:
        raise HTTPException(
            status_code=429, detail=exc.detail, headers={"Retry-After": str(RETRY_AFTER_S)}
        ) from None
    return StreamingResponse(
        event_stream(hub, stream, first),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
