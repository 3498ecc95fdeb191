"""The usage database's engine and schema: its URL from the settings, an engine (SQLite
with WAL, PostgreSQL pinged when idle), Alembic's :func:`migrate` and :func:`ping`."""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
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
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

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
    )
    statement_timeout = settings.database_statement_timeout_s

    @event.listens_for(engine, "connect")
    def _bound_statements(dbapi_conn: Any, _record: Any) -> None:
        set_statement_timeout(dbapi_conn, statement_timeout)
        dbapi_conn.commit()

    if not ping_every_checkout:
        _ping_when_idle(engine)
    return engine


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
