"""The Celery app the worker runs (``celery -A offpath.worker.celery_app``), made once from the
settings by :func:`offpath.coordination.queue.celery_app`, where its reliability settings
are described. Its consumer is :class:`Consumer`, which rides out a broker outage."""

from __future__ import annotations

import logging

from celery.worker.consumer import Consumer as CeleryConsumer

from offpath.coordination.queue import celery_app

log = logging.getLogger("offpath.worker")


class Consumer(CeleryConsumer):
    """Celery's consumer, which keeps the worker running when the broker goes away while it
    holds a message not yet acknowledged (a job in flight, ``task_acks_late``).

    On a lost connection Celery collects the broken connection, which unlinks kombu's Redis
    transport from it (``transport.client = None``), then closes it. Every Redis command of
    that transport's channel afterwards builds a new client from that link: closing the
    channel (which gives its unacknowledged messages back) and the ack of a job that ends
    after the loss both raise ``AttributeError: 'NoneType' object has no attribute
    'hostname'``. Celery ignores only connection errors there, so the worker would stop with
    "Unrecoverable error" and exit 1.

    Here the close's error ends the cleanup of the lost connection (Celery then reconnects as
    after any connection error), and the transport is linked to the connection again, so a job
    that ends later acks through a new client on the same broker URL (a broker still down
    gives a connection error, which Celery logs). A message not given back stays in kombu's
    unacked hash until its ack or the visibility timeout; the reconciler re-publishes a job
    whose message a restarted broker lost."""

    def on_connection_error_after_connected(self, exc: BaseException) -> None:
        connection = self.connection
        transport = connection.transport if connection is not None else None
        try:
            super().on_connection_error_after_connected(exc)
        except AttributeError as error:
            if transport is None or transport.client is not None:
                raise  # not the close of a collected connection
            log.warning(
                "the lost broker connection's unacknowledged messages were not given back "
                "(%r); they stay unacknowledged until their job acks them or the visibility "
                "timeout passes",
                error,
            )
        finally:
            if transport is not None and transport.client is None:
                transport.client = connection


app = celery_app()
app.conf.worker_consumer = f"{Consumer.__module__}:{Consumer.__qualname__}"
