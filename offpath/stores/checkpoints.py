"""One checkpointer factory for the API and the worker, and reading a thread from it.

``DATABASE_URL`` pointing at PostgreSQL: ``PostgresSaver`` on a psycopg
connection pool (``setup()`` once per process). Otherwise ``SqliteSaver`` on
``DATA_DIR/checkpoints.db`` with WAL and a busy timeout, so the API and worker
processes can share the file.

:func:`read_thread` reads a thread's latest checkpoint and its messages in one read, no
graph (a ``messages`` channel kept as a ``DeltaChannel`` rebuilt from its history).
"""

from __future__ import annotations

import sqlite3
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage, RemoveMessage, convert_to_messages
from langchain_core.runnables import RunnableConfig
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from offpath.compaction.patch import patched
from offpath.compaction.settings import POSTGRES_SCHEMES, Settings
from offpath.stores.db.engine import (
    CHECKPOINTS_LOCK_KEY,
    file_lock,
    libpq_options,
    pg_session_lock,
    set_statement_timeout,
)

#: How long a SQLite writer waits for another process's write, in seconds.
SQLITE_BUSY_TIMEOUT_S = 30


def thread_config(session_id: str) -> RunnableConfig:
    """The LangGraph config that names thread ``session_id``."""
    return {"configurable": {"thread_id": session_id}}


def is_postgres(settings: Settings) -> bool:
    return settings.database_url.startswith(("postgresql", "postgres:"))


def postgres_conninfo(settings: Settings) -> str:
    """``DATABASE_URL`` as a libpq URL (a SQLAlchemy ``+driver`` suffix removed)."""
    scheme, sep, rest = settings.database_url.partition("://")
    return "postgresql://" + rest if sep else settings.database_url


class Checkpoints(AbstractContextManager["Checkpoints"]):
    """Owns a checkpointer and what it runs on (pool or connection); close it when done."""

    def __init__(self, saver: BaseCheckpointSaver, closer: Any) -> None:
        self.saver = saver
        self._closer = closer

    def prune(self, session_id: str, keep: int) -> bool:
        """Once the thread has more than ``keep`` checkpoints, delete all but its latest (with
        their pending writes and the blobs only they held): storage stays bounded, and the
        originals a compaction removed are in the archive, not in old checkpoints. PostgreSQL:
        LangGraph's own ``prune(strategy="keep_latest")``, safe
        against a run appending meanwhile; SQLite: the same in one write transaction.
        ``keep=0``: never. Returns whether it pruned."""
        if keep <= 0:
            return False
        if hasattr(self.saver, "prune") and type(self.saver).__name__ == "PostgresSaver":
            with self._closer.connection() as conn:
                n = conn.execute(
                    "SELECT count(*) AS n FROM checkpoints WHERE thread_id = %s "
                    "AND checkpoint_ns = ''",
                    (session_id,),
                ).fetchone()["n"]
            if n <= keep:
                return False
            self.saver.prune([session_id], strategy="keep_latest")
            return True
        conn = self._closer
        with self.saver.lock:  # type: ignore[attr-defined]
            (n,) = conn.execute(
                "SELECT count(*) FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ''",
                (session_id,),
            ).fetchone()
            if n <= keep:
                return False
            # "older than the latest", with the latest read by the DELETE itself, under the
            # write lock it holds: another process's checkpoint written meanwhile (a worker's
            # compaction patch) is never taken for an old one. Reading the latest first and
            # deleting "all but it" afterwards would delete such a patch (a job recorded
            # applied while the thread holds all its originals again).
            with conn:  # one transaction: the first DELETE takes SQLite's write lock
                for table in ("writes", "checkpoints"):
                    conn.execute(
                        f"DELETE FROM {table} WHERE thread_id = ? AND checkpoint_ns = '' "
                        "AND checkpoint_id < (SELECT max(checkpoint_id) FROM checkpoints "
                        "WHERE thread_id = ? AND checkpoint_ns = '')",
                        (session_id, session_id),
                    )
        return True

    def changed_since(self, session_id: str, checkpoint_id: str | None) -> bool:
        """Whether the thread's latest checkpoint is another than ``checkpoint_id`` (the one a
        job read): one indexed look-up of its id, not a read of the thread. True when it
        cannot tell (then the caller reads the thread again)."""
        if checkpoint_id is None:
            return True
        q = (
            "SELECT checkpoint_id FROM checkpoints WHERE thread_id = {p} AND checkpoint_ns = '' "
            "ORDER BY checkpoint_id DESC LIMIT 1"
        )
        name = type(self.saver).__name__
        if name == "PostgresSaver":
            with self._closer.connection() as conn:
                row = conn.execute(q.format(p="%s"), (session_id,)).fetchone()
            latest = row["checkpoint_id"] if row else None
        elif name == "SqliteSaver":
            with self.saver.lock:  # type: ignore[attr-defined]
                row = self._closer.execute(q.format(p="?"), (session_id,)).fetchone()
            latest = row[0] if row else None
        else:
            return True
        return latest != checkpoint_id

    def ping(self) -> None:
        """Raise if the checkpoint store does not answer."""
        self.saver.get_tuple({"configurable": {"thread_id": "__healthz__", "checkpoint_ns": ""}})

    def close(self) -> None:
        self._closer.close()

    def __exit__(self, *exc: object) -> None:
        self.close()


class Preloaded(BaseCheckpointSaver):
    """``saver``, except that reading the latest checkpoint answers ``base``, a checkpoint
    read already (and checked to be the latest, under the thread's lock): a patch through
    ``graph.update_state`` then writes without reading the thread a second time. Lent to the
    graph through its config (``__pregel_checkpointer``), as LangGraph lends a subgraph
    its parent's saver."""

    def __init__(self, saver: BaseCheckpointSaver, base: CheckpointTuple) -> None:
        super().__init__(serde=saver.serde)
        self.saver = saver
        self.base = base

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        if config.get("configurable", {}).get("checkpoint_id"):
            return self.saver.get_tuple(config)
        return self.base

    def list(self, *args: Any, **kwargs: Any) -> Iterator[CheckpointTuple]:
        return self.saver.list(*args, **kwargs)

    def put(self, *args: Any, **kwargs: Any) -> RunnableConfig:
        return self.saver.put(*args, **kwargs)

    def put_writes(self, *args: Any, **kwargs: Any) -> None:
        self.saver.put_writes(*args, **kwargs)

    def get_next_version(self, current: Any, channel: Any) -> Any:
        return self.saver.get_next_version(current, channel)


def open_checkpoints(settings: Settings, *, check_every_checkout: bool = False) -> Checkpoints:
    """Open the checkpointer the settings ask for and make sure its tables exist.
    ``check_every_checkout``: psycopg_pool checks each connection it hands out (the API),
    not only those idle over :data:`IDLE_CHECK_S` (the worker)."""
    if is_postgres(settings):
        return _postgres(
            postgres_conninfo(settings),
            max(4, min(settings.worker_concurrency, 20)),
            settings,
            check_every_checkout,
        )
    return _sqlite(Path(settings.data_dir) / "checkpoints.db")


def open_checkpoints_url(url: str, settings: Settings, pool_size: int | None = None) -> Checkpoints:
    """Open the checkpointer at ``url``: ``postgresql://...`` or ``sqlite:///path/to/file.db``
    (a user's own agent's; the worker reads its threads). ``pool_size``: most PostgreSQL
    connections (default: the worker's concurrency, 4 to 20; a process running many agents at
    once wants about one per concurrent run, as LangGraph writes each step's checkpoint).
    ``ValueError`` for another URL."""
    if url.startswith(POSTGRES_SCHEMES):
        size = pool_size or max(4, min(settings.worker_concurrency, 20))
        return _postgres("postgresql://" + url.partition("://")[2], size, settings)
    if url.startswith("sqlite:///"):
        return _sqlite(Path(url.removeprefix("sqlite:///")))
    raise ValueError(
        f"checkpointer URL must be postgresql://... or sqlite:///path, got {url[:40]!r}"
    )


#: A pooled connection idle longer than this (s) is checked before it is handed out.
IDLE_CHECK_S = 1.0
_idle_since: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def _stamp_idle(conn: Any) -> None:
    """The pool's ``reset`` callback: the connection goes back idle now."""
    _idle_since[conn] = time.monotonic()


def _check_when_idle(conn: Any) -> None:
    """The pool's ``check`` at checkout, only for a connection idle over :data:`IDLE_CHECK_S`
    (a database restart shows there): checking at every checkout costs a round trip per
    read or write. A connection that breaks in use is discarded by the pool on return."""
    from psycopg_pool import ConnectionPool

    since = _idle_since.get(conn)
    if since is not None and time.monotonic() - since >= IDLE_CHECK_S:
        ConnectionPool.check_connection(conn)


def _postgres(
    conninfo: str, pool_size: int, settings: Settings, check_every_checkout: bool = False
) -> Checkpoints:
    """LangGraph's PostgreSQL saver on a psycopg pool whose connections have the settings'
    keepalives and timeouts (:func:`~offpath.stores.db.engine.libpq_options`, the statement
    timeout set on each); a caller waits at most ``DATABASE_CONNECT_TIMEOUT_S`` (10 s if 0)
    plus 5 s for a connection of a full pool, then ``PoolTimeout``."""
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    statement_timeout = settings.database_statement_timeout_s

    def configure(conn: Any) -> None:
        set_statement_timeout(conn, statement_timeout)  # autocommit: set for the session

    pool = ConnectionPool(
        conninfo,
        min_size=1,
        max_size=pool_size,
        kwargs={
            "autocommit": True,
            "prepare_threshold": 0,
            "row_factory": dict_row,
            **libpq_options(settings),
        },
        configure=configure,
        timeout=(settings.database_connect_timeout_s or 10) + 5,
        open=True,
        check=ConnectionPool.check_connection if check_every_checkout else _check_when_idle,
        reset=_stamp_idle,
    )
    saver = PostgresSaver(pool)
    try:
        # one set-up at a time across processes: concurrent ones on a fresh database
        # collide (UniqueViolation); setup() commits each statement before returning
        with pg_session_lock(conninfo, CHECKPOINTS_LOCK_KEY):
            saver.setup()
    except BaseException:
        pool.close()
        raise
    return Checkpoints(saver, pool)


def _sqlite(path: Path) -> Checkpoints:
    from langgraph.checkpoint.sqlite import SqliteSaver

    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), check_same_thread=False, timeout=SQLITE_BUSY_TIMEOUT_S)
    try:
        with file_lock(path.with_name(path.name + ".setup.lock")):  # one set-up at a time
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
            saver = SqliteSaver(conn)
            saver.setup()
    except BaseException:
        conn.close()
        raise
    return Checkpoints(saver, conn)


@dataclass(frozen=True, slots=True)
class Thread:
    """A thread as read from its latest checkpoint: its messages and the checkpoint itself
    (``base``, None for a thread with none), so that a patch can start from it."""

    messages: list[BaseMessage]
    base: CheckpointTuple | None = None

    @property
    def checkpoint_id(self) -> str | None:
        return self.base.checkpoint["id"] if self.base is not None else None

    @property
    def written_at(self) -> float | None:
        """When its latest checkpoint was written (epoch seconds, from the checkpoint's ``ts``);
        None for a thread with none, or a ``ts`` that does not parse."""
        ts = self.base.checkpoint.get("ts") if self.base is not None else None
        try:
            at = datetime.fromisoformat(str(ts)) if ts else None
        except ValueError:
            return None
        return None if at is None else (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def read_thread(saver: BaseCheckpointSaver, session_id: str, ns: str | None = None) -> Thread:
    """The thread's latest checkpoint and its messages (one read, no graph; a ``messages``
    channel kept as a ``DeltaChannel``, deepagents' default, is rebuilt from its history);
    ``ns``: the checkpoint namespace of a subgraph's thread (None: the root's)."""
    config = {"configurable": {"thread_id": session_id, "checkpoint_ns": ns or ""}}
    tup = saver.get_tuple(config)  # type: ignore[arg-type]
    if tup is None:
        return Thread([])
    return Thread(checkpoint_messages(saver, tup), tup)


def checkpoint_messages(saver: BaseCheckpointSaver, tup: CheckpointTuple) -> list[BaseMessage]:
    """The ``messages`` channel's value at checkpoint ``tup``. A ``DeltaChannel`` (deepagents
    keeps its messages in one) stores nothing at most checkpoints, or a snapshot now and then:
    its value is its nearest snapshot with the writes since replayed through ``add_messages``,
    as LangGraph itself rebuilds it (``get_delta_channel_history``)."""
    checkpoint = tup.checkpoint
    stored = checkpoint.get("channel_values", {}).get("messages")
    if isinstance(stored, _DeltaSnapshot):
        stored = stored.value
    if stored is not None or "messages" not in checkpoint.get("channel_versions", {}):
        return list(stored or [])
    history = saver.get_delta_channel_history(config=tup.config, channels=["messages"])
    found = history.get("messages") or {"writes": []}
    channel = DeltaChannel(_add_each, list).from_checkpoint(found.get("seed"))
    channel.replay_writes(found["writes"])
    return list(channel.get())


def _add_each(state: list[BaseMessage], writes: Sequence[Any]) -> list[BaseMessage]:
    """A ``DeltaChannel`` reducer: ``add_messages`` over each write in turn, except that a
    ``RemoveMessage`` of an id not there (any more) is skipped, as the reducers a
    ``DeltaChannel`` of messages is used with skip it (deepagents', LangGraph's
    ``_messages_delta_reducer``); ``add_messages`` would raise, and the thread the graph
    reads fine could not be read here."""
    for write in writes:
        present = {m.id for m in state}
        batch = []
        for m in convert_to_messages(write if isinstance(write, list) else [write]):
            if isinstance(m, RemoveMessage):
                if m.id == REMOVE_ALL_MESSAGES:
                    present = set()
                elif m.id not in present:
                    continue
                present.discard(m.id)
            else:
                present.add(m.id)
            batch.append(m)
        state = patched(state, batch)
    return state


def read_messages(saver: BaseCheckpointSaver, session_id: str) -> list[BaseMessage]:
    """The thread's messages, read straight from its latest checkpoint (one read, no graph)."""
    return read_thread(saver, session_id).messages
