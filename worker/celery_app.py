"""The Celery app the worker runs (``celery -A offpath.worker.celery_app``), made from the
settings by :func:`offpath.coordination.queue.make_celery`, where its reliability settings
are described."""

from __future__ import annotations

from offpath.compaction.settings import get_settings
from offpath.coordination.queue import make_celery

app = make_celery(get_settings())
