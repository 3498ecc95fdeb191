"""Locks that serialize schema set-up across processes: an API, a worker and
``offpath migrate`` started at once on a fresh database must not create the same tables
together ("relation usage_events already exists", a UniqueViolation in the checkpointer's
``setup()``). The one that comes second waits, then finds the tables and does nothing.

* PostgreSQL: an advisory lock (the migrations take a transaction-level one, see
  ``stores/migrations/env.py``; the checkpointer, whose set-up commits statement by
  statement, one held on a connection of its own until the set-up has returned);
* SQLite: ``flock`` on a lock file beside the database, in ``DATA_DIR``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Advisory lock keys (any bigint, the same in every process of a deployment).
MIGRATIONS_LOCK_KEY = 724201
CHECKPOINTS_LOCK_KEY = 724202


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing); a no-op where there is
    no ``fcntl`` (Windows)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd is closed, or the process dies
        yield
    finally:
        os.close(fd)


@contextmanager
def pg_session_lock(conninfo: str, key: int, poll_s: float = 0.05) -> Iterator[None]:
    """Hold PostgreSQL advisory lock ``key`` on a connection of its own; the work done
    inside must be committed before the block ends (the lock goes with the connection).

    It polls ``pg_try_advisory_lock`` rather than blocking in ``pg_advisory_lock``: a
    blocked statement keeps a snapshot open, which the holder's ``CREATE INDEX
    CONCURRENTLY`` (the checkpointer's set-up has some) would wait for, for ever.
    """
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        while not conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:  # type: ignore[index]
            time.sleep(poll_s)
        try:
            yield
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
