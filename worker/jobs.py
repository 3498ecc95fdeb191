"""One compaction job: plan and summarize (prepare), then apply if the thread allows it now.

The Celery task (:mod:`offpath.worker.tasks`) marks the job ``running`` and takes the
running lease on the thread (:mod:`offpath.stores.leases`); then :func:`run_job`:

1. Reads the thread from its checkpointer (one read; a user's own agent's by URL).
   Under the lock (step 4) it is read again only if its checkpoint changed meanwhile
   (one look-up of the latest checkpoint id), and the patch starts from that read.
   A summary in it whose compaction was never recorded (a worker died between
   the patch and the usage row) is recorded now, if the job that wrote it stored
   a matching record: offpath's own records decide, never the message's metadata
   (DESIGN.md invariant 10). If it is this very job's summary, the job is done.
   The thread's other open jobs are dead (this job holds the lease): they end.
2. Plans, from ``SUMMARIZATION_PREPARE_AT`` x the threshold (a skip ends the job
   ``skipped``, with the reason).
3. Summarizes, with no lock held (the LLM call is the slow part), and stores the
   prepared compaction (:class:`~offpath.compaction.patch.Prepared`).
4. Applies it now if it may (:mod:`offpath.coordination.compactions`): the thread is one
   of offpath's own (``patch``), no agent run holds it, and it is over its
   threshold. Under the thread's lock it checks the lease, re-reads the thread if it changed,
   fits the compaction to it (a stale one is re-planned once, then the job ends
   ``skipped: stale``), stores its record, patches and records the usage event.
   Otherwise the job ends ``prepared``, and the compaction is applied by whoever
   holds the thread when it is over its threshold: the post-turn hook, or the
   middleware at the run's next model call.

Transient failures raise :class:`RetryLater`; the Celery task retries them with
backoff and marks the job ``failed`` when retries run out. The thread is only
ever written in step 4, in one update, so a failure anywhere leaves it exactly as
it was.
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import sqlalchemy.exc
from celery.exceptions import SoftTimeLimitExceeded
from langchain_core.messages import BaseMessage, messages_from_dict
from langgraph.graph.message import add_messages
from redis.exceptions import RedisError

from offpath import metrics
from offpath.compaction.accounting import message_chars, total_chars
from offpath.compaction.patch import Prepared, Stale, landed
from offpath.compaction.planner import CompactionPlan, Skip, plan_compaction
from offpath.compaction.prompt import build_prompt
from offpath.compaction.shorten import is_shortened
from offpath.compaction.summarizers import Summarizer, SummarizerError
from offpath.compaction.summary import is_summary, summary_meta
from offpath.compaction.tokens import for_thread, measured_ratio
from offpath.coordination.compactions import (
    UNSTORABLE,
    JobEnded,
    JobOptions,
    apply_locked,
    read_caught_up,
    read_thread,
)
from offpath.coordination.faults import failpoint
from offpath.coordination.locks import LockUnavailable, RunInProgress
from offpath.coordination.logs import tag
from offpath.coordination.runtime import Runtime
from offpath.stores import archive
from offpath.stores.db import (
    FINAL_VALUES,
    JobStatus,
    end_others,
    finalize,
    job_row,
    set_job,
    store_result,
)
from offpath.stores.leases import Held, Leases, State
from offpath.stores.values import Unstorable

log = logging.getLogger("offpath.summarizer")

#: How long (s) a job queued from inside a run waits for the run's checkpoint to catch up
#: with what the run had seen (:func:`read_caught_up`; no wait once it has). Benchmark 17
#: measured reads a median 17k chars (max 59k) behind the run with 1 s under load: the job
#: then planned on a thread under its threshold (100 jobs ``under_threshold``) or on one
#: from before the previous compaction landed (stale). A plan on a lagging read is wasted,
#: so waiting longer costs nothing the job would otherwise deliver; a compaction applied
#: late still covers what came after its plan (``compaction.patch.fit``). 5 s was not enough:
#: on the grid's loaded host every run's checkpoint writes stalled 5 s at once, and four
#: jobs planned on threads from before the last apply (found stale at the swap, the run
#: then 1.6x over its threshold). A job whose run never writes the message (it failed
#: after queueing) costs one worker thread this long, once.
CHECKPOINT_LAG_S = 15.0

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
    """How a job ended, and the claim it leaves on the thread (``then``; None: free).

    ``follow_up_chars``: the thread is still over its threshold after this compaction
    and a next one is worth it (queue a job once this one handed the thread on).
    """

    status: JobStatus
    then: Any = None
    follow_up_chars: int | None = None


def run_job(
    rt: Runtime,
    summarizer: Summarizer,
    session_id: str,
    job_id: str,
    lease: Held,
    stored: Mapping[str, Any] | None = None,
    options: JobOptions | None = None,
) -> Outcome:
    """Run compaction job ``job_id`` on thread ``session_id`` under ``lease``; return how it
    ended (recorded in ``compaction_jobs``).

    ``stored`` is the result a previous delivery of this job stored before it died.
    Raises :class:`RetryLater` for failures worth retrying.
    """
    try:
        return _compact(rt, summarizer, session_id, job_id, lease, stored, options or JobOptions())
    except SummarizerError as exc:
        if exc.transient:
            raise RetryLater(str(exc), exc.retry_after_s) from exc
        return end(rt, session_id, job_id, JobEnded(JobStatus.FAILED, exc.code, str(exc)))
    except JobEnded as exc:
        return end(rt, session_id, job_id, exc)
    except Unstorable as exc:  # the summary quoted a value the database refused: named
        ended = JobEnded(JobStatus.FAILED, UNSTORABLE, f"not stored: {exc}")
        return end(rt, session_id, job_id, ended)
    except TRANSIENT_STORE_ERRORS as exc:
        # the row says what failed; the error's text (SQL, hosts) goes to the log only
        log.warning("[%s] summarizer: store error: %s", tag(session_id), exc)
        raise RetryLater(f"store error ({type(exc).__name__})") from exc


def end(rt: Runtime, session_id: str, job_id: str, ended: JobEnded) -> Outcome:
    """Record how the job ended (the thread was not touched); a planner skip leaves
    ``s:<job>:<chars>:<at>`` on the thread, so that it is not asked again before it reached
    the size from which a compaction is worth it."""
    if ended.status is JobStatus.FAILED:
        log.warning(
            "[%s] summarizer failed: %s; session continues unchanged", tag(session_id), ended.reason
        )
    else:
        log.info("[%s] summarizer skipped: %s", tag(session_id), ended.reason)
    set_job(rt.engine, job_id, session_id, ended.status, ended.reason, ended.code)
    then = (
        Leases.after(job_id, State.SKIPPED, chars=ended.chars, worth_at=ended.worth_at)
        if ended.chars
        else None
    )
    return Outcome(ended.status, then)


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
        if landed(messages, str(owner), (result or {}).get("record")):
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
    options: JobOptions,
) -> Outcome:
    sid = tag(session_id)
    settings = rt.settings
    checkpoints = rt.checkpoints_for(options.checkpoints)
    saver = checkpoints.saver
    ns, thread_id = options.checkpoint_ns, options.thread_of(session_id)
    for attempt in range(2):  # a stale compaction is re-planned once
        if attempt == 0:
            thread = read_caught_up(
                saver, thread_id, options.seen, CHECKPOINT_LAG_S, ns, options.head
            )
        else:
            thread = read_thread(saver, thread_id, ns)
        messages = thread.messages
        # the thread's chars per token, as the agent's middleware measured it or counted here
        # (o200k_base); with the threshold in tokens its sizes scale by it (compaction.tokens)
        ratio = options.chars_per_token or measured_ratio(messages)
        settings = for_thread(rt.settings, ratio)
        if record_landed(rt, session_id, job_id, messages, stored):
            return Outcome(JobStatus.APPLIED, Leases.after(job_id, State.DONE))
        if attempt == 0 and (n := end_others(rt.engine, session_id, job_id)):
            log.info("[%s] summarizer: ended %d dead job(s) of this thread", sid, n)
        plan = plan_compaction(
            messages,
            settings,
            early=True,
            force=options.force,
            floor_chars=options.floor,
            outside_chars=options.outside,
        )
        if isinstance(plan, Skip):
            raise JobEnded(
                JobStatus.SKIPPED,
                plan.reason.value,
                f"{plan.reason}: {plan.detail}",
                plan.total_chars,
                plan.worth_at,
            )
        log.info(
            "[%s] summarizer: session=%d chars, removing %d msgs (%d chars), keeping %d msgs",
            sid,
            plan.total_chars,
            len(plan.removed),
            plan.removed_chars,
            len(plan.kept),
        )
        started = time.monotonic()
        read = with_originals(rt, session_id, plan)  # the summarizer reads what was shortened
        result = summarizer.summarize(
            read, build_prompt(read, settings.summarization_max_prompt_chars)
        )
        latency_ms = int((time.monotonic() - started) * 1000)
        metrics.summarized(summarizer.name, latency_ms, result.input_tokens, result.output_tokens)
        prepared = Prepared.from_plan(
            plan,
            job_id=job_id,
            summary_text=result.text,
            summarizer=summarizer.name,
            model=result.model,
            meta=result.meta,
        )
        usage = {
            "input_tokens": result.input_tokens,
            "output_tokens": result.output_tokens,
            "latency_ms": latency_ms,
            "chars_per_token": round(ratio, 4) if ratio else None,
        }
        stored = {"prepared": prepared.to_json(), "usage": usage}
        store_result(rt.engine, job_id, stored)
        failpoint("before_lock")
        if not options.patch:  # a user's own agent: its middleware applies it
            return _prepared(
                rt, session_id, job_id, lease, stored, "the agent's middleware applies it"
            )
        try:
            with rt.locks.patch(session_id):
                failpoint("in_patch")
                if lease.lost.is_set():
                    raise JobEnded(
                        JobStatus.FAILED, "lease_lost", "lease lost before the patch; not applied"
                    )
                # read again only if the thread moved on since it was planned
                if checkpoints.changed_since(session_id, thread.checkpoint_id):
                    thread = read_thread(saver, session_id)
                current = thread.messages
                over = total_chars(current) > settings.summarization_threshold_chars
                if not (over or options.force):
                    # prepared ahead: applied once the thread crosses (the hook sees it)
                    return _prepared(rt, session_id, job_id, lease, stored, "under the threshold")
                fitted = apply_locked(
                    rt, session_id, job_id, stored, current, thread.base, force=options.force
                )
        except RunInProgress:
            return _prepared(rt, session_id, job_id, lease, stored, "a run holds the thread")
        if isinstance(fitted, Stale):
            log.info("[%s] summarizer: plan is stale (%s); re-planning", sid, fitted.reason)
            continue
        if fitted is None:  # landed already
            return Outcome(JobStatus.APPLIED, Leases.after(job_id, State.DONE))
        log.info(
            "[%s] summarizer done: -%d chars, summary %d chars, %dms",
            sid,
            fitted.record["chars_removed"],
            message_chars(fitted.summary),
            latency_ms,
        )
        after = add_messages(current, fitted.patch)
        return Outcome(
            JobStatus.APPLIED,
            Leases.after(job_id, State.DONE),
            follow_up(after, settings, options.outside),
        )
    raise JobEnded(JobStatus.SKIPPED, "stale", "stale: the thread changed under the plan twice")


def with_originals(rt: Runtime, session_id: str, plan: CompactionPlan) -> CompactionPlan:
    """``plan`` with each removed tool result that offpath shortened replaced by its archived
    original (the same id and digest): the summarizer and the fact guard read what the agent
    saw, not the shortened copy (issue 18). A result whose original cannot be read stays as
    it is."""
    short = [m for m in plan.removed if is_shortened(m)]
    if not short:
        return plan
    originals: dict[str, BaseMessage] = {}
    for m in short:
        try:
            stored = archive.original(rt.engine, session_id, str(m.id))
        except Exception:  # the summary is written from the shortened copy
            stored = None
        if stored is not None:
            (originals[str(m.id)],) = messages_from_dict([stored])
    removed = tuple(originals.get(str(m.id), m) for m in plan.removed)
    return dataclasses.replace(plan, removed=removed)


def _prepared(
    rt: Runtime, session_id: str, job_id: str, lease: Held, stored: dict[str, Any], why: str
) -> Outcome:
    """End the run of the job with its compaction prepared, and hand the thread on to ``p:<job>``
    at once (still under the thread's lock when there is one: a turn that crosses the
    threshold next finds it prepared)."""
    store_result(rt.engine, job_id, stored, JobStatus.PREPARED)
    then = Leases.after(job_id, State.PREPARED)
    rt.leases.finish(session_id, job_id, lease.token, then)
    log.info("[%s] summarizer: compaction prepared (%s)", tag(session_id), why)
    return Outcome(JobStatus.PREPARED, then)


def follow_up(messages: Sequence[BaseMessage], settings: Any, outside: int = 0) -> int | None:
    """The size of ``messages`` (a thread just compacted; ``outside``: what each model call
    sends besides it, chars) if it is still over its threshold and a next compaction is worth
    it: turns that came while this job ran found it in flight and queued nothing, and no turn
    may come now."""
    if total_chars(messages) + outside <= settings.summarization_threshold_chars:
        return None
    plan = plan_compaction(messages, settings, outside_chars=outside)
    return None if isinstance(plan, Skip) else plan.total_chars
