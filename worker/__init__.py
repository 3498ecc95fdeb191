"""Celery app and the ``compact_session`` job (``celery -A offpath.worker.celery_app worker``)."""
