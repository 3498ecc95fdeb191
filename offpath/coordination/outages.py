"""A store that cannot be reached, said once: one line naming the store and where it is, the
first time; after that the failures are counted, the count said at most every
:data:`REPEAT_S` while it lasts and once when the store answers again.

The stores a process of offpath talks to: the usage database (``DATABASE_URL`` or the
SQLite file under ``DATA_DIR``), the lease store (Redis at ``REDIS_URL``, or the usage
database with ``LOCK_BACKEND=database``) and the broker (``CELERY_BROKER_URL`` or
``REDIS_URL``). :data:`OUTAGES` is the process's one record of them, shared by the
middleware in a team's own agent and by :meth:`offpath.coordination.jobs.Jobs.queue`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from offpath.compaction.settings import Settings

log = logging.getLogger("offpath.outages")

#: While a store stays unreachable, its count of failures is said at most this often (s).
REPEAT_S = 300.0

#: The stores, as the lines name them.
USAGE_DB = "usage database"
LEASE_STORE = "lease store"
BROKER = "broker"
CHECKPOINTER = "checkpointer"


def cause(exc: BaseException) -> str:
    """The first line of what the driver said (without SQLAlchemy's statement, parameters
    and link), prefixed by its type's name: ``OperationalError: connection failed: ...``."""
    if isinstance(exc, TablesUnavailable) and exc.__cause__ is not None:
        return cause(exc.__cause__)
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    line = " ".join(text[0].split()) if text else ""
    return f"{type(orig).__name__}: {line}" if line else type(orig).__name__


def missing_tables(exc: BaseException) -> bool:
    """``exc`` says that a table offpath needs does not exist (PostgreSQL's ``UndefinedTable``,
    SQLite's ``no such table``)."""
    if isinstance(exc, TablesUnavailable) and exc.__cause__ is not None:
        exc = exc.__cause__
    orig = getattr(exc, "orig", None) or exc
    return type(orig).__name__ in ("UndefinedTable", "InsufficientPrivilege") or (
        "no such table" in str(orig)
    )


def is_outage(exc: BaseException) -> bool:
    """``exc`` comes from a store (a database, Redis or broker error, or a connection that
    failed), not from offpath's own code."""
    import psycopg
    import redis
    import sqlalchemy.exc
    from kombu.exceptions import KombuError

    store_errors = (
        sqlalchemy.exc.SQLAlchemyError,
        psycopg.Error,
        redis.RedisError,
        KombuError,
        ConnectionError,
        TimeoutError,
        TablesUnavailable,
    )
    return (
        isinstance(exc, store_errors)
        or isinstance(getattr(exc, "orig", None), OSError)
        or database_unavailable(exc)
    )


def database_errors() -> tuple[type[Exception], ...]:
    """The errors that say a database could not be reached or did not answer in time, so
    that the same call may succeed later: a refused, dropped or timed-out connection, a
    statement cancelled by ``statement_timeout``, a pool with no connection to give
    (SQLAlchemy's ``OperationalError``, ``InterfaceError``, ``DisconnectionError`` and
    ``TimeoutError``; psycopg's ``OperationalError`` and ``InterfaceError``, which
    psycopg_pool's ``PoolTimeout`` is; SQLite's ``OperationalError``: a locked file)."""
    import sqlite3

    import psycopg
    import sqlalchemy.exc

    return (
        sqlalchemy.exc.OperationalError,
        sqlalchemy.exc.InterfaceError,
        sqlalchemy.exc.DisconnectionError,
        sqlalchemy.exc.TimeoutError,
        psycopg.OperationalError,
        psycopg.InterfaceError,
        sqlite3.OperationalError,
    )


def database_unavailable(exc: BaseException) -> bool:
    """``exc`` says a database could not be reached or did not answer, whatever its class: one
    of :func:`database_errors`, or any driver error SQLAlchemy raised on a connection it found
    lost (``connection_invalidated``: a dropped or silent link can surface as a
    ``DatabaseError`` or ``ProgrammingError`` as well as an ``OperationalError``), or an error
    raised from one of these (its ``__cause__`` or ``__context__``: a library that wraps the
    driver's error in its own). A bare psycopg ``DatabaseError`` with no SQLSTATE is libpq's
    own word on the link (the server sent no error: a result cut short, a receive that
    timed out), whoever raised it (psycopg's pool under a checkpointer raises it unwrapped)."""
    import psycopg
    import sqlalchemy.exc

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, database_errors()) or (
            isinstance(current, sqlalchemy.exc.DBAPIError) and current.connection_invalidated
        ):
            return True
        if type(current) is psycopg.DatabaseError and current.sqlstate is None:
            return True
        current = current.__cause__ or current.__context__
    return False


class TablesUnavailable(RuntimeError):
    """offpath's tables could not be created or brought up to date in the usage database
    (:meth:`offpath.coordination.runtime.Client.ensure_tables`); the message says why."""


@dataclass(slots=True)
class _Outage:
    since: float  # time.time() of the first failure
    failures: int = 1
    said_at: float = 0.0  # time.monotonic() of the last line about it


class Outages:
    """Which stores are unreachable now, and how often they failed since (thread-safe)."""

    def __init__(self, repeat_s: float = REPEAT_S) -> None:
        self.repeat_s = repeat_s
        self._open: dict[tuple[str, str], _Outage] = {}
        self._guard = threading.Lock()

    def failed(self, store: str, where: str, exc: BaseException, effect: str = "") -> None:
        """Count one failure of ``store`` at ``where`` (a URL without its password, or a
        path). The first one of an outage logs a warning with the cause and ``effect`` (what
        waits for the store); later ones are counted, said again at most every
        :attr:`repeat_s`."""
        key, now = (store, where), time.monotonic()
        with self._guard:
            outage = self._open.get(key)
            if outage is None:
                outage = self._open[key] = _Outage(since=time.time(), said_at=now)
                first = True
            else:
                outage.failures += 1
                first = False
                if now - outage.said_at < self.repeat_s:
                    return
                outage.said_at = now
            failures, since = outage.failures, outage.since
        if first:
            hint = (
                ": offpath's tables are not there and could not be made (run `offpath migrate`)"
                if missing_tables(exc)
                else ""
            )
            log.warning(
                "offpath: the %s at %s cannot be reached (%s)%s%s; further failures are "
                "counted, not logged",
                store,
                where,
                cause(exc),
                hint,
                f"; {effect}" if effect else "",
            )
        else:
            log.warning(
                "offpath: the %s at %s still cannot be reached: %d failures since %s (%s)",
                store,
                where,
                failures,
                time.strftime("%H:%M:%S", time.localtime(since)),
                cause(exc),
            )

    def recovered(self, store: str, where: str) -> None:
        """``store`` at ``where`` answered: end its outage, if one is open, with one line
        giving its count of failures."""
        with self._guard:
            if not self._open:
                return
            outage = self._open.pop((store, where), None)
        if outage is not None:
            log.warning(
                "offpath: the %s at %s answers again (%d failure(s) while it did not)",
                store,
                where,
                outage.failures,
            )

    def down(self, store: str, where: str) -> int:
        """Failures counted in the open outage of ``store`` at ``where`` (0: none is open)."""
        with self._guard:
            outage = self._open.get((store, where))
            return outage.failures if outage else 0


#: The process's outages.
OUTAGES = Outages()


def where(store: str, settings: Settings) -> str:
    """Where ``store`` is for ``settings``: its URL without a password (the SQLite file's
    path for an embedded usage database)."""
    from kombu.utils.url import sanitize_url

    from offpath.stores.db.engine import sqlalchemy_url

    if store == BROKER:
        return sanitize_url(settings.broker_url)
    if store == LEASE_STORE and settings.lock_backend == "redis":
        return sanitize_url(settings.redis_url)
    if settings.database_url.strip():
        return sanitize_url(settings.database_url.strip())
    return sqlalchemy_url(settings).removeprefix("sqlite:///")


def check_checkpointer(url: str, timeout_s: float) -> None:
    """Raise if the checkpointer at ``url`` (a team's agent's, which the worker reads its
    threads from: ``postgresql://...`` or ``sqlite:///path``) cannot be reached: a
    PostgreSQL connection within ``timeout_s``, or a SQLite file that exists. ``ValueError``
    for another URL."""
    from offpath.compaction.settings import POSTGRES_SCHEMES

    if url.startswith(POSTGRES_SCHEMES):
        import psycopg

        psycopg.connect(
            "postgresql://" + url.partition("://")[2], connect_timeout=max(1, round(timeout_s))
        ).close()
    elif url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///")
        import os

        if not os.path.isfile(path):
            raise FileNotFoundError(f"no SQLite file at {path}")
    else:
        raise ValueError(
            f"checkpointer URL must be postgresql://... or sqlite:///path: {url[:40]!r}"
        )
