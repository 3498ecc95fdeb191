"""A job is sent by task name (``offpath.coordination.queue``, issue 23: coordination
publishes without importing the worker's tasks). The message must be the one the worker's
registered task would have sent with ``apply_async``: same task, arguments, time limits,
results ignored, queue. Both go through a real broker (kombu's SQLAlchemy transport on a
SQLite file, the embedded demo's) and are read back from the queue."""

from __future__ import annotations

import uuid

from kombu import Connection

from offpath.config import load_settings
from offpath.coordination.queue import COMPACT_TASK, make_celery, send_job


def read_one(app, queue: str) -> dict:
    with Connection(app.conf.broker_url) as conn:
        simple = conn.SimpleQueue(queue, no_ack=True)
        try:
            message = simple.get(timeout=5)
            return {
                "headers": message.headers,
                "body": message.decode(),
                "routing_key": message.delivery_info.get("routing_key"),
                "content_type": message.content_type,
            }
        finally:
            simple.close()


def test_a_job_sent_by_name_is_the_message_the_registered_task_sends(tmp_path):
    settings = load_settings(
        data_dir=str(tmp_path),
        celery_broker_url=f"sqla+sqlite:///{tmp_path}/broker.db",
        job_time_limit_s=900,
        job_soft_time_limit_s=600,
    )
    app = make_celery(settings)

    @app.task(bind=True, name=COMPACT_TASK, acks_late=True, reject_on_worker_lost=True)
    def compact_session(self, session_id: str, options: dict | None = None) -> str:
        return "unused"

    job = str(uuid.uuid4())
    options = {"force": True}
    compact_session.apply_async(
        ("s-1",),
        {"options": options},
        task_id=job,
        retry=True,
        retry_policy={"max_retries": 1, "interval_start": 0},
    )
    registered = read_one(app, settings.celery_queue)
    send_job(app, "s-1", job, options)
    by_name = read_one(app, settings.celery_queue)

    assert by_name == registered
    assert by_name["headers"]["task"] == COMPACT_TASK
    assert by_name["headers"]["timelimit"] == [900, 600]  # the app's limits travel with it
    assert by_name["headers"]["ignore_result"] is True
    assert by_name["routing_key"] == settings.celery_queue
    assert by_name["body"][0] == ["s-1"] and by_name["body"][1] == {"options": options}
