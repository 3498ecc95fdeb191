"""The Celery app the worker runs (``celery -A offpath.worker.celery_app``), made once from the
settings by :func:`offpath.coordination.queue.celery_app`, where its reliability settings
are described."""

from __future__ import annotations

from offpath.coordination.queue import celery_app

app = celery_app()
