"""The chat API (FastAPI): chat turns, turn import, session reads, ``/stats``, ``/healthz``.

Routes are thin: a write route takes the thread's lock, runs or appends the
turn through the shared LangGraph graph, answers, and leaves the post-turn hook
to a background task (after the response is sent). Run it with
``offpath api`` or ``uvicorn offpath.api.app:app``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Annotated, Any, Literal

from fastapi import BackgroundTasks, FastAPI, HTTPException, Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from langchain_core.messages import BaseMessage, HumanMessage, RemoveMessage, messages_to_dict
from langgraph.graph.message import add_messages
from pydantic import BaseModel, Field

from offpath.compaction.accounting import total_chars
from offpath.compaction.formats import ConversationFormatError, message_json, to_messages
from offpath.compaction.settings import Settings, get_settings
from offpath.compaction.summary import is_summary
from offpath.compaction.turns import TurnError, validate_turn
from offpath.service import db
from offpath.service.agent import thread_config
from offpath.service.compactions import apply_prepared
from offpath.service.hook import PostTurnHook
from offpath.service.leases import failure_backoff_s
from offpath.service.locks import ThreadBusy
from offpath.service.logs import tag
from offpath.service.runtime import Publisher, Runtime

log = logging.getLogger("offpath.api")

SessionId = Annotated[
    str,
    Path(
        pattern=r"^[A-Za-z0-9._:@-]{1,128}$",
        description="Thread id: 1-128 letters, digits or . _ : @ -",
    ),
]

NO_LLM = (
    "no LLM is configured for chat turns: set OPENAI_API_KEY (and OPENAI_BASE_URL for any "
    "OpenAI-compatible endpoint) in .env and restart the API; POST /sessions/{id}/turns "
    "appends turns produced elsewhere without an LLM"
)


class ChatIn(BaseModel):
    content: str = Field(min_length=1, description="The user's message")


class TurnIn(BaseModel):
    messages: list[dict[str, Any]] = Field(
        min_length=1,
        description="The turn's messages: OpenAI chat format (role/content/tool_calls), "
        "LangChain dicts (type/content/tool_calls/tool_call_id) or serialized LangChain messages",
    )
    state: dict[str, Any] | None = Field(
        default=None,
        description="Other keys of the thread's state to set (kept across compactions)",
    )


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
        rt = Runtime.open(settings, publish=publish)
        rt.graph  # noqa: B018 - build the agent now: a bad AGENT_TOOLS fails start-up
        warn_if_redis_down(rt)
        app.state.rt = rt
        app.state.hook = PostTurnHook(rt, apply=lambda s, j: apply_prepared(rt, s, j))
        log.info("api ready: checkpoints %s", type(rt.checkpoints.saver).__name__)
        try:
            yield
        finally:
            rt.close()

    app = FastAPI(title="offpath", version="0.1.0", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        """One readable line in ``detail`` (the field and what is wrong), the list in ``errors``."""
        parts = []
        for e in exc.errors():
            loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
            parts.append(f"{loc}: {e.get('msg')}")
        return JSONResponse(
            status_code=422,
            content={"detail": "; ".join(parts), "errors": jsonable_encoder(exc.errors())},
        )

    @app.exception_handler(ThreadBusy)
    async def _busy(_: Request, exc: ThreadBusy) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    def rt_of(request: Request) -> Runtime:
        return request.app.state.rt

    def state_of(rt: Runtime, session_id: str) -> dict[str, Any]:
        return rt.graph.get_state(thread_config(session_id)).values

    def after_turn(
        request: Request, tasks: BackgroundTasks, session_id: str, messages: Sequence[BaseMessage]
    ) -> None:
        tasks.add_task(request.app.state.hook, session_id, list(messages))

    @app.post("/sessions/{session_id}/messages")
    def chat(session_id: SessionId, body: ChatIn, request: Request) -> dict[str, Any]:
        """One chat turn: a run of the agent (its tools, offpath's middleware compacting during
        the run). 503 when no LLM is configured; 502 if the model fails (the turn is taken back)."""
        if not (settings.llm_configured or settings.chat_model == "scripted"):
            raise HTTPException(status_code=503, detail=NO_LLM)
        rt = rt_of(request)
        human = HumanMessage(id=str(uuid.uuid4()), content=body.content)
        config = thread_config(session_id)
        with rt.locks.turn(session_id, run=True):
            prior = state_of(rt, session_id).get("messages", [])
            before = {m.id for m in prior}
            try:
                values = rt.graph.invoke({"messages": [human]}, config)
            except Exception as exc:
                _undo(rt, session_id, before)
                log.warning("[%s] chat turn failed: %s", tag(session_id), exc)
                raise HTTPException(
                    status_code=502, detail=f"the chat model failed: {exc}"
                ) from exc
        messages = values["messages"]
        added = [m for m in messages if m.id not in before]
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
                "compacted": _summary_text(messages) not in ("", _summary_text(prior)),
            },
        }

    @app.post("/sessions/{session_id}/turns")
    def append_turn(
        session_id: SessionId, body: TurnIn, request: Request, tasks: BackgroundTasks
    ) -> dict[str, Any]:
        """Append a completed turn produced elsewhere; 422 names what is wrong, nothing is written."""
        try:
            new = to_messages(body.messages)
        except ConversationFormatError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
        rt = rt_of(request)
        with rt.locks.turn(session_id):
            values = state_of(rt, session_id)
            current = list(values.get("messages", []))
            try:
                new, warnings = validate_turn(
                    current,
                    new,
                    max_messages=settings.max_turn_messages,
                    max_message_chars=settings.max_message_chars,
                )
            except TurnError as exc:
                raise HTTPException(status_code=422, detail=str(exc)) from None
            update: dict[str, Any] = {"messages": new}
            if body.state and "messages" in body.state:
                raise HTTPException(
                    status_code=422,
                    detail='state: "messages" is reserved; send messages in the messages list',
                )
            if body.state:
                update["context"] = {**values.get("context", {}), **body.state}
            rt.patch(session_id, update)
        messages = add_messages(current, new)
        after_turn(request, tasks, session_id, messages)
        return {
            "session_id": session_id,
            "appended": len(new),
            "messages": len(messages),
            "chars": total_chars(messages),
            "warnings": [{"code": w.code, "message": w.message} for w in warnings],
        }

    @app.get("/sessions/{session_id}/messages")
    def read_messages(
        session_id: SessionId,
        request: Request,
        format: Literal["transcript", "langchain"] = Query(  # noqa: A002 - the query name
            "transcript",
            description="transcript: LangChain dicts (type/content/tool_calls/...); langchain: "
            "langchain_core's messages_to_dict, lossless",
        ),
    ) -> dict[str, Any]:
        """The thread's messages, its size and its other state keys."""
        values = state_of(rt_of(request), session_id)
        if not values:
            raise HTTPException(status_code=404, detail=f"no session {session_id!r}")
        messages = values.get("messages", [])
        return {
            "session_id": session_id,
            "messages": (
                messages_to_dict(messages)
                if format == "langchain"
                else [message_json(m) for m in messages]
            ),
            "chars": total_chars(messages),
            "state": values.get("context", {}),
        }

    @app.get("/sessions/{session_id}/compactions")
    def read_compactions(session_id: SessionId, request: Request) -> dict[str, Any]:
        """The thread's compaction jobs, oldest first, and how each ended; who holds the
        thread now (``lease``) and the failure backoff, if one is running."""
        rt = rt_of(request)
        rows = db.jobs_of(rt.engine, session_id)
        if not rows and not state_of(rt, session_id):
            raise HTTPException(status_code=404, detail=f"no session {session_id!r}")
        return {
            "session_id": session_id,
            "jobs": [job_json(r) for r in rows],
            "lease": lease_json(rt, session_id),
            "backoff": backoff_json(rt, session_id),
        }

    @app.get("/stats")
    def read_stats(request: Request) -> dict[str, Any]:
        """Aggregates over the usage tables (the seed's ``summary`` fields and ours)."""
        return db.stats(rt_of(request).engine)

    @app.get("/healthz")
    def healthz(request: Request) -> JSONResponse:
        """Reachability of the broker, the usage database and the checkpointer."""
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

    return app


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


def job_json(r: dict[str, Any]) -> dict[str, Any]:
    """One ``compaction_jobs`` row as ``/compactions`` shows it."""
    result = {
        **((r["result"] or {}).get("usage") or {}),
        **((r["result"] or {}).get("record") or {}),
    }
    applied = r["status"] == db.JobStatus.APPLIED
    return {
        "job_id": r["job_id"],
        "status": r["status"],
        "reason": r["reason"],
        "reason_code": r["reason_code"],
        "attempts": r["attempts"],
        "published": r["published"],
        "chars_when_queued": r["chars_before"],
        "messages_removed": result.get("messages_removed") if applied else None,
        "chars_removed": result.get("chars_removed") if applied else None,
        "summarizer": result.get("summarizer"),
        "latency_ms": result.get("latency_ms"),
        "created_at": r["created_at"].isoformat(),
        "updated_at": r["updated_at"].isoformat(),
    }


def lease_json(rt: Runtime, session_id: str) -> dict[str, Any] | None:
    """Who holds the thread's claim now (None: free, or the lock store is unreachable)."""
    try:
        holder = rt.leases.holder(session_id)
    except Exception:
        return None
    if holder is None:
        return None
    return {"job_id": holder.job_id, "state": holder.state.name.lower()}


def backoff_json(rt: Runtime, session_id: str) -> dict[str, Any] | None:
    """The failure backoff after jobs failed in a row (issue 8, item 5), while it runs."""
    failures, last = db.failures_in_a_row(rt.engine, session_id)
    s = rt.settings
    seconds = failure_backoff_s(failures, s.failure_backoff_s, s.failure_backoff_max_s)
    if not seconds or last is None:
        return None
    until = last + timedelta(seconds=seconds)
    if until <= db.now_utc():
        return None
    return {"failures_in_a_row": failures, "seconds": seconds, "until": until.isoformat()}


def _summary_text(messages: Sequence[BaseMessage]) -> str:
    return next((str(m.content) for m in messages if is_summary(m)), "")


def _undo(rt: Runtime, session_id: str, before: set[Any]) -> None:
    """Take back what a failed run added, so the thread is as it was (a summary the run's
    middleware applied stays: it replaced messages that are gone)."""
    try:
        messages = rt.graph.get_state(thread_config(session_id)).values.get("messages", [])
        added = [m.id for m in messages if m.id not in before and not is_summary(m)]
        if added:
            rt.patch(session_id, {"messages": [RemoveMessage(id=str(i)) for i in added]})
    except Exception as exc:
        log.error("[%s] could not take back the failed turn (%s): %s", tag(session_id), added, exc)


app = create_app()
