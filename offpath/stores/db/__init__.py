"""Usage tables (SQLModel) and their queries: ``usage_events`` and ``compaction_jobs``.

SQLite under ``DATA_DIR`` by default, PostgreSQL when ``DATABASE_URL`` says so;
the schema is created by Alembic (``stores/migrations/``, :func:`migrate`).

``usage_events`` has the seed's fields (session id, model, input and output
tokens, latency in ms, tool-call count, ``metadata`` JSON with
``summarization: true``, ``messages_removed``, ``chars_removed``; ours: ``chars_saved``,
the real reduction, :func:`chars_saved`) and a unique
``job_id``: a job delivered twice records one event (DESIGN.md invariant 4).
``compaction_jobs`` has one row per job and how it ended.

The package: :mod:`.engine` (the engine, :func:`migrate`, the schema set-up's locks),
:mod:`.tables` (the SQLModel tables, :class:`JobStatus`, :func:`chars_saved`, fallback
maskings), :mod:`.transitions` (the job's state machine: queue, start, end, apply, revert;
its thread's crossing) and :mod:`.job_queries` (reading job rows).
"""
