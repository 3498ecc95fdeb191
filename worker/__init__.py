"""Celery app and the ``compact_session`` job (``celery -A offpath.worker.celery_app worker``),
the ``reconcile`` task and the reconciler.

Lives in the repository's ``worker/`` and installs as ``offpath.worker`` (pyproject's
``package-dir``). May import compaction, stores, coordination and the agent side (the graph
its runtime patches through), never the API or the CLI (``tests/test_layout.py``)."""
