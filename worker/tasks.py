"""The Celery tasks: ``compact_session`` (one job per call, retried with backoff and jitter)
and ``reconcile`` (the reconciler's pass, on a Celery beat schedule).

The task id of ``compact_session`` is the job id (the post-turn hook picks it), so a
redelivered or retried message is recognised as the same job. Each delivery takes
the thread's running lease (:mod:`offpath.stores.leases`) and renews it while it runs.
"""

from __future__ import annotations

import logging
import threading
import uuid

from celery import signals
from celery.utils.time import get_exponential_backoff_interval

from offpath.agent.graph import open_runtime
from offpath.compaction.settings import get_settings
from offpath.compaction.summarizers import Summarizer, make_summarizer
from offpath.coordination.compactions import JobEnded, JobOptions
from offpath.coordination.eviction import EvictingRedis, check_eviction
from offpath.coordination.exporter import serve_worker_metrics
from offpath.coordination.hook import queue_job
from offpath.coordination.logs import tag
from offpath.coordination.queue import COMPACT_TASK
from offpath.coordination.runtime import Runtime
from offpath.stores.db import JobStatus, failures_in_a_row, migrate, start_job
from offpath.stores.leases import LeaseKeeper, Leases, Start, State, failure_backoff_s
from offpath.worker.celery_app import app
from offpath.worker.jobs import Outcome, RetryLater, end, run_job

log = logging.getLogger("offpath.worker")

_lock = threading.Lock()
_runtime: tuple[Runtime, Summarizer, LeaseKeeper] | None = None


class JobFailed(Exception):
    """Raised by ``compact_session`` for a job that ended ``failed``, so that Celery (and
    Flower) count it as a failed task (issue 8, item 6); the job row says why."""


def runtime() -> tuple[Runtime, Summarizer, LeaseKeeper]:
    """This process's runtime, summarizer and lease keeper, opened on first use (after any fork)."""
    global _runtime
    with _lock:
        if _runtime is None:
            settings = get_settings()
            rt = open_runtime(settings, run_migrations=False)
            _runtime = (
                rt,
                make_summarizer(settings),
                LeaseKeeper(rt.leases, settings.job_time_limit_s),
            )
            log.info("worker ready: summarizer %s", _runtime[1].name)
        return _runtime


@signals.worker_init.connect
def _migrate(**_: object) -> None:
    migrate(get_settings())


@signals.worker_init.connect
def _check_eviction(**_: object) -> None:
    """An evicting Redis drops leases mid-job (issue 20, item 11): warn, or refuse to start."""
    try:
        check_eviction(get_settings(), "the worker")
    except EvictingRedis as exc:
        log.critical("%s", exc)
        raise SystemExit(1) from None  # Celery only logs a handler's Exception, and goes on


@signals.worker_init.connect
def _serve_metrics(**_: object) -> None:
    """This worker's ``/metrics`` on ``WORKER_METRICS_HOST:WORKER_METRICS_PORT`` (0: off)."""
    settings = get_settings()
    serve_worker_metrics(settings.worker_metrics_host, settings.worker_metrics_port)


@signals.worker_ready.connect
def _ready(**_: object) -> None:
    """Log the configuration and run a reconciler pass at once: a worker that (re)starts after
    an outage picks up lapsed and unpublished jobs without waiting for beat's next tick."""
    settings = get_settings()
    try:
        reconcile.apply_async(expires=settings.reconcile_interval_s)
    except Exception as exc:  # beat will send one anyway
        log.warning("could not queue a reconciler pass at start-up: %s", exc)
    log.info(
        "offpath worker ready: summarizer %s, threshold %d chars, keep %d chars, queue %s",
        make_summarizer(settings).name,
        settings.summarization_threshold_chars,
        settings.summarization_keep_chars,
        settings.celery_queue,
    )


@signals.worker_process_init.connect
def _after_fork(**_: object) -> None:
    global _runtime
    _runtime = None  # connections are never shared across a fork


@signals.worker_shutdown.connect
def _close(**_: object) -> None:
    if _runtime is not None:
        _runtime[2].stop()
        _runtime[0].close()


@app.task(
    bind=True,
    name=COMPACT_TASK,
    acks_late=True,
    reject_on_worker_lost=True,
    throws=(JobFailed,),  # an expected outcome: logged without a traceback
)
def compact_session(self, session_id: str, options: dict | None = None) -> str:
    """Compact thread ``session_id`` (``options``: :class:`JobOptions` as JSON); returns how
    the job ended (also in SQL). A job that ends ``failed`` raises :class:`JobFailed`."""
    rt, summarizer, keeper = runtime()
    settings = rt.settings
    job_id = self.request.id
    sid = tag(session_id)
    done, stored = start_job(rt.engine, job_id, session_id)
    if done is not None:
        log.info("[%s] summarizer: job %s already %s, nothing to do", sid, job_id, done)
        rt.leases.release_queued(session_id, job_id)  # a reconciler's re-publish raced its end
        return str(done)
    token = uuid.uuid4().hex[:12]
    started, before = rt.leases.start(session_id, job_id, token)
    log.info(
        "[%s] summarizer: job %s for session %r, attempt %d (%s)",
        sid,
        job_id,
        session_id,
        self.request.retries + 1,
        started,
    )
    if started is Start.DUPLICATE:
        return "duplicate delivery"  # the other delivery records the outcome
    if started is not Start.OK:
        reason = f"{started}: job {before.job_id if before else '?'} holds the thread"
        return str(
            end(rt, session_id, job_id, JobEnded(JobStatus.SKIPPED, str(started), reason)).status
        )
    held = keeper.hold(session_id, job_id, token)
    outcome: Outcome | None = None
    try:
        outcome = run_job(
            rt, summarizer, session_id, job_id, held, stored, JobOptions.from_json(options)
        )
    except RetryLater as exc:
        attempt = self.request.retries + 1
        if self.request.retries >= settings.job_max_retries:
            status = end(
                rt,
                session_id,
                job_id,
                JobEnded(
                    JobStatus.FAILED,
                    "llm_error",
                    f"{exc.reason} (gave up after {attempt} attempts)",
                ),
            )
        else:
            backoff = get_exponential_backoff_interval(
                factor=settings.job_retry_backoff_s,
                retries=self.request.retries,
                maximum=settings.job_retry_backoff_max_s,
                full_jitter=True,
            )
            countdown = min(max(backoff, exc.retry_after_s or 0), settings.job_retry_backoff_max_s)
            log.warning(
                "[%s] summarizer: attempt %d failed (%s); retrying in %.1fs",
                sid,
                attempt,
                exc.reason,
                countdown,
            )
            keeper.drop(held)
            rt.leases.requeue(session_id, job_id, token)  # queued again until the retry runs
            raise self.retry(countdown=countdown, max_retries=settings.job_max_retries) from exc
    except Exception as exc:  # a bug must still end the job, not leave it "running"
        log.exception("[%s] summarizer: unexpected error", sid)
        outcome = end(
            rt,
            session_id,
            job_id,
            JobEnded(  # the traceback is in the log above, never in the row (issue 20, item 9)
                JobStatus.FAILED,
                "internal_error",
                f"unexpected error in the worker ({type(exc).__name__}; its log has the details)",
            ),
        )
    finally:
        keeper.drop(held)
        if outcome is not None:
            _hand_on(rt, session_id, job_id, token, outcome)
    assert outcome is not None
    if outcome.follow_up_chars is not None:
        log.info("[%s] summarizer: still over the threshold; queueing the next job", sid)
        queue_job(rt.leases, rt.engine, rt.publish, session_id, outcome.follow_up_chars)
    status = outcome.status
    if status is JobStatus.FAILED:
        raise JobFailed(
            f"compaction job {job_id} failed (see GET /sessions/{session_id}/compactions)"
        )
    return str(status)


def _hand_on(rt: Runtime, session_id: str, job_id: str, token: str, outcome: Outcome) -> None:
    """Hand the thread on after the job's status is written: the claim the outcome leaves
    (``d``, ``p``, ``s``), the failure backoff after a failure, else free."""
    s = rt.settings
    then = outcome.then
    if outcome.status is JobStatus.FAILED:
        failures, _ = failures_in_a_row(rt.engine, session_id)
        backoff = failure_backoff_s(failures, s.failure_backoff_s, s.failure_backoff_max_s)
        then = Leases.after(job_id, State.BACKOFF, backoff_s=backoff)
    try:
        rt.leases.finish(session_id, job_id, token, then)
    except Exception as exc:  # the lease lapses on its own
        log.warning("[%s] could not release the thread's lease: %s", tag(session_id), exc)


@app.task(name="reconcile", ignore_result=True)
def reconcile() -> dict[str, int]:
    """One pass of the reconciler (:mod:`worker.reconciler`); Celery beat runs it every
    ``RECONCILE_INTERVAL_S``."""
    from offpath.worker.reconciler import reconcile_once

    rt, _, _ = runtime()
    return reconcile_once(rt, rt.publish)
