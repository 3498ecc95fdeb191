"""The Celery app's configuration (the worker runs it: :mod:`offpath.worker.celery_app`): broker ``REDIS_URL`` (or ``CELERY_BROKER_URL``), reliability settings.

* ``task_acks_late`` + ``task_reject_on_worker_lost``: a job whose worker dies is
  delivered again (the job is idempotent, see :mod:`worker.jobs`);
* prefetch 1: a worker thread holds one job at a time;
* ``visibility_timeout`` longer than the hard time limit, so a job still running
  is not handed to a second worker;
* soft and hard time limits (enforced by the prefork pool; on the threads pool
  the LLM client's timeout and the lock timeout bound a job);
* task events on, for Flower; results ignored: outcomes live in SQL.

Brokers: Redis (the default) or RabbitMQ (``CELERY_BROKER_URL=amqp://...``), where the
jobs' queue is a durable quorum queue and publishes are confirmed: the one to choose
when queued jobs must survive anything. Locks and leases stay on Redis either way.

The reconciler's ``reconcile`` task runs every ``RECONCILE_INTERVAL_S`` from Celery
beat (``offpath beat``; its schedule file lives in ``DATA_DIR``).

Pool: ``threads`` with ``WORKER_CONCURRENCY`` (64) by default. A job spends
nearly all its time waiting on the LLM's HTTP answer, so threads overlap those
waits in one process; prefork would need one process per concurrent LLM call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

from celery import Celery
from kombu import Queue

from offpath.compaction.settings import Settings
from offpath.config import get_settings


def make_celery(settings: Settings) -> Celery:
    broker = settings.broker_url
    app = Celery("offpath", broker=broker, include=["offpath.worker.tasks"])
    amqp = broker.startswith(("amqp://", "amqps://", "pyamqp://"))
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=settings.job_soft_time_limit_s,
        task_time_limit=settings.job_time_limit_s,
        task_ignore_result=True,
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_default_queue=settings.celery_queue,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=settings.publish_timeout_s,
        broker_transport_options=_transport_options(broker, settings),
        worker_pool=settings.worker_pool,
        worker_concurrency=settings.worker_concurrency,
        beat_schedule={
            "offpath-reconcile": {
                "task": "reconcile",
                "schedule": float(settings.reconcile_interval_s),
                "options": {"expires": float(settings.reconcile_interval_s)},
            }
        },
        beat_schedule_filename=str(Path(settings.data_dir) / "celerybeat-schedule"),
    )
    if amqp:
        # durable quorum queue: queued jobs survive a broker restart; confirmed publishes
        app.conf.task_queues = [
            Queue(
                settings.celery_queue,
                durable=True,
                queue_arguments={"x-queue-type": "quorum"},
            )
        ]
        app.conf.task_default_queue_type = "quorum"
    return app


def _transport_options(broker: str, settings: Settings) -> dict[str, object]:
    if broker.startswith(("amqp://", "amqps://", "pyamqp://")):
        return {"confirm_publish": True, "connect_timeout": settings.publish_timeout_s}
    if not broker.startswith(("redis://", "rediss://")):
        return {}  # e.g. the embedded demo's SQLAlchemy transport takes none of these
    # kombu re-queues jobs of a dead worker once their visibility timeout passed, but only
    # sweeps every interval * throttle seconds (100 s by default): keep that near V / 10
    v = settings.celery_visibility_timeout_s
    interval = min(10, max(1, v // 10))
    return {
        "visibility_timeout": v,
        "unacked_restore_interval": interval,
        "unacked_restore_throttle": min(10, max(1, v // 10 // interval)),
        "socket_connect_timeout": settings.publish_timeout_s,
        "socket_timeout": max(settings.publish_timeout_s, 5.0),
        "max_retries": 1,
    }


#: The job's task name (``worker/tasks.py`` registers it): a job is sent by name, so a
#: process that only queues jobs (the API, a team's own agent) never imports the worker.
COMPACT_TASK = "compact_session"

_apps: dict[str, Celery] = {}
_app_guard = threading.Lock()


def app_for(settings: Settings) -> Celery:
    """The Celery app made from ``settings`` (:func:`make_celery`): one per distinct settings
    in this process, so that every part given the same settings shares one app and its
    connection pool, and parts given other settings (another broker, queue or time limits)
    publish through an app of their own."""
    key = settings.model_dump_json()
    with _app_guard:
        app = _apps.get(key)
        if app is None:
            app = _apps[key] = make_celery(settings)
        return app


def celery_app() -> Celery:
    """The worker process's app (:mod:`offpath.worker.celery_app`): made from the
    environment's settings (:func:`get_settings`), which is what a worker process is given.
    Code given a :class:`Settings` publishes with :func:`publisher` instead."""
    return app_for(get_settings())


def publisher(settings: Settings) -> Callable[[str, str, dict | None], None]:
    """``publish(session_id, job_id, options)``: :func:`send_job` through the app of
    ``settings`` (:func:`app_for`): its broker, its queue (``CELERY_QUEUE``), its time limits.
    Makes no connection until a job is sent."""
    return partial(send_job, app_for(settings))


def send_job(app: Celery, session_id: str, job_id: str, options: dict | None = None) -> None:
    """Send job ``job_id`` (``compact_session`` of thread ``session_id``; ``options``:
    :class:`~offpath.coordination.jobs.JobOptions` as JSON) through ``app``: one
    quick retry, for a pooled connection that went stale when Redis restarted; each attempt
    is bounded by the transport's socket timeouts (``PUBLISH_TIMEOUT_S``).

    Sent by name, with what the task object's ``apply_async`` would add from the app's
    configuration (its time limits, results ignored), so the message is the one the worker's
    registered task would have sent."""
    conf = app.conf
    app.send_task(
        COMPACT_TASK,
        (session_id,),
        {"options": options} if options else None,
        task_id=job_id,
        time_limit=conf.task_time_limit,
        soft_time_limit=conf.task_soft_time_limit,
        ignore_result=conf.task_ignore_result,
        retry=True,
        retry_policy={
            "max_retries": 1,
            "interval_start": 0,
            "interval_step": 0.1,
            "interval_max": 0.1,
        },
    )
