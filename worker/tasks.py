"""The Celery tasks: ``compact_session`` (one job per call, retried with backoff and jitter)
and ``reconcile`` (the reconciler's pass, on a Celery beat schedule).

The task id of ``compact_session`` is the job id (the post-turn hook picks it), so a
redelivered or retried message is recognised as the same job. Each delivery takes
the thread's running lease (:mod:`offpath.stores.leases`) and renews it while it runs.
"""

from __future__ import annotations

import logging
import random
import threading

from celery import signals
from celery.utils.time import get_exponential_backoff_interval

from offpath.agent.graph import open_thread_writer
from offpath.compaction.summarizers.base import Summarizer
from offpath.config import get_settings
from offpath.coordination.eviction import EvictingRedis, check_eviction
from offpath.coordination.exporter import serve_worker_metrics
from offpath.coordination.faults import failpoint
from offpath.coordination.jobs import JobEnded, JobOptions
from offpath.coordination.logs import tag
from offpath.coordination.outages import cause, is_outage
from offpath.coordination.queue import COMPACT_TASK
from offpath.coordination.runtime import Runtime
from offpath.llm import make_summarizer, summarizer_name
from offpath.stores.db.engine import migrate
from offpath.stores.db.tables import JobStatus
from offpath.stores.leases.claims import Start
from offpath.worker.celery_app import app
from offpath.worker.jobs import Outcome, RetryLater, end, load_job_path, run_job, settle_heap

log = logging.getLogger("offpath.worker")

_lock = threading.Lock()
_runtime: tuple[Runtime, Summarizer] | None = None


class JobFailed(Exception):
    """Raised by ``compact_session`` for a job that ended ``failed``, so that Celery (and
    Flower) count it as a failed task; the job row says why."""


def runtime() -> tuple[Runtime, Summarizer]:
    """This process's runtime and summarizer, opened on first use (after any fork); its jobs'
    running leases are renewed by ``rt.jobs``. The runtime patches threads through
    :func:`~offpath.agent.graph.thread_graph`: the worker builds no chat agent."""
    global _runtime
    with _lock:
        if _runtime is None:
            settings = get_settings()
            rt = open_thread_writer(settings, run_migrations=False)
            _runtime = (rt, make_summarizer(settings))
            load_job_path()  # not inside the first job, while its lease is renewed
            # what start-up made lives as long as the process: out of the collector's
            # generations (a full collection of that heap stalls a job for ~100 ms), and
            # full collections of what jobs leave spaced
            settle_heap()
            log.info("worker ready: summarizer %s", _runtime[1].name)
        return _runtime


@signals.worker_init.connect
def _migrate(**_: object) -> None:
    migrate(get_settings())


@signals.worker_init.connect
def _check_eviction(**_: object) -> None:
    """An evicting Redis drops leases mid-job: warn, or refuse to start."""
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
        summarizer_name(settings),  # no second client made for its name
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
        _runtime[0].close()  # stops its lease keeper too


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
    failpoint("before_start")
    rt, summarizer = runtime()
    settings = rt.settings
    jobs = rt.jobs
    job_id = self.request.id
    sid = tag(session_id)
    try:
        started = jobs.start(session_id, job_id)
    except Exception as exc:
        if not is_outage(exc):
            raise
        # nothing of the job began (its row is not running, or no lease was taken): this
        # delivery is sent again after a countdown; acknowledged as a failed task, it would
        # leave the job queued with no message
        bound = get_exponential_backoff_interval(
            factor=settings.job_retry_backoff_s,
            retries=self.request.retries,
            maximum=settings.job_retry_backoff_max_s,
        )
        countdown = random.uniform(bound / 2, bound)  # a store's outage lasts: never at once
        log.warning(
            "[%s] summarizer: job %s could not start (%s); trying again in %.1fs",
            sid,
            job_id,
            cause(exc),
            countdown,
        )
        raise self.retry(
            exc=exc, countdown=countdown, max_retries=settings.job_max_retries
        ) from exc
    if started.done is not None:
        log.info("[%s] summarizer: job %s already %s, nothing to do", sid, job_id, started.done)
        return str(started.done)
    log.info(
        "[%s] summarizer: job %s for session %r, attempt %d (%s)",
        sid,
        job_id,
        session_id,
        self.request.retries + 1,
        started.start,
    )
    if started.start is Start.DUPLICATE:
        return "duplicate delivery"  # the other delivery records the outcome
    held = started.lease
    if held is None:
        before = started.before
        reason = f"{started.start}: job {before.job_id if before else '?'} holds the thread"
        ended = JobEnded(JobStatus.SKIPPED, str(started.start), reason)
        return str(end(rt, session_id, job_id, ended).status)
    outcome: Outcome | None = None
    try:
        options_ = JobOptions.from_json(options)
        outcome = run_job(
            rt, summarizer, session_id, job_id, held, started.stored, options_, started.others
        )
    except RetryLater as exc:
        attempt = self.request.retries + 1
        if self.request.retries >= settings.job_max_retries:
            outcome = end(
                rt,
                session_id,
                job_id,
                JobEnded(
                    JobStatus.FAILED,
                    "llm_error",
                    f"{exc.reason} (gave up after {attempt} attempts)",
                ),
                held,
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
            jobs.retry(held)  # queued again until the retry runs
            raise self.retry(
                exc=exc, countdown=countdown, max_retries=settings.job_max_retries
            ) from exc
    except Exception as exc:  # a bug must still end the job, not leave it "running"
        log.exception("[%s] summarizer: unexpected error", sid)
        outcome = end(
            rt,
            session_id,
            job_id,
            JobEnded(  # the traceback is in the log above, never in the row
                JobStatus.FAILED,
                "internal_error",
                f"unexpected error in the worker ({type(exc).__name__}; its log has the details)",
            ),
            held,
        )
    finally:
        jobs.let_go(held)  # handed on already, or left to lapse
    assert outcome is not None
    if outcome.follow_up_chars is not None:
        log.info("[%s] summarizer: still over the threshold; queueing the next job", sid)
        jobs.queue(session_id, outcome.follow_up_chars)
    status = outcome.status
    if status is JobStatus.FAILED:
        raise JobFailed(
            f"compaction job {job_id} failed (see GET /sessions/{session_id}/compactions)"
        )
    return str(status)


@app.task(name="reconcile", ignore_result=True)
def reconcile() -> dict[str, int]:
    """One pass of the reconciler (:mod:`worker.reconciler`); Celery beat runs it every
    ``RECONCILE_INTERVAL_S``. A store that does not answer ends the pass with one warning
    line (the next pass starts over); any other error raises, with its traceback."""
    from offpath.worker.reconciler import reconcile_once

    rt, _ = runtime()
    try:
        return reconcile_once(rt, rt.publish)
    except Exception as exc:
        if not is_outage(exc):
            raise
        log.warning("reconciler: pass ended, a store did not answer: %s", cause(exc))
        return {}
