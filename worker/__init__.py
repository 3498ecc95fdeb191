"""Celery app and the ``compact_session`` job (``celery -A worker.celery_app worker``)."""
