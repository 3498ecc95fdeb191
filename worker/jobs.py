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
3. Summarizes, with no lock held (the LLM call is the slow part). The prepared compaction
   (:class:`~offpath.compaction.patch.Prepared`) and the summarizer's usage are stored with
   the transition that ends the run: ``prepared``, ``applied`` (with the record, before the
   patch) or its ending.
4. Applies it now if it may (:meth:`offpath.coordination.jobs.Jobs.apply` with a
   :class:`~offpath.coordination.writers.CheckpointWriter`): the thread is one
   of offpath's own (``patch``), no agent run holds it, and it is over its
   threshold. Under the thread's lock it checks the lease, re-reads the thread if it changed,
   fits the compaction to it (a stale one is re-planned once, then the job ends
   ``skipped: stale``), stores its record, patches and records the usage event.
   Otherwise the job ends ``prepared``, and the compaction is applied by whoever
   holds the thread when it is over its threshold: the post-turn hook, or the
   middleware at the run's next model call.

Transient failures raise :class:`RetryLater`; the Celery task retries them with backoff
and marks the job ``failed`` when retries run out. The thread is only ever written in
step 4, in one update, so a failure anywhere leaves it exactly as it was.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import psycopg
import sqlalchemy.exc
from celery.exceptions import SoftTimeLimitExceeded
from langchain_core.messages import BaseMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from redis.exceptions import RedisError

from offpath import metrics
from offpath.compaction.accounting import message_chars, total_chars
from offpath.compaction.facts.extraction import found_here, unchanged_messages
from offpath.compaction.loss import lost_again
from offpath.compaction.patch import Fitted, Stale, landed, patched
from offpath.compaction.pipeline import prepare
from offpath.compaction.planner import CompactionPlan, Skip, plan_compaction
from offpath.compaction.shorten import digests_kept, originals_of
from offpath.compaction.summarizers.base import Summarizer, SummarizerError
from offpath.compaction.summary import is_summary, summary_meta
from offpath.compaction.tokens import DEFAULT_ENCODING, encoder, for_thread, measured_ratio
from offpath.coordination.faults import failpoint
from offpath.coordination.jobs import UNSTORABLE, JobEnded, JobOptions, Landed, head_mark
from offpath.coordination.locks import LockUnavailable, RunInProgress
from offpath.coordination.logs import tag
from offpath.coordination.outages import database_unavailable
from offpath.coordination.runtime import Runtime
from offpath.coordination.writers import CheckpointWriter
from offpath.stores.checkpoints import Thread, read_thread
from offpath.stores.db.job_queries import job_row, lost_of
from offpath.stores.db.tables import FINAL_VALUES, JobStatus
from offpath.stores.leases.claims import Held
from offpath.stores.values import Unstorable

log = logging.getLogger("offpath.summarizer")

#: How long (s) a job planned on the checkpoint (offpath's own threads; a job published again,
#: or whose run's messages could not be sent with it: a middleware's job plans on those)
#: waits for the run's checkpoint to catch up with what the run had seen
#: (:func:`read_caught_up`; no wait once it has). A plan on a
#: lagging read is wasted (the thread found under its threshold, or stale at the swap), so
#: waiting costs nothing the job would otherwise deliver; a loaded host stalls a run's
#: checkpoint writes for seconds at once. A job whose run never writes the message (it
#: failed after queueing) costs one worker thread this long, once.
CHECKPOINT_LAG_S = 15.0

#: The worker's collector thresholds once its runtime is open (:func:`settle_heap`): a
#: full collection walks the process's caches (the facts of recent messages, compiled
#: statements: ~50 ms); at CPython's default (700, 10, 10) one came every ~15 jobs, ~3.4 ms
#: of a job's ~5 ms of collector CPU. The young and middle generations keep CPython's
#: thresholds (what a job frees is freed as soon as before); a full collection comes after
#: 100 middle ones, not 10.
JOB_GC_THRESHOLDS = (700, 10, 100)


def load_job_path() -> None:
    """Load what every job reads a thread with, before the first job rather than inside it:
    the token encoder of :data:`~offpath.compaction.tokens.DEFAULT_ENCODING` (its
    vocabulary: ~0.5 s of CPU holding the GIL, ~64 MiB, once per process). Loaded inside a
    job it held back this process's lease renewals (every third of ``JOB_LEASE_S``, on
    another thread) and the first compaction's end."""
    encoder(DEFAULT_ENCODING)


def settle_heap() -> None:
    """What start-up made (modules, LangChain's classes, the runtime) lives as long as the
    process: out of the collector's generations (a job's collections no longer walk it), and
    the full collections spaced as :data:`JOB_GC_THRESHOLDS` says."""
    gc.freeze()
    gc.set_threshold(*JOB_GC_THRESHOLDS)


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


def transient_store_error(exc: BaseException) -> bool:
    """``exc`` is a store's that may pass (the job is run again later, like an LLM timeout):
    one of :data:`TRANSIENT_STORE_ERRORS`, or a database that did not answer whatever the
    error's class (:func:`~offpath.coordination.outages.database_unavailable`)."""
    return isinstance(exc, TRANSIENT_STORE_ERRORS) or database_unavailable(exc)


class RetryLater(Exception):
    """A transient failure: run the job again later (after ``retry_after_s`` if given)."""

    def __init__(self, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a job ended (recorded, and the thread handed on, by
    :class:`~offpath.coordination.jobs.Jobs` already).

    ``follow_up_chars``: the thread is still over its threshold after this compaction
    and a next one is worth it (queue a job once this one handed the thread on).
    """

    status: JobStatus
    follow_up_chars: int | None = None


def run_job(
    rt: Runtime,
    summarizer: Summarizer,
    session_id: str,
    job_id: str,
    lease: Held,
    stored: Mapping[str, Any] | None = None,
    options: JobOptions | None = None,
    others: bool = True,
) -> Outcome:
    """Run compaction job ``job_id`` on thread ``session_id`` under ``lease``; return how it
    ended (recorded in ``compaction_jobs``, the thread handed on from ``lease``).

    ``stored`` is the result a previous delivery of this job stored before it died;
    ``others``: whether the thread had other open jobs when this one started
    (:attr:`~offpath.coordination.jobs.Started.others`; they are dead and end here).
    Raises :class:`RetryLater` for failures worth retrying.
    """
    try:
        # the job changes no message in place: each is keyed for its facts and digested once
        with unchanged_messages(), digests_kept():
            return _compact(
                rt, summarizer, session_id, job_id, lease, stored, options or JobOptions(), others
            )
    except SummarizerError as exc:
        if exc.transient:
            raise RetryLater(str(exc), exc.retry_after_s) from exc
        ended = JobEnded(JobStatus.FAILED, exc.code, str(exc))
        return end(rt, session_id, job_id, ended, lease)
    except JobEnded as exc:
        return end(rt, session_id, job_id, exc, lease)
    except Unstorable as exc:  # the summary quoted a value the database refused: named
        ended = JobEnded(JobStatus.FAILED, UNSTORABLE, f"not stored: {exc}")
        return end(rt, session_id, job_id, ended, lease)
    except Exception as exc:
        if isinstance(exc, RetryLater) or not transient_store_error(exc):
            raise
        # the row says what failed; the error's text (SQL, hosts) goes to the log only
        log.warning("[%s] summarizer: store error: %s", tag(session_id), exc)
        raise RetryLater(f"store error ({type(exc).__name__})") from exc


def end(
    rt: Runtime, session_id: str, job_id: str, ended: JobEnded, lease: Held | None = None
) -> Outcome:
    """Record how the job ended (the thread was not touched) and hand the thread on from
    ``lease`` (None: another job holds it); a planner skip leaves ``s:<job>:<chars>:<at>`` on
    the thread, so that it is not asked again before it reached the size from which a
    compaction is worth it, a failure the failure backoff."""
    _log_ended(session_id, ended)
    rt.jobs.end(session_id, job_id, ended, lease)
    return Outcome(ended.status)


def _log_ended(session_id: str, ended: JobEnded) -> None:
    if ended.status is JobStatus.FAILED:
        log.warning(
            "[%s] summarizer failed: %s; session continues unchanged", tag(session_id), ended.reason
        )
    else:
        log.info("[%s] summarizer skipped: %s", tag(session_id), ended.reason)


def record_landed(
    rt: Runtime,
    session_id: str,
    job_id: str,
    messages: Sequence[BaseMessage],
    stored: Mapping[str, Any] | None,
    lease: Held | None = None,
) -> bool:
    """Record compactions whose patch is in ``messages`` but whose usage row was never written.
    Returns True if this job's own (from ``stored``) is one of them (then the thread is
    handed on from ``lease``)."""
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
            own = owner == job_id
            rt.jobs.record(session_id, str(owner), holding=lease if own else None)
            mine = mine or own
    return mine


def _compact(
    rt: Runtime,
    summarizer: Summarizer,
    session_id: str,
    job_id: str,
    lease: Held,
    stored: Mapping[str, Any] | None,
    options: JobOptions,
    others: bool = True,
) -> Outcome:
    sid = tag(session_id)
    settings = rt.settings
    jobs = rt.jobs
    checkpoints = rt.checkpoints_for(options.checkpoints)
    saver = checkpoints.saver
    ns, thread_id = options.checkpoint_ns, options.thread_of(session_id)
    bought: dict[str, Any] | None = None  # what this run's summarizer made, not stored yet
    for attempt in range(2):  # a stale compaction is re-planned once
        if attempt == 0 and options.messages is not None and not options.patch:
            thread = Thread(list(options.messages))  # the run's, as its middleware queued it
            source = "the run's messages as it queued the job"
        else:
            thread = (
                read_caught_up(saver, thread_id, options.seen, CHECKPOINT_LAG_S, ns, options.head)
                if attempt == 0
                else read_thread(saver, thread_id, ns)
            )
            source = f"checkpoint {thread.checkpoint_id}"
        messages = thread.messages
        # the thread's chars per token, as the agent's middleware measured it or counted here
        # (o200k_base, each message's tokens as stored with its facts where it arrived, read
        # in one round trip with them, or counted now); with the threshold in tokens its
        # sizes scale by it (compaction.tokens)
        stored_facts = None if options.chars_per_token else rt.facts.thread(messages)
        ratio = options.chars_per_token or measured_ratio(
            messages, counted=stored_facts.tokens() if stored_facts else None
        )
        settings = for_thread(rt.settings, ratio)
        if record_landed(rt, session_id, job_id, messages, stored, lease):
            return Outcome(JobStatus.APPLIED)
        if attempt == 0 and others and (n := jobs.supersede_others(session_id, job_id)):
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
                result=bought,
            )
        log.info(
            "[%s] summarizer: session=%d chars, removing %d msgs (%d chars), keeping %d msgs",
            sid,
            plan.total_chars,
            len(plan.removed),
            plan.removed_chars,
            len(plan.kept),
        )
        read = with_originals(rt, session_id, plan)  # the summarizer reads what was shortened
        read = with_lost(rt, session_id, read)  # and the guard what earlier ones lost
        # the removed messages' facts as found on arrival (by the middleware or the post-turn
        # hook), the originals of those shortened too: the guard reads those; and those of the
        # kept results the plan shortens, whose notes list the facts of the part cut
        cut = dict(plan.shorten)
        read_facts = rt.facts.preload(
            [*plan.removed, *read.removed, *(m for m in plan.kept if m.id in cut)], stored_facts
        )
        found = found_here()
        done = prepare(plan, settings, summarizer, job_id=job_id, read=read)
        result, latency_ms = done.result, done.latency_ms
        metrics.summarized(summarizer.name, latency_ms, result.input_tokens, result.output_tokens)
        usage = {
            "input_tokens": result.input_tokens,
            "output_tokens": result.output_tokens,
            "latency_ms": latency_ms,
            "chars_per_token": round(ratio, 4) if ratio else None,
            # messages whose facts the job read from the fact store, and found itself
            "facts_read": read_facts,
            "facts_found": found_here() - found,
        }
        # written with the transition that ends this run (prepared, applied with its record,
        # or ended), in that transition's transaction: a job that dies before it is run again
        # (it plans on the thread as it is then)
        # what it planned on, named in the line that says it stale if it is found so
        stored = bought = {
            "prepared": done.prepared.to_json(),
            "usage": usage,
            "planned_on": source,
        }
        failpoint("before_lock")
        if not options.patch:  # a user's own agent: its middleware applies it
            why = "the agent's middleware applies it"
            return _prepared(rt, session_id, job_id, lease, stored, why)
        try:
            with rt.locks.patch(session_id):
                failpoint("in_patch")
                if lease.lost.is_set():
                    why = "lease lost before the patch; not applied"
                    raise JobEnded(JobStatus.FAILED, "lease_lost", why, result=bought)
                # read again only if the thread moved on since it was planned
                if checkpoints.changed_since(session_id, thread.checkpoint_id):
                    thread = read_thread(saver, session_id)
                current = thread.messages
                over = total_chars(current) > settings.summarization_threshold_chars
                if not (over or options.force):
                    # prepared ahead: applied once the thread crosses (the hook sees it)
                    return _prepared(rt, session_id, job_id, lease, stored, "under the threshold")
                fitted = jobs.apply(
                    CheckpointWriter(rt, thread.base),
                    session_id,
                    job_id,
                    stored,
                    current,
                    force=options.force,
                    outside=options.outside,
                    settings=rt.settings,
                    lease=lease,
                    replan=True,
                    unsaved=True,
                )
        except RunInProgress:
            return _prepared(rt, session_id, job_id, lease, stored, "a run holds the thread")
        if isinstance(fitted, Stale):
            log.info("[%s] summarizer: plan is stale (%s); re-planning", sid, fitted.reason)
            continue
        if isinstance(fitted, JobEnded):  # ended, and the thread handed on
            _log_ended(session_id, fitted)
            return Outcome(fitted.status)
        if isinstance(fitted, Landed):  # landed already
            return Outcome(JobStatus.APPLIED)
        assert isinstance(fitted, Fitted)
        log.info(
            "[%s] summarizer done: -%d chars, summary %d chars, %dms",
            sid,
            fitted.record["chars_removed"],
            message_chars(fitted.summary),
            latency_ms,
        )
        after = patched(current, fitted.patch)
        return Outcome(JobStatus.APPLIED, follow_up(after, settings, options.outside))
    why = "stale: the thread changed under the plan twice"
    raise JobEnded(JobStatus.SKIPPED, "stale", why, result=bought)


def with_originals(rt: Runtime, session_id: str, plan: CompactionPlan) -> CompactionPlan:
    """``plan`` with each removed message that offpath shortened (a tool result, the agent's
    own message, a request's copy) replaced by its archived original (the same digest, given
    its id: :func:`~offpath.compaction.shorten.originals_of`): the summarizer and the fact
    guard read what the agent saw, not the shortened copy. One whose original cannot be read
    stays as it is."""
    originals = originals_of(plan.removed, partial(rt.jobs.originals, session_id))
    if not originals:
        return plan
    removed = tuple(originals.get(str(m.id), m) for m in plan.removed)
    return dataclasses.replace(plan, removed=removed)


def with_lost(rt: Runtime, session_id: str, plan: CompactionPlan) -> CompactionPlan:
    """``plan`` with the facts the thread's earlier compactions took out of view, as their
    loss reports (the job rows) list them: the fact guard pins again what the agent said or
    the user named of them that nothing in view holds. A plan that folds in no earlier
    summary, or whose reports cannot be read, stays as it is."""
    if not plan.earlier_summaries:
        return plan
    try:
        lost = lost_again(lost_of(rt.engine, session_id))
    except Exception as exc:  # the summary is written without them
        log.warning("[%s] earlier compactions' loss reports not read: %s", tag(session_id), exc)
        return plan
    return dataclasses.replace(plan, lost=lost) if lost else plan


def _prepared(
    rt: Runtime, session_id: str, job_id: str, lease: Held, stored: dict[str, Any], why: str
) -> Outcome:
    """End the run of the job with its compaction prepared, the thread handed on to ``p:<job>``
    at once, once (still under the thread's lock when there is one: a turn that crosses the
    threshold next finds it prepared)."""
    return Outcome(rt.jobs.prepare(session_id, job_id, stored, lease, why))


def read_caught_up(
    saver: BaseCheckpointSaver,
    session_id: str,
    seen: str | None,
    wait_s: float,
    ns: str | None = None,
    head: str | None = None,
) -> Thread:
    """The thread once its checkpoint holds message ``seen`` (the newest one when the job was
    queued) and, when ``head`` is given, starts with that message (:func:`head_mark`: the
    summary of an apply made in the run), re-read every 0.1 s (backing off to 0.5 s) for up
    to ``wait_s`` seconds; after that, what the checkpoint holds (logged). A run's checkpoints
    are written in the background (LangGraph's default durability), so a job queued from
    inside a run can find them steps behind: planning on them wastes a summary (found stale)
    or skips a thread that is over."""
    deadline = time.monotonic() + wait_s
    pause = 0.1
    while True:
        thread = read_thread(saver, session_id, ns)
        held = not seen or any(m.id == seen for m in reversed(thread.messages))
        if held and (not head or head_mark(thread.messages) == head):
            return thread
        if time.monotonic() >= deadline:
            log.info(
                "[%s] checkpoint still without message %s (head %s; it holds %s, %s) after "
                "%.1f s: planning on what it holds",
                tag(session_id),
                seen,
                head,
                "it" if held else "not it",
                head_mark(thread.messages),
                wait_s,
            )
            return thread
        time.sleep(pause)
        pause = min(0.5, pause * 1.5)


def follow_up(messages: Sequence[BaseMessage], settings: Any, outside: int = 0) -> int | None:
    """The size of ``messages`` (a thread just compacted; ``outside``: what each model call
    sends besides it, chars) if it is still over its threshold and a next compaction is worth
    it: turns that came while this job ran found it in flight and queued nothing, and no turn
    may come now."""
    if total_chars(messages) + outside <= settings.summarization_threshold_chars:
        return None
    plan = plan_compaction(messages, settings, outside_chars=outside)
    return None if isinstance(plan, Skip) else plan.total_chars
