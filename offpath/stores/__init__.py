"""The stores: what offpath keeps, as SQLModel tables beside their queries.

* :mod:`.db`: the engine, migrations and the ``usage_events`` / ``compaction_jobs`` tables
  with the job's state machine;
* :mod:`.usage`: usage and ``/stats`` queries;
* :mod:`.archive`: the originals a compaction or a shortening took out of a thread;
* :mod:`.tenants`: keys, tenants and which sessions they own;
* :mod:`.leases`: the job claims (a thread's queued, running or prepared job) in Redis or SQL;
* :mod:`.checkpoints`: the LangGraph checkpointer (SQLite or PostgreSQL);
* :mod:`.updates`: a thread's job changes since a time (the middleware's progress events);
* :mod:`.migrations`: Alembic.

May import :mod:`offpath.compaction` and :mod:`offpath.events` only: never coordination,
the agent side, the worker, the API or the CLI (``tests/test_layout.py`` checks it).
"""
