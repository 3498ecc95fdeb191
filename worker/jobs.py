"""One compaction job, from the thread's checkpoint to the patched checkpoint and the usage row.

The Celery task (:mod:`worker.tasks`) first marks the job ``running`` and takes the
running lease on the thread (:mod:`service.leases`); then :func:`run_job`:

1. Reads the thread. A summary in it whose compaction was never recorded (a
   worker died between the patch and the usage row) is recorded now, if the job
   that wrote it stored a matching result: offpath's own records decide, never the
   message's metadata (DESIGN.md invariant 10). If it is this very job's summary,
   the job is done. The thread's other open jobs are dead (this job holds the
   lease): they are ended.
2. Plans (a skip ends the job ``skipped``, with the reason).
3. Summarizes, with no lock held (the LLM call is the slow part).
4. Takes the thread's lock, checks it still holds its lease, re-reads the thread
   and checks the plan against it (ids already gone are dropped; a stale plan is
   re-planned once, then the job ends ``skipped: stale``), stores its result (what
   it is about to patch in), patches through the shared graph, records the usage
   event from the stored result and marks the job ``applied``, releases the lock.

Transient failures raise :class:`RetryLater`; the Celery task retries them with
backoff and marks the job ``failed`` when retries run out. The thread is only
ever written in step 4, in one ``update_state`` call, so a failure anywhere
leaves it exactly as it was.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import sqlalchemy.exc
from celery.exceptions import SoftTimeLimitExceeded
from langchain_core.messages import BaseMessage
from langgraph.graph.message import add_messages
from offpath.worker.faults import failpoint
from redis.exceptions import RedisError

from offpath.compaction.accounting import message_chars, total_chars
from offpath.compaction.pairing import new_unpaired
from offpath.compaction.patch import Prepared, Stale, fit, landed
from offpath.compaction.planner import Skip, plan_compaction
from offpath.compaction.prompt import build_prompt
from offpath.compaction.summarizers import Summarizer, SummarizerError
from offpath.compaction.summary import is_summary, summary_meta
from offpath.service.agent import AGENT_NODE, thread_config
from offpath.service.db import (
    FINAL_VALUES,
    JobStatus,
    end_others,
    finalize,
    job_row,
    set_job,
    store_result,
)
from offpath.service.leases import Held
from offpath.service.locks import LockUnavailable
from offpath.service.logs import tag
from offpath.service.runtime import Runtime

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


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a job ended; ``follow_up_chars``: the thread is still over its threshold after this
    compaction and a next one is worth it (queue a job once this one handed the thread on)."""

    status: JobStatus
    follow_up_chars: int | None = None


class JobEnded(Exception):
    """The job ended ``failed`` or ``skipped`` with ``code`` and ``reason`` (recorded by the
    caller)."""

    def __init__(self, status: JobStatus, code: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.code = code
        self.reason = reason


def run_job(
    rt: Runtime,
    summarizer: Summarizer,
    session_id: str,
    job_id: str,
    lease: Held,
    stored: Mapping[str, Any] | None = None,
) -> Outcome:
    """Run compaction job ``job_id`` on thread ``session_id`` under ``lease``; return how it
    ended (``applied``, ``skipped`` or ``failed``, recorded in ``compaction_jobs``).

    ``stored`` is the result a previous delivery of this job recorded before it died.
    Raises :class:`RetryLater` for failures worth retrying.
    """
    try:
        return _compact(rt, summarizer, session_id, job_id, lease, stored)
    except SummarizerError as exc:
        if exc.transient:
            raise RetryLater(str(exc), exc.retry_after_s) from exc
        return Outcome(end(rt, session_id, job_id, JobEnded(JobStatus.FAILED, exc.code, str(exc))))
    except JobEnded as exc:
        return Outcome(end(rt, session_id, job_id, exc))
    except TRANSIENT_STORE_ERRORS as exc:
        raise RetryLater(f"{type(exc).__name__}: {exc}") from exc


def end(rt: Runtime, session_id: str, job_id: str, ended: JobEnded) -> JobStatus:
    """Record how the job ended (the thread was not touched)."""
    if ended.status is JobStatus.FAILED:
        log.warning(
            "[%s] summarizer failed: %s; session continues unchanged", tag(session_id), ended.reason
        )
    else:
        log.info("[%s] summarizer skipped: %s", tag(session_id), ended.reason)
    set_job(rt.engine, job_id, session_id, ended.status, ended.reason, ended.code)
    return ended.status


def _messages(rt: Runtime, session_id: str) -> list[BaseMessage]:
    return list(rt.graph.get_state(thread_config(session_id)).values.get("messages", []))


def record_landed(
    rt: Runtime,
    session_id: str,
    job_id: str,
    messages: Sequence[BaseMessage],
    stored: Mapping[str, Any] | None,
) -> bool:
    """Record compactions whose patch is in ``messages`` but whose usage row was never written.
    Returns True if this job's own (from ``stored``) is one of them."""
    mine = False
    for m in messages:
        if not is_summary(m) or not (owner := summary_meta(m).get("job_id")):
            continue
        if owner == job_id:
            result = stored
        else:
            row = job_row(rt.engine, str(owner))
            if row is None or row["status"] in FINAL_VALUES or row["session_id"] != session_id:
                continue  # recorded already, or not one of ours: never trusted
            result = row["result"]
        if landed(messages, str(owner), result):
            log.info(
                "[%s] summarizer: job %s had patched but not recorded; recording it",
                tag(session_id),
                owner,
            )
            finalize(rt.engine, str(owner), session_id)
            mine = mine or owner == job_id
    return mine


def _compact(
    rt: Runtime,
    summarizer: Summarizer,
    session_id: str,
    job_id: str,
    lease: Held,
    stored: Mapping[str, Any] | None,
) -> Outcome:
    sid = tag(session_id)
    settings = rt.settings
    for attempt in range(2):  # a stale plan is re-planned once
        messages = _messages(rt, session_id)
        if record_landed(rt, session_id, job_id, messages, stored):
            return Outcome(JobStatus.APPLIED)
        if attempt == 0 and (n := end_others(rt.engine, session_id, job_id)):
            log.info("[%s] summarizer: ended %d dead job(s) of this thread", sid, n)
        plan = plan_compaction(messages, settings)
        if isinstance(plan, Skip):
            raise JobEnded(JobStatus.SKIPPED, plan.reason.value, f"{plan.reason}: {plan.detail}")
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
            if lease.lost.is_set():
                raise JobEnded(
                    JobStatus.FAILED, "lease_lost", "lease lost before the patch; not applied"
                )
            current = _messages(rt, session_id)
            prepared = Prepared.from_plan(
                plan,
                job_id=job_id,
                summary_text=result.text,
                summarizer=summarizer.name,
                model=result.model,
            )
            fitted = fit(prepared, current)
            if isinstance(fitted, Stale):
                log.info("[%s] summarizer: plan is stale (%s); re-planning", sid, fitted.reason)
                continue
            summary, patch = fitted.summary, fitted.patch
            after = add_messages(current, patch)
            if broken := new_unpaired(current, after):
                raise JobEnded(
                    JobStatus.FAILED,
                    "orphan_guard",
                    f"patch would orphan tool calls {sorted(broken)}",
                )
            # offpath's own record of what it patches in, written before the patch
            record = {
                **fitted.record,
                "input_tokens": result.input_tokens,
                "output_tokens": result.output_tokens,
                "latency_ms": latency_ms,
            }
            store_result(rt.engine, job_id, record)
            rt.graph.update_state(
                thread_config(session_id), {"messages": patch}, as_node=AGENT_NODE
            )
            failpoint("after_patch")
            finalize(rt.engine, job_id, session_id)
        log.info(
            "[%s] summarizer done: -%d chars, summary %d chars, %dms",
            sid,
            fitted.record["chars_removed"],
            message_chars(summary),
            latency_ms,
        )
        return Outcome(JobStatus.APPLIED, follow_up(after, settings))
    raise JobEnded(JobStatus.SKIPPED, "stale", "stale: the thread changed under the plan twice")


def follow_up(messages: Sequence[BaseMessage], settings: Any) -> int | None:
    """The size of ``messages`` (a thread just compacted) if it is still over its threshold
    and a next compaction is worth it: turns that came while this job ran found it in flight
    and queued nothing, and no turn may come now."""
    if total_chars(messages) <= settings.summarization_threshold_chars:
        return None
    plan = plan_compaction(messages, settings)
    return None if isinstance(plan, Skip) else plan.total_chars
