"""The reconciler: ends or re-publishes jobs whose lease has lapsed, and queues jobs for
threads left over the threshold with none (DESIGN.md invariant 11).

Celery beat (``offpath beat``) sends the ``reconcile`` task every
``RECONCILE_INTERVAL_S``; one pass (:func:`reconcile_once`) runs at a time across
all workers (a lease on the claim store). Per open job row that has not moved for
an interval:

* prepared, and applied by a run of a user's own agent (its record stored) that ended
  before a step could record it: if its summary is in the thread, record it (the job
  ends applied, its archived originals show); else it waits for its thread to cross the
  threshold, for at most ``PREPARED_JOB_TTL_S`` since it was prepared (its row's last
  change; :func:`prepared_expired`). Past that, or once its claim is gone, it ends
  ``skipped`` with the reason code ``expired`` (:func:`expiry_reason` says why), its
  claim is freed, and its thread is left exactly as it is: the next run over the prepare
  point queues a fresh job;
* not published (the broker was down): claim the thread for it and publish it;
* running, and requeued for a retry that has not started within ``JOB_RETRY_BACKOFF_MAX_S +
  JOB_LEASE_S`` (:func:`retry_overdue`; the retry's delivery failed before it started, or
  the worker holding it until its countdown died): re-publish it on the claim it holds;
* queued, published, and its message taken by a consumer that no longer runs (it sits
  unacknowledged in the Redis broker, which gives it back only after the visibility
  timeout, and no live worker answers for it: :func:`lost_messages`): remove that message
  and publish the job again, on the claim it holds. A duplicate delivery (a live worker
  that answered too late) finds the job running or ended and does nothing;
* queued, published, holding its claim, and its message in no queue and taken by no
  consumer on two passes in a row (a delivery that ended before the job started, as Celery
  acks a task that raised: :func:`gone_messages`): publish it again on the claim it holds;
* its lease is alive (queued or running): nothing to do;
* lapsed (its worker died, or the broker lost it): if its summary is in the thread,
  record it (the patch landed, the usage row did not); else end it when another job
  holds the thread, the thread is in its failure backoff, or it was delivered more
  than ``JOB_MAX_RETRIES + 1`` times; else claim the thread for it and re-publish it.

An applied job whose loss report is still pending (``LOSS_PENDING``: applied in a run whose
process ended just after the swap, before it made the report) gets its report made from its
archived originals, its summary and the thread as it is now (:func:`_report_loss`).

Then every thread whose latest job failed (or was skipped as stale) and whose
claim is free, the failure backoff being over, gets a new job. At most once every
:data:`PURGE_EVERY_S`, archived originals older than ``ARCHIVE_RETENTION_DAYS`` are
deleted.

What it did is logged in one line and counted in ``offpath_reconciler_actions_total``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from langchain_core.messages import BaseMessage, messages_from_dict

from offpath.compaction.accounting import content_text
from offpath.compaction.loss import loss_report
from offpath.compaction.patch import landed
from offpath.compaction.settings import Settings
from offpath.coordination import broker
from offpath.coordination.consumers import holding
from offpath.coordination.jobs import JobEnded, JobOptions, Jobs
from offpath.coordination.logs import tag
from offpath.coordination.runtime import Publisher, Runtime
from offpath.coordination.writers import LOSS_PENDING
from offpath.metrics import RECONCILER_ACTIONS
from offpath.stores import archive
from offpath.stores.checkpoints import read_messages, read_thread
from offpath.stores.db.job_queries import open_jobs, pending_losses, threads_to_requeue
from offpath.stores.db.tables import JobStatus, now_utc
from offpath.stores.leases.claims import State
from offpath.stores.leases.key_stores import reconciler_key

log = logging.getLogger("offpath.reconciler")

#: Seconds between two purges of the archive (``ARCHIVE_RETENTION_DAYS`` > 0).
PURGE_EVERY_S = 3_600


def reconcile_once(rt: Runtime, publish: Publisher) -> dict[str, int]:
    """One pass; returns how many times it took each action (also logged and counted)."""
    s = rt.settings
    token = uuid.uuid4().hex
    key = f"{s.redis_key_prefix}:reconciler"
    if not rt.leases.store.swap(key, None, token, max(2 * s.reconcile_interval_s, 10)):
        return {}  # another worker is running a pass
    done: Counter[str] = Counter()
    # the runtime's own jobs, or ones that publish through ``publish``
    jobs = rt.jobs if publish is rt.publish else Jobs(s, rt.engine, rt.leases, publish)
    try:
        now = now_utc()
        rows = open_jobs(rt.engine, now - timedelta(seconds=s.reconcile_interval_s))
        lost = lost_messages(rt, rows)
        gone = gone_messages(rt, rows)
        for row in rows:
            done[_one(rt, jobs, row, lost, gone)] += 1
        quiet = now - timedelta(seconds=s.reconcile_interval_s)
        for row in pending_losses(rt.engine, LOSS_PENDING["error"], quiet):
            done[_report_loss(rt, jobs, row)] += 1
        ended_since = now - timedelta(seconds=2 * s.failure_backoff_max_s + s.reconcile_interval_s)
        for session_id, options in threads_to_requeue(rt.engine, ended_since):
            # queued only if its claim is free: no job in flight, the failure backoff over
            opts = JobOptions.from_json(options)
            result = jobs.queue(session_id, None, options=opts)
            if result.action == "queued":
                done["queued"] += 1
        if s.archive_retention_days and rt.leases.store.swap(
            f"{s.redis_key_prefix}:archive:purged", None, token, PURGE_EVERY_S
        ):
            if purged := archive.purge(rt.engine, s.archive_retention_days):
                done["archive_purged"] += purged
        last = reconciler_key(s.redis_key_prefix)
        rt.leases.store.swap(last, rt.leases.store.get(last), f"{time.time():.3f}", 86_400)
    finally:
        rt.leases.store.swap(key, token, None, 0)
    done.pop("alive", None)
    if done:
        log.info("reconciler: %s", ", ".join(f"{k} {v}" for k, v in sorted(done.items())))
        for action, n in done.items():
            RECONCILER_ACTIONS.labels(action).inc(n)
    return dict(done)


def prepared_expired(prepared_at: datetime, now: datetime, ttl_s: float) -> bool:
    """A compaction prepared at ``prepared_at`` (its job row's last change, UTC) and not
    applied by ``now`` has waited longer than ``ttl_s`` (``PREPARED_JOB_TTL_S``): the
    reconciler ends it. The rule is strict: at exactly ``ttl_s`` it still waits."""
    if prepared_at.tzinfo is None:  # SQLite hands back naive datetimes: they are UTC
        prepared_at = prepared_at.replace(tzinfo=UTC)
    return (now - prepared_at).total_seconds() > ttl_s


def retry_overdue(changed_at: datetime, now: datetime, settings: Settings) -> bool:
    """A job requeued for a retry whose row last changed at ``changed_at`` (UTC) should have
    started by ``now``: its countdown is at most ``JOB_RETRY_BACKOFF_MAX_S``, and a worker
    takes a due message within ``JOB_LEASE_S``. Strict: at exactly that sum it still waits."""
    if changed_at.tzinfo is None:  # SQLite hands back naive datetimes: they are UTC
        changed_at = changed_at.replace(tzinfo=UTC)
    bound = settings.job_retry_backoff_max_s + settings.job_lease_s
    return (now - changed_at).total_seconds() > bound


def expiry_reason(ttl_s: float) -> str:
    """What an expired prepared job's row says (its timeline shows it); ``expired: ...``."""
    return (
        f"expired: not applied within {ttl_s:g} s (PREPARED_JOB_TTL_S); the thread did not "
        "run again over its threshold and is left unchanged"
    )


def lost_messages(rt: Runtime, rows: list[dict[str, Any]]) -> dict[str, bytes]:
    """``{job id: delivery tag}`` of the queued, published jobs among ``rows`` whose message
    a consumer took at least ``RECONCILE_INTERVAL_S`` ago without acknowledging it, and that
    no live worker holds: their consumer died before the job started. Empty when the broker
    is not Redis or could not be asked (a broker error is logged, the pass goes on)."""
    s = rt.settings
    queued = [r["job_id"] for r in rows if r["status"] == JobStatus.QUEUED and r["published"]]
    if not queued or not broker.is_redis(s.broker_url):
        return {}
    try:
        taken = broker.held_unacked(s.broker_url, queued, time.time() - s.reconcile_interval_s)
        if not taken:
            return {}
        live = holding(s, sorted(taken))
    except Exception as exc:
        log.warning("reconciler: could not look for lost messages: %s", exc)
        return {}
    if live is None:
        return {}
    return {job_id: tag for job_id, tag in taken.items() if job_id not in live}


def gone_messages(rt: Runtime, rows: list[dict[str, Any]]) -> set[str]:
    """The queued, published jobs among ``rows`` whose message the broker no longer holds,
    neither in their queue nor delivered and unacknowledged, on this pass and the one
    before (:func:`_gone_twice`): a delivery took it and was acknowledged without the job
    starting (Celery acks a task that raised, as one does whose database or lease store did
    not answer before it marked its row running), so no worker will ever run it. Empty when the broker is not Redis or could not be asked (a
    broker error is logged, the pass goes on)."""
    s = rt.settings
    queued = [r["job_id"] for r in rows if r["status"] == JobStatus.QUEUED and r["published"]]
    if not broker.is_redis(s.broker_url):
        return set()
    try:
        held = broker.in_broker(s.broker_url, s.celery_queue, queued) if queued else set()
    except Exception as exc:
        log.warning("reconciler: could not look for gone messages: %s", exc)
        return set()
    return _gone_twice(rt, {job_id for job_id in queued if job_id not in held})


def _gone_twice(rt: Runtime, gone: set[str]) -> set[str]:
    """Those of ``gone`` the pass before this one found gone too; keeps the rest for the
    next pass (one key, rewritten by every pass, so a mark never outlives the pass after
    it). A consumer moves a message from the queue's list to kombu's unacknowledged hash in
    two steps, so one read can find it in neither while it is in flight (milliseconds, a
    loaded host's worker longer); a pass later it is in the hash or its job has started."""
    s = rt.settings
    key = f"{s.redis_key_prefix}:reconciler:gone"
    store = rt.leases.store
    before = store.get(key)
    confirmed = gone.intersection(json.loads(before)) if before else set()
    marks = json.dumps(sorted(gone - confirmed))
    store.swap(key, before, marks, max(10 * s.reconcile_interval_s, 60.0))
    return confirmed


def seconds_since_last_pass(rt: Runtime) -> float | None:
    """How long ago the reconciler finished a pass (None: never, or over a day ago)."""
    value = rt.leases.store.get(reconciler_key(rt.settings.redis_key_prefix))
    return time.time() - float(value) if value else None


def _landed(
    rt: Runtime, options: JobOptions, session_id: str, job_id: str, record: dict[str, Any]
) -> bool:
    """Whether the summary of ``job_id`` is in the thread (read from its checkpointer)."""
    saver = rt.checkpoints_for(options.checkpoints).saver
    return landed(read_messages(saver, session_id), job_id, record)


def _one(
    rt: Runtime, jobs: Jobs, row: dict[str, Any], lost: dict[str, bytes], gone: set[str]
) -> str:
    session_id, job_id = row["session_id"], row["job_id"]
    holder = rt.leases.holder(session_id)
    own = holder if holder is not None and holder.job_id == job_id else None  # the job's claim
    mine = own is not None
    options = JobOptions.from_json(row["options"])
    record = (row["result"] or {}).get("record")
    if row["status"] == JobStatus.PREPARED:
        # a record: a run applied it (archive stored, update made); the step that records it
        # may never come (it was the run's last), so look for the summary in the thread
        if record and _landed(rt, options, session_id, job_id, record):
            jobs.record(session_id, job_id, holding=State.PREPARED)
            log.info(
                "[%s] reconciler: job %s was applied in a run; recorded it", tag(session_id), job_id
            )
            return "recorded"
        if own is not None and own.state is State.PREPARED:
            ttl = rt.settings.prepared_job_ttl_s
            if not prepared_expired(row["updated_at"], now_utc(), ttl):
                return "alive"  # waits for its thread to cross the threshold
            # the claim is freed first: a run that finds it gone applies nothing; one that read
            # it just before and applies the compaction all the same records it ``applied``
            reason = expiry_reason(ttl)
            ended = jobs.expire(session_id, job_id, reason)
            if ended is None:
                return "alive"  # the claim moved on meanwhile (applied?): next pass
            if ended:
                log.info("[%s] reconciler: ended job %s (%s)", tag(session_id), job_id, reason)
            return "expired"
        return _end(
            jobs, row, "expired", "its prepared compaction was never applied; its claim is gone"
        )
    if (
        own is not None
        and own.state is State.QUEUED
        and row["status"] == JobStatus.RUNNING
        and retry_overdue(row["updated_at"], now_utc(), rt.settings)
    ):
        # a delivery requeued the job for a retry whose message never ran: its delivery
        # failed before it started (the database down), or the worker holding it until its
        # countdown died (the broker gives it back only after the visibility timeout)
        # on the claim it holds; its row marked published again: it changed, so the next
        # pass waits for the retry again
        jobs.publish_again(session_id, job_id, options, claimed=True, published=False)
        log.info(
            "[%s] reconciler: re-published job %s (its retry is overdue: message lost)",
            tag(session_id),
            job_id,
        )
        return "republished"
    if job_id in lost and own is not None and own.state is State.QUEUED:
        # removed first, so the broker never delivers it besides the new one; False: it was
        # acknowledged or given back meanwhile
        if not broker.drop_unacked(rt.settings.broker_url, lost[job_id]):
            return "alive"
        jobs.publish_lost(session_id, job_id, options)
        log.info(
            "[%s] reconciler: re-published job %s (its message was taken by a worker that is "
            "gone before the job started)",
            tag(session_id),
            job_id,
        )
        return "republished"
    if job_id in gone and own is not None and own.state is State.QUEUED:
        # a message that arrives meanwhile anyway (a consumer that took it just now) is a
        # duplicate delivery, which finds the job running or ended and does nothing
        jobs.publish_lost(session_id, job_id, options)
        log.info(
            "[%s] reconciler: re-published job %s (its message is no longer in the broker: "
            "its delivery ended before the job started)",
            tag(session_id),
            job_id,
        )
        return "republished"
    mine = own is not None and own.in_flight
    if not row["published"]:
        if not jobs.publish_again(session_id, job_id, options, claimed=mine, published=False):
            return _end(
                jobs, row, "superseded", f"job {holder.job_id if holder else '?'} holds the thread"
            )
        log.info("[%s] reconciler: published job %s", tag(session_id), job_id)
        return "published"
    if mine:
        return "alive"
    if record:
        if _landed(rt, options, session_id, job_id, record):
            jobs.record(session_id, job_id)
            log.info("[%s] reconciler: job %s had patched; recorded it", tag(session_id), job_id)
            return "recorded"
    if holder is not None and holder.state is not State.DONE:
        return _end(
            jobs,
            row,
            "lease_lapsed",
            f"its worker was lost; {holder.state.name.lower()} job {holder.job_id} holds the thread",
        )
    if row["attempts"] > rt.settings.job_max_retries:
        return _end(jobs, row, "lease_lapsed", f"its worker was lost {row['attempts']} times")
    if not jobs.publish_again(session_id, job_id, options, claimed=False, published=True):
        return "alive"  # someone claimed the thread meanwhile: next pass
    log.info(
        "[%s] reconciler: re-published job %s (its lease lapsed: worker lost or message lost)",
        tag(session_id),
        job_id,
    )
    return "republished"


#: The loss report of an in-run apply that the reconciler cannot make: its summary is no
#: longer in the thread (a later compaction folded it in, or it was reverted).
LOSS_NOT_MADE = {
    "error": "not made: the agent's process ended before it made it, and its summary is no "
    "longer in the thread"
}


def _report_loss(rt: Runtime, jobs: Jobs, row: dict[str, Any]) -> str:
    """Make the loss report of an applied job whose in-run apply stored it pending (the
    agent's process ended just after the swap; ``LOSS_PENDING``): from its archived
    originals (the messages it removed, the results it shortened), its summary and the
    thread as it is now (what the model still sees). Stored unless another report got there
    first; a summary no longer in the thread gets :data:`LOSS_NOT_MADE`."""
    session_id, job_id = row["session_id"], row["job_id"]
    record = (row["result"] or {}).get("record") or {}
    options = JobOptions.from_json(row["options"])
    saver = rt.checkpoints_for(options.checkpoints).saver
    thread = read_thread(saver, session_id, options.checkpoint_ns).messages
    loss: dict[str, Any] = LOSS_NOT_MADE
    if landed(thread, job_id, record):
        archived = archive.job_rows(rt.engine, session_id, job_id)
        removed = [m for r in archived if r["kind"] == archive.REMOVED for m in _messages(r)]
        originals = {
            r["message_id"]: _messages(r)[0] for r in archived if r["kind"] == archive.SHORTENED
        }
        summary = next(m for m in thread if m.id == record["summary_id"])
        report = loss_report(
            removed,
            content_text(summary.content),
            [m for m in thread if m.id != summary.id],
            shortened=[(originals[str(m.id)], m) for m in thread if str(m.id) in originals],
        )
        loss = report.to_json()
    if not jobs.report_loss(job_id, str(record.get("summary_id")), loss):
        return "alive"
    log.info("[%s] reconciler: made the loss report of job %s", tag(session_id), job_id)
    return "loss_reported"


def _messages(row: dict[str, Any]) -> list[BaseMessage]:
    return messages_from_dict([row["message"]])


def _end(jobs: Jobs, row: dict[str, Any], code: str, why: str) -> str:
    status = JobStatus.SKIPPED if code in ("superseded", "expired") else JobStatus.FAILED
    reason = f"{code}: {why}"
    if jobs.end(
        row["session_id"], row["job_id"], JobEnded(status, code, reason), only_if_open=True
    ):
        log.info(
            "[%s] reconciler: ended job %s (%s)", tag(row["session_id"]), row["job_id"], reason
        )
    return "ended"
