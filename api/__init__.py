"""The chat API (FastAPI): ``offpath.api.app:app``: routes, request limits and schemas, the
web UI.

Lives in the repository's ``api/`` and installs as ``offpath.api`` (pyproject's
``package-dir``). May import every layer before it (compaction, stores, coordination, the
agent side, the worker's reconciler), never the CLI (``tests/test_layout.py``)."""
