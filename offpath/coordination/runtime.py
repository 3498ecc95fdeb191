"""What a process needs to queue, run and apply compactions.

* :class:`Client`: the usage database, the job leases and a publisher: what the
  middleware needs inside a user's own agent (no checkpointer, no graph).
* :class:`Runtime`: a client plus offpath's own checkpointer, thread locks and the
  graph it patches threads through: what the API and the worker need. The API opens one
  at start-up (its agent graph); each worker process opens one on its first job (a graph
  with the agent's state and no chat model, tools or middleware).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import cached_property
from typing import Any

import redis
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.graph.state import CompiledStateGraph
from sqlalchemy import event as sa_event
from sqlalchemy.engine import Engine

from offpath.compaction.settings import Settings
from offpath.coordination.jobs import Jobs
from offpath.coordination.locks import DatabaseLocks, Locks, ThreadLocks
from offpath.coordination.outages import TablesUnavailable, cause
from offpath.stores.checkpoints import (
    Checkpoints,
    Preloaded,
    open_checkpoints,
    open_checkpoints_url,
    thread_config,
)
from offpath.stores.db.engine import head_revision, make_engine, migrate, revision_of
from offpath.stores.facts import FactStore
from offpath.stores.leases.claims import Leases
from offpath.stores.leases.key_stores import RedisKeyStore, SqlKeyStore

log = logging.getLogger("offpath.runtime")

#: ``publish(session_id, job_id, options)`` sends a job to the broker; raises on failure.
Publisher = Callable[[str, str, dict[str, Any] | None], None]


#: Most Redis connections one process opens. A worker runs ``WORKER_CONCURRENCY`` (128)
#: jobs at once, each making short Redis calls: they share these, waiting for a free one.
REDIS_MAX_CONNECTIONS = 100


def redis_client(url: str, settings: Settings) -> redis.Redis:
    """A redis-py client whose calls fail within ``PUBLISH_TIMEOUT_S`` when Redis is away.

    Its pool is redis-py's ``BlockingConnectionPool``: with more threads calling at once
    than :data:`REDIS_MAX_CONNECTIONS`, a call waits for a free connection (at most the
    socket timeout, then ``redis.ConnectionError``) where the default pool raises
    ``MaxConnectionsError`` at once (redis-py 8 caps it at 100; make bench's throughput run
    at 256 jobs per process failed jobs so)."""
    timeout = settings.publish_timeout_s
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=REDIS_MAX_CONNECTIONS,
        timeout=max(timeout, 5.0),
        socket_connect_timeout=timeout,
        socket_timeout=max(timeout, 5.0),
        health_check_interval=30,
    )
    return redis.Redis.from_pool(pool)  # closing the client closes its pool


def celery_publisher(settings: Settings) -> Publisher:
    """The publisher that sends ``compact_session`` to the broker and queue of ``settings``
    (imported on first use: a team's agent that never queues a job never loads Celery)."""
    from offpath.coordination.queue import publisher

    return publisher(settings)


#: Builds the graph a :class:`Runtime` patches threads through, from the runtime (its
#: settings, checkpointer and publisher), and names the graph's last node. The API's is
#: its agent graph, :func:`offpath.agent.graph.api_graph` (opened by
#: :func:`~offpath.agent.graph.open_runtime`); the worker's,
#: :func:`offpath.agent.graph.thread_graph`, has the same state and nodes and nothing to run
#: (opened by :func:`~offpath.agent.graph.open_thread_writer`). Coordination does not
#: import the agent side.
GraphFactory = Callable[["Runtime"], tuple[CompiledStateGraph, str]]


class NoAgentGraph(RuntimeError):
    """A :class:`Runtime` opened without a :data:`GraphFactory` was asked for its graph."""


#: After offpath's tables could not be made (the usage database away), how long (s)
#: :meth:`Client.ensure_tables` answers with that failure before it tries again.
TABLES_RETRY_S = 5.0


class Client:
    """The usage database (``engine``), the job leases and a publisher, all from one
    :class:`Settings` (DESIGN.md invariant 19): the publisher, unless one is given, sends to
    that settings' broker and queue.

    ``tables_ready``: offpath's tables are known to be up to date (the API and the worker
    migrate as they start). A client opened without (a team's own agent, :meth:`open`)
    brings them up to date before the engine's first connection is used
    (:meth:`ensure_tables`), so an agent started before ``offpath migrate`` or any worker
    works at once instead of failing every write."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        leases: Leases,
        publish: Publisher | None = None,
        redis_conn: redis.Redis | None = None,
        *,
        tables_ready: bool = True,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.leases = leases
        self._publish = publish
        self._redis = redis_conn
        self._tables_ready = tables_ready
        self._tables_guard = threading.Lock()
        self._tables_failed: tuple[float, str] | None = None  # (monotonic, why)
        if not tables_ready:
            # SQLAlchemy's pool event: each new connection waits for the tables first
            sa_event.listen(engine, "connect", lambda conn, _record: self.ensure_tables(conn))

    @classmethod
    def open(
        cls, settings: Settings, publish: Publisher | None = None, *, make_tables: bool = True
    ) -> Client:
        """A client for ``settings`` (no connection is made until one is used); offpath's
        tables are made or brought up to date before its first connection is used, unless
        ``make_tables`` is False (a reader that must find the database as it is)."""
        engine = make_engine(settings)
        leases, conn = _leases(settings, engine)
        return cls(settings, engine, leases, publish, conn, tables_ready=not make_tables)

    def ensure_tables(self, dbapi_conn: Any = None) -> None:
        """Make offpath's tables, or bring them to the latest revision, once per client:
        :func:`offpath.stores.db.migrate`, the Alembic migration ``offpath migrate`` and the
        worker run, one migrator at a time across processes (an advisory lock on PostgreSQL,
        a file lock beside a SQLite file), on a connection of its own. Given a new driver
        connection of the engine (``dbapi_conn``) to a database that has the tables at some
        revision (one read on it), nothing waits: whether that is the latest is checked, and
        the tables brought there, on a thread of its own (loading Alembic takes a second on a
        loaded host, longer than a short run's first model calls). Raises
        :class:`~offpath.coordination.outages.TablesUnavailable` naming the cause when the
        database cannot be reached or changed, and again without trying for
        :data:`TABLES_RETRY_S` after that."""
        if self._tables_ready:
            return
        with self._tables_guard:
            if self._tables_ready:
                return
            at = revision_of(dbapi_conn) if dbapi_conn is not None else None
            if at is not None:
                self._tables_ready = True
                threading.Thread(
                    target=self._upgrade_from, args=(at,), name="offpath-tables", daemon=True
                ).start()
                return
            failed = self._tables_failed
            if failed is not None and time.monotonic() - failed[0] < TABLES_RETRY_S:
                raise TablesUnavailable(failed[1])
            try:
                done = migrate(self.settings)
            except Exception as exc:
                why = f"offpath's tables could not be made or checked ({cause(exc)})"
                self._tables_failed = (time.monotonic(), why)
                raise TablesUnavailable(why) from exc
            self._tables_ready, self._tables_failed = True, None
        log.info("offpath: %s", done)

    def _upgrade_from(self, revision: str) -> None:
        """Bring tables found at ``revision`` to the latest one, if they are behind."""
        try:
            if revision != head_revision():
                log.info("offpath: %s", migrate(self.settings))
        except Exception as exc:  # the writes that need the new revision say so
            log.warning("offpath: tables at revision %s could not be upgraded: %s", revision, exc)

    @property
    def publish(self) -> Publisher:
        if self._publish is None:
            self._publish = celery_publisher(self.settings)
        return self._publish

    @cached_property
    def facts(self) -> FactStore:
        """Where messages' facts are kept between processes (found as they arrive, read by
        the job that removes them); it keeps none without Redis as the claim store."""
        return FactStore(self._redis, self.settings.redis_key_prefix)

    @cached_property
    def jobs(self) -> Jobs:
        """The one owner of this client's jobs' state (:class:`~offpath.coordination.jobs.Jobs`):
        queued, started, prepared, applied, ended and reverted through it."""
        return Jobs(self.settings, self.engine, self.leases, lambda *job: self.publish(*job))

    def ping_broker(self) -> None:
        """Raise if the Celery broker does not answer within ``PUBLISH_TIMEOUT_S``."""
        url = self.settings.broker_url
        if self.settings.broker_is_redis:
            client = redis_client(url, self.settings)
            try:
                client.ping()
            finally:
                client.close()
            return
        from kombu import Connection

        with Connection(url, connect_timeout=self.settings.publish_timeout_s) as conn:
            conn.ensure_connection(max_retries=1)

    def close(self) -> None:
        for closer in self._closers():
            try:
                closer()
            except Exception as exc:  # closing is best effort
                log.debug("close failed: %s", exc)

    def _closers(self) -> list[Callable[[], object]]:
        jobs = [self.__dict__["jobs"].stop] if "jobs" in self.__dict__ else []
        return [*jobs, self.engine.dispose] + ([self._redis.close] if self._redis else [])


def _leases(settings: Settings, engine: Engine) -> tuple[Leases, redis.Redis | None]:
    conn = (
        None if settings.lock_backend == "database" else redis_client(settings.redis_url, settings)
    )
    store = SqlKeyStore(engine) if conn is None else RedisKeyStore(conn)
    leases = Leases(
        store,
        prefix=settings.redis_key_prefix,
        lease_s=settings.job_lease_s,
        # a queued job's claim lasts as long as the broker may take to hand it out
        queued_ttl_s=settings.celery_visibility_timeout_s,
    )
    return leases, conn


class Runtime(Client):
    """A :class:`Client` plus offpath's own checkpointer, thread locks and the graph it
    patches threads through."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        leases: Leases,
        checkpoints: Checkpoints,
        locks: Locks,
        publish: Publisher | None = None,
        redis_conn: redis.Redis | None = None,
        agent: GraphFactory | None = None,
    ) -> None:
        super().__init__(settings, engine, leases, publish, redis_conn)
        self.checkpoints = checkpoints
        self.locks = locks
        self._agent = agent
        self._graph: CompiledStateGraph | None = None
        self._end_node = ""
        self._other_checkpoints: dict[str, Checkpoints] = {}
        self._guard = threading.Lock()

    @classmethod
    def open(  # type: ignore[override]
        cls,
        settings: Settings,
        *,
        run_migrations: bool = True,
        publish: Publisher | None = None,
        check_connections: bool = False,
        agent: GraphFactory | None = None,
    ) -> Runtime:
        """``agent``: what builds the graph :meth:`patch` writes through (none: a runtime
        that queues and records jobs but raises :class:`NoAgentGraph` on a patch; the API
        opens its runtime with :func:`offpath.agent.graph.open_runtime`, the worker with
        :func:`offpath.agent.graph.open_thread_writer`).
        ``check_connections``: check every pooled PostgreSQL connection before use (the
        API: no request fails on a connection the database dropped); else only those idle
        for a while (the worker: a failed statement there is retried with the job)."""
        if run_migrations:
            migrate(settings)
        checkpoints = open_checkpoints(settings, check_every_checkout=check_connections)
        engine = make_engine(settings, ping_every_checkout=check_connections)
        leases, conn = _leases(settings, engine)
        locks: Locks
        if conn is None:
            locks = DatabaseLocks(
                engine, timeout_s=settings.lock_timeout_s, wait_s=settings.lock_wait_s
            )
        else:
            locks = ThreadLocks(
                conn,
                timeout_s=settings.lock_timeout_s,
                wait_s=settings.lock_wait_s,
                prefix=settings.redis_key_prefix,
            )
        return cls(settings, engine, leases, checkpoints, locks, publish, conn, agent)

    @property
    def graph(self) -> CompiledStateGraph:
        """The graph :meth:`patch` writes through, built on first use (the API's agent graph,
        or the worker's graph of the same state with nothing to run).

        Raises :class:`NoAgentGraph` if the runtime was opened without ``agent``."""
        with self._guard:
            if self._graph is None:
                if self._agent is None:
                    raise NoAgentGraph(
                        "this runtime has no agent graph to patch through: open it with "
                        "offpath.agent.graph.open_runtime or open_thread_writer"
                    )
                self._graph, self._end_node = self._agent(self)
            return self._graph

    def patch(
        self, session_id: str, update: dict[str, Any], base: CheckpointTuple | None = None
    ) -> None:
        """Write ``update`` to the thread's state from outside a run (an imported turn, a
        compaction), as the graph's last node: the thread still reads as finished.

        ``base``: the thread's latest checkpoint, read by the caller under the thread's lock
        (or known unchanged since): the write starts from it instead of reading it again."""
        graph = self.graph
        config = thread_config(session_id)
        if base is not None:
            saver = Preloaded(self.checkpoints.saver, base)
            config["configurable"]["__pregel_checkpointer"] = saver
        graph.update_state(config, update, as_node=self._end_node)

    def checkpoints_for(self, url: str | None) -> Checkpoints:
        """The checkpointer at ``url`` (a user's own agent's), or offpath's own for None."""
        if not url:
            return self.checkpoints
        with self._guard:
            if url not in self._other_checkpoints:
                self._other_checkpoints[url] = open_checkpoints_url(url, self.settings)
            return self._other_checkpoints[url]

    def _closers(self) -> list[Callable[[], object]]:
        others = [c.close for c in self._other_checkpoints.values()]
        return [self.checkpoints.close, *others, *super()._closers()]
