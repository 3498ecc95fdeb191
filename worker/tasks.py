"""The Celery task ``compact_session``: one job per call, retried with backoff and jitter.

The task id is the job id (the post-turn hook picks it), so a redelivered or
retried message is recognised as the same job.
"""

from __future__ import annotations

import logging
import threading

from celery import signals
from celery.utils.time import get_exponential_backoff_interval

from compaction.settings import get_settings
from compaction.summarizers import Summarizer, make_summarizer
from service.db import JobStatus, migrate
from service.runtime import Runtime
from worker.celery_app import app
from worker.jobs import RetryLater, fail, release_claim, run_job

log = logging.getLogger("offpath.worker")

_lock = threading.Lock()
_runtime: tuple[Runtime, Summarizer] | None = None


def runtime() -> tuple[Runtime, Summarizer]:
    """This process's runtime and summarizer, opened on first use (after any fork)."""
    global _runtime
    with _lock:
        if _runtime is None:
            settings = get_settings()
            _runtime = (Runtime.open(settings, run_migrations=False), make_summarizer(settings))
            log.info("worker ready: summarizer %s", _runtime[1].name)
        return _runtime


@signals.worker_init.connect
def _migrate(**_: object) -> None:
    migrate(get_settings())


@signals.worker_ready.connect
def _ready(**_: object) -> None:
    settings = get_settings()
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
        _runtime[0].close()


@app.task(bind=True, name="compact_session", acks_late=True, reject_on_worker_lost=True)
def compact_session(self, session_id: str) -> str:
    """Compact thread ``session_id``; returns the job's final status (also in SQL)."""
    rt, summarizer = runtime()
    settings = rt.settings
    job_id = self.request.id
    status: JobStatus | None = None
    try:
        status = run_job(rt, summarizer, session_id, job_id)
    except RetryLater as exc:
        attempt = self.request.retries + 1
        if self.request.retries >= settings.job_max_retries:
            status = fail(
                rt, session_id, job_id, f"{exc.reason} (gave up after {attempt} attempts)"
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
                session_id[:8],
                attempt,
                exc.reason,
                countdown,
            )
            raise self.retry(countdown=countdown, max_retries=settings.job_max_retries) from exc
    except Exception as exc:  # a bug must still end the job, not leave it "running"
        log.exception("[%s] summarizer: unexpected error", session_id[:8])
        status = fail(rt, session_id, job_id, f"unexpected error: {type(exc).__name__}: {exc}")
    finally:
        if status is not None:
            release_claim(rt, session_id, job_id)
    return str(status)


def publish(session_id: str, job_id: str) -> None:
    """Send one job to the broker (the hook's publisher): one quick retry, for a pooled
    connection that went stale when Redis restarted; each attempt is bounded by the
    transport's socket timeouts (``PUBLISH_TIMEOUT_S``)."""
    compact_session.apply_async(
        (session_id,),
        task_id=job_id,
        retry=True,
        retry_policy={
            "max_retries": 1,
            "interval_start": 0,
            "interval_step": 0.1,
            "interval_max": 0.1,
        },
    )
