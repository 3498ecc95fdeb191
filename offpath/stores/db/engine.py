"""The usage database's engine and schema: its URL from the settings, an engine (SQLite
with WAL, PostgreSQL pinged when idle), an ``INSERT`` in its dialect (:func:`insert_for`),
Alembic's :func:`migrate` and :func:`ping`.

The locks that serialize schema set-up across processes (:func:`file_lock`,
:func:`pg_session_lock`): an API, a worker and
``offpath migrate`` started at once on a fresh database must not create the same tables
together ("relation usage_events already exists", a UniqueViolation in the checkpointer's
``setup()``). The one that comes second waits, then finds the tables and does nothing.

* PostgreSQL: an advisory lock (the migrations take a transaction-level one, see
  ``stores/migrations/env.py``; the checkpointer, whose set-up commits statement by
  statement, one held on a connection of its own until the set-up has returned);
* SQLite: ``flock`` on a lock file beside the database, in ``DATA_DIR``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlmodel import create_engine

from offpath.compaction.settings import Settings


def sqlalchemy_url(settings: Settings) -> str:
    """SQLAlchemy URL: ``DATABASE_URL`` (``postgresql://`` gets the psycopg 3 driver) or
    ``sqlite:///DATA_DIR/usage.db``."""
    url = settings.database_url.strip()
    if not url:
        path = Path(settings.data_dir) / "usage.db"
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(settings: Settings, *, ping_every_checkout: bool = False) -> Engine:
    """An engine for the usage tables; SQLite gets WAL and a busy timeout. PostgreSQL
    connections are pinged at checkout when idle over :data:`IDLE_PING_S` (the worker's
    jobs), or at every checkout with ``ping_every_checkout`` (SQLAlchemy's
    ``pool_pre_ping``: the API, whose reads must not answer 500 once after a database
    restart or a dropped connection)."""
    url = sqlalchemy_url(settings)
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"timeout": 30, "check_same_thread": False},
            json_serializer=json_text,
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(conn: Any, _record: Any) -> None:
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    engine = create_engine(
        url,
        pool_size=5,
        max_overflow=10,
        pool_pre_ping=ping_every_checkout,
        connect_args=libpq_options(settings),
        json_serializer=json_bytes,  # psycopg's JSON dumper takes bytes
    )
    statement_timeout = settings.database_statement_timeout_s

    @event.listens_for(engine, "connect")
    def _bound_statements(dbapi_conn: Any, _record: Any) -> None:
        set_statement_timeout(dbapi_conn, statement_timeout)
        dbapi_conn.commit()

    if not ping_every_checkout:
        _ping_when_idle(engine)
    return engine


#: The scalars orjson and ``json.dumps`` write as the same JSON value (floats: finite ones).
_PLAIN_SCALARS = frozenset({str, int, bool, type(None)})


def _plain(value: Any) -> bool:
    """Whether ``value`` holds only dicts, lists and tuples of strings, integers, booleans,
    None and finite floats (exactly those types, no subclasses): what orjson writes as
    ``json.dumps`` does, or refuses (a key that is not a string, a lone surrogate, an integer
    past 64 bits). NaN and Infinity (which orjson writes as null), a ``UUID`` or an ``Enum``
    (which ``json.dumps`` refuses) are not."""
    stack = [value]
    while stack:
        v = stack.pop()
        kind = type(v)
        if kind is dict:
            stack.extend(v.values())
        elif kind is list or kind is tuple:
            stack.extend(v)
        elif kind is float:
            if not math.isfinite(v):
                return False
        elif kind not in _PLAIN_SCALARS:
            return False
    return True


def json_bytes(value: Any) -> bytes | str:
    """The JSON the usage tables' JSON columns store of ``value``: orjson's for plain values
    (:func:`_plain`; ~20x faster than ``json.dumps``: a job's archive rows and record), else
    ``json.dumps``'s, as before (what it refuses, or writes that no database keeps, is still
    refused and named: :mod:`offpath.stores.values`). The same value read back either way;
    only the text's spacing and escapes differ."""
    if _plain(value):
        try:
            return orjson.dumps(value)
        except TypeError:  # a key that is not a string, a lone surrogate, an integer past 64 bits
            pass
    return json.dumps(value)


def json_text(value: Any) -> str:
    """:func:`json_bytes` as text (SQLite stores bytes as a blob)."""
    out = json_bytes(value)
    return out.decode() if isinstance(out, bytes) else out


#: TCP keepalives of every PostgreSQL connection (libpq's ``keepalives_*``, seconds and
#: probes): an idle connection to a host that vanished is found within about a minute.
KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}


def libpq_options(settings: Settings) -> dict[str, Any]:
    """The libpq parameters of every PostgreSQL connection offpath opens (the usage tables'
    engine, the checkpointer's pool): :data:`KEEPALIVES`, ``connect_timeout`` and
    ``tcp_user_timeout`` (milliseconds) from ``DATABASE_CONNECT_TIMEOUT_S`` and
    ``DATABASE_TCP_USER_TIMEOUT_S`` (0: left out, libpq's default)."""
    options: dict[str, Any] = dict(KEEPALIVES)
    if settings.database_connect_timeout_s:
        options["connect_timeout"] = settings.database_connect_timeout_s
    if settings.database_tcp_user_timeout_s:
        options["tcp_user_timeout"] = settings.database_tcp_user_timeout_s * 1000
    return options


def set_statement_timeout(dbapi_conn: Any, seconds: int) -> None:
    """``SET statement_timeout`` on a new psycopg connection (``seconds``; 0: none). Set on
    the session rather than as a start-up option, which PgBouncer refuses."""
    cur = dbapi_conn.cursor()
    try:
        cur.execute(f"SET statement_timeout = {int(seconds) * 1000}")
    finally:
        cur.close()


#: A pooled connection idle longer than this (s) is pinged before it is handed out.
IDLE_PING_S = 1.0


def _ping_when_idle(engine: Engine) -> None:
    """Ping a pooled connection at checkout only if it sat idle over :data:`IDLE_PING_S`
    (a database restart shows there): ``pool_pre_ping`` pings at every checkout, a round
    trip per statement group of a job. A connection that breaks while in use invalidates
    the pool (SQLAlchemy's disconnect handling), and the job retries."""

    @event.listens_for(engine, "checkin")
    def _stamp(_dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("idle_since")
        if since is None or time.monotonic() - since < IDLE_PING_S:
            return
        try:
            cur = dbapi_conn.cursor()
            cur.execute("SELECT 1")
            cur.close()
        except Exception as exc:
            raise sa.exc.DisconnectionError(str(exc)) from exc


#: Held while this process runs a migration (threads of one process: a team's agent makes
#: offpath's tables from a background thread, which may meet another migration).
_MIGRATING = threading.Lock()


def insert_for(engine: Engine, table: sa.Table) -> postgresql.Insert | sqlite.Insert:
    """``INSERT`` into ``table`` in ``engine``'s dialect (PostgreSQL's, else SQLite's): one
    that can skip or update a row whose key exists (``on_conflict_do_nothing``,
    ``on_conflict_do_update``)."""
    if engine.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def migrate(settings: Settings) -> str:
    """Bring the schema to the latest Alembic revision (safe to call from every process,
    also at once: ``stores/migrations/env.py`` runs one migrator at a time).

    Returns a line saying what it did. Raises the driver's error if the database
    cannot be reached.
    """
    from alembic import command
    from alembic.config import Config

    url = sqlalchemy_url(settings)
    cfg = Config()
    cfg.set_main_option("script_location", _script_location())
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    with _MIGRATING:  # Alembic's ``context`` is one per process: one migration at a time
        command.upgrade(cfg, "head")
    # read under the migration lock by env.py: a migrator that waited sees the tables made
    before = cfg.attributes.get("revision_before")
    after = cfg.attributes.get("revision_after")
    if before == after:
        return f"usage tables are up to date (revision {after})"
    return f"usage tables {'created' if before is None else 'upgraded from ' + before} at revision {after}"


def _script_location() -> str:
    return str(Path(__file__).resolve().parent.parent / "migrations")


@functools.lru_cache(maxsize=1)
def head_revision() -> str | None:
    """The latest Alembic revision of offpath's migrations (read once per process)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", _script_location())
    return ScriptDirectory.from_config(cfg).get_current_head()


def revision_of(dbapi_conn: Any) -> str | None:
    """The Alembic revision a database is at, read on one of its driver's connections (a
    pool's new connection, before SQLAlchemy uses it; its transaction is rolled back); None
    when it has no ``alembic_version`` table (or it cannot be read)."""
    cur = dbapi_conn.cursor()
    try:
        cur.execute("SELECT version_num FROM alembic_version")
        row = cur.fetchone()
        return str(row[0]) if row else None
    except Exception:
        return None
    finally:
        cur.close()
        dbapi_conn.rollback()


def ping(engine: Engine) -> None:
    """Raise if the database does not answer."""
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))


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
