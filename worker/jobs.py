"""One compaction job, from the thread's checkpoint to the patched checkpoint and the usage row.

1. A job already finished (a redelivery, a duplicate publish) returns at once.
2. Read the thread; a summary written by this very job means a previous delivery
   patched and died before its usage row: record the row now, done.
3. Plan (a skip ends the job ``skipped``, with the reason).
4. Summarize, with no lock held (the LLM call is the slow part).
5. Take the thread's lock, re-read the thread, check the plan against it
   (ids already gone are dropped; a stale plan is re-planned once, then the job
   ends ``skipped``), patch through the shared graph, record the usage event
   (unique job id) and mark the job ``applied``, release.

Transient failures raise :class:`RetryLater`; the Celery task retries them with
backoff and marks the job ``failed`` when retries run out. The thread is only
ever written in step 5, in one ``update_state`` call, so a failure anywhere
leaves it exactly as it was.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

import psycopg
import sqlalchemy.exc
from celery.exceptions import SoftTimeLimitExceeded
from langchain_core.messages import BaseMessage
from langgraph.graph.message import add_messages
from redis.exceptions import RedisError

from compaction.accounting import message_chars
from compaction.pairing import new_unpaired
from compaction.patch import Stale, build_patch, reconcile, summary_message
from compaction.planner import Skip, plan_compaction
from compaction.prompt import build_prompt
from compaction.summarizers import Summarizer, SummarizerError
from compaction.summary import is_summary, summary_meta
from service.agent import AGENT_NODE, thread_config
from service.db import JobStatus, UsageEvent, record_compaction, set_job, start_job
from service.locks import LockUnavailable
from service.runtime import Runtime
from worker.faults import failpoint

log = logging.getLogger("offpath.summarizer")

#: Errors of our stores that may pass: retried like an LLM timeout.
TRANSIENT_STORE_ERRORS: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    sqlite3.OperationalError,
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    RedisError,
    LockUnavailable,
    SoftTimeLimitExceeded,
)


class RetryLater(Exception):
    """A transient failure: run the job again later (after ``retry_after_s`` if given)."""

    def __init__(self, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


def run_job(rt: Runtime, summarizer: Summarizer, session_id: str, job_id: str) -> JobStatus:
    """Run compaction job ``job_id`` on thread ``session_id``; return how it ended.

    Raises :class:`RetryLater` for failures worth retrying; everything else ends
    the job with a final status recorded in ``compaction_jobs``.
    """
    sid = session_id[:8]
    try:
        if (done := start_job(rt.engine, job_id, session_id)) is not None:
            log.info("[%s] summarizer: job %s already %s, nothing to do", sid, job_id, done)
            return done
        return _compact(rt, summarizer, session_id, job_id)
    except SummarizerError as exc:
        if exc.transient:
            raise RetryLater(str(exc), exc.retry_after_s) from exc
        return fail(rt, session_id, job_id, str(exc))
    except TRANSIENT_STORE_ERRORS as exc:
        raise RetryLater(f"{type(exc).__name__}: {exc}") from exc


def fail(rt: Runtime, session_id: str, job_id: str, reason: str) -> JobStatus:
    """End the job ``failed`` with ``reason``; the thread was not touched."""
    log.warning("[%s] summarizer failed: %s; session continues unchanged", session_id[:8], reason)
    set_job(rt.engine, job_id, session_id, JobStatus.FAILED, reason)
    release_claim(rt, session_id, job_id)
    return JobStatus.FAILED


def _skip(rt: Runtime, session_id: str, job_id: str, reason: str) -> JobStatus:
    log.info("[%s] summarizer skipped: %s", session_id[:8], reason)
    set_job(rt.engine, job_id, session_id, JobStatus.SKIPPED, reason)
    release_claim(rt, session_id, job_id)
    return JobStatus.SKIPPED


def release_claim(rt: Runtime, session_id: str, job_id: str) -> None:
    """Let the next turn queue a job. Done after the job's final status is written; a turn
    that comes in between takes the claim over (the hook sees the job has ended)."""
    try:
        rt.locks.release_job(session_id, job_id)
    except Exception as exc:  # the claim expires on its own
        log.warning("[%s] could not release the job claim: %s", session_id[:8], exc)


def _messages(rt: Runtime, session_id: str) -> list[BaseMessage]:
    return list(rt.graph.get_state(thread_config(session_id)).values.get("messages", []))


def _compact(rt: Runtime, summarizer: Summarizer, session_id: str, job_id: str) -> JobStatus:
    sid = session_id[:8]
    settings = rt.settings
    for _ in range(2):  # a stale plan is re-planned once
        messages = _messages(rt, session_id)
        if (done := _summary_of_job(messages, job_id)) is not None:
            log.info("[%s] summarizer: job %s had patched already; recording it", sid, job_id)
            _record(rt, session_id, job_id, summary_meta(done))
            release_claim(rt, session_id, job_id)
            return JobStatus.APPLIED
        plan = plan_compaction(messages, settings)
        if isinstance(plan, Skip):
            return _skip(rt, session_id, job_id, f"{plan.reason}: {plan.detail}")
        log.info(
            "[%s] summarizer: session=%d chars, removing %d msgs (%d chars), keeping %d msgs",
            sid,
            plan.total_chars,
            len(plan.removed),
            plan.removed_chars,
            len(plan.kept),
        )
        started = time.monotonic()
        result = summarizer.summarize(
            plan, build_prompt(plan, settings.summarization_max_prompt_chars)
        )
        latency_ms = int((time.monotonic() - started) * 1000)
        failpoint("before_lock")

        with rt.locks.patch(session_id):
            failpoint("in_patch")
            current = _messages(rt, session_id)
            fitted = reconcile(plan, current)
            if isinstance(fitted, Stale):
                log.info("[%s] summarizer: plan is stale (%s); re-planning", sid, fitted.reason)
                continue
            meta = {
                "job_id": job_id,
                "model": result.model,
                "input_tokens": result.input_tokens,
                "output_tokens": result.output_tokens,
                "latency_ms": latency_ms,
                "tool_calls_removed": sum(
                    len(getattr(m, "tool_calls", None) or []) for m in fitted.removed
                ),
            }
            summary = summary_message(fitted, result.text, summarizer.name, meta)
            patch = build_patch(fitted, summary)
            if broken := new_unpaired(current, add_messages(current, patch)):
                return fail(
                    rt, session_id, job_id, f"patch would orphan tool calls {sorted(broken)}"
                )
            rt.graph.update_state(
                thread_config(session_id), {"messages": patch}, as_node=AGENT_NODE
            )
            failpoint("after_patch")
            # the claim stays until the usage row is written: no other job can fold this
            # summary away before a redelivery of this one has recorded it
            _record(rt, session_id, job_id, summary_meta(summary))
            release_claim(rt, session_id, job_id)
        log.info(
            "[%s] summarizer done: -%d chars, summary %d chars, %dms",
            sid,
            fitted.removed_chars,
            message_chars(summary),
            latency_ms,
        )
        return JobStatus.APPLIED
    return _skip(rt, session_id, job_id, "stale: the thread changed under the plan twice")


def _summary_of_job(messages: Sequence[BaseMessage], job_id: str) -> BaseMessage | None:
    for m in messages:
        if is_summary(m) and summary_meta(m).get("job_id") == job_id:
            return m
    return None


def _record(rt: Runtime, session_id: str, job_id: str, meta: Any) -> None:
    """The usage event of an applied compaction (once per job id), and the job ``applied``."""
    event = UsageEvent(
        job_id=job_id,
        session_id=session_id,
        model=str(meta.get("model") or "unknown"),
        input_tokens=int(meta.get("input_tokens") or 0),
        output_tokens=int(meta.get("output_tokens") or 0),
        latency_ms=int(meta.get("latency_ms") or 0),
        tool_call_count=0,
        metadata_={
            "summarization": True,
            "messages_removed": int(meta.get("replaced_count") or 0),
            "chars_removed": int(meta.get("replaced_chars") or 0),
            "tool_calls_removed": int(meta.get("tool_calls_removed") or 0),
            "summarizer": meta.get("summarizer"),
        },
    )
    if not record_compaction(rt.engine, job_id, event):
        log.info("[%s] summarizer: usage event for job %s exists already", session_id[:8], job_id)
