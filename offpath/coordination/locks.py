"""Per-thread write lock, on Redis (redis-py's ``Lock``).

One writer per thread (DESIGN.md invariant 6): a turn and a compaction patch on
the same thread are serialized by one Redis lock per thread. Its token says who
holds it (``turn:...`` for an appended turn, ``run:...`` for an agent run,
``patch:...``):

* a turn that finds another turn or run holding the lock fails at once with
  :class:`ThreadBusy` (the API answers 409); one that finds a patch holding the
  lock, or waiting for it, waits (a patch is short: re-read, write, one insert),
  at most ``LOCK_WAIT_S``: a client posting turns back to back cannot keep a
  patch out;
* a patch waits for a turn up to ``LOCK_WAIT_S`` and otherwise raises
  :class:`LockUnavailable` (the job retries later); it does not wait for an agent
  run (:class:`RunInProgress`): the job leaves its compaction prepared, and the
  run's middleware applies it. It never holds the lock across the LLM call.

A lock lives ``LOCK_TIMEOUT_S`` and its holder's process extends it every third of
that while it holds it (a :class:`~offpath.stores.renewal.Renewer`, one thread per lock
store): a turn, run or patch of any length keeps it, and a holder that died (its process
killed) frees the thread within ``LOCK_TIMEOUT_S``.

When Redis cannot be reached a turn falls back to a lock local to this API
process and logs it (turns keep working through a broker outage; a patch cannot
run then, since it needs Redis too).

Which job may compact a thread is a different question, answered by the job
leases of :mod:`offpath.stores.leases`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import redis
import sqlalchemy as sa
from redis.exceptions import LockError, RedisError

from offpath.coordination.logs import tag
from offpath.stores.renewal import Renewer

log = logging.getLogger("offpath.locks")


class ThreadBusy(Exception):
    """Another turn is being taken on this thread right now."""


class LockUnavailable(Exception):
    """The thread's lock could not be taken in time (or Redis is unreachable)."""


class RunInProgress(Exception):
    """An agent run holds the thread: a patch must not wait for it (the run's middleware
    applies the prepared compaction at its next model call)."""


class Locks(Protocol):
    """What the API and the worker need: the thread lock for a turn or a patch.
    Backends: :class:`ThreadLocks` (Redis), :class:`DatabaseLocks`."""

    def turn(self, session_id: str, run: bool = False) -> Any: ...
    def patch(self, session_id: str) -> Any: ...


def _lost(session_id: str) -> None:
    log.error(
        "[%s] thread lock expired while held (this process stalled longer than two thirds "
        "of LOCK_TIMEOUT_S)",
        tag(session_id),
    )


class ThreadLocks:
    """Thread locks in one Redis, under ``prefix``."""

    def __init__(
        self, client: redis.Redis, *, timeout_s: float, wait_s: float, prefix: str = "offpath"
    ) -> None:
        self.redis = client
        self.timeout_s = timeout_s
        self.wait_s = wait_s
        self.prefix = prefix
        self._local: weakref.WeakValueDictionary[str, threading.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._local_guard = threading.Lock()
        self.keeper = Renewer(timeout_s / 3, "offpath-lock-keeper")

    def _key(self, session_id: str) -> str:
        return f"{self.prefix}:lock:thread:{session_id}"

    def _waiting_key(self, session_id: str) -> str:
        return f"{self.prefix}:lock:patch-waiting:{session_id}"

    # --- the write lock ---------------------------------------------------------------

    @contextmanager
    def turn(self, session_id: str, run: bool = False) -> Iterator[None]:
        """Hold the thread's lock for one turn (``run``: an agent run, which a patch does not
        wait for); :class:`ThreadBusy` if another turn has it."""
        lock = self.redis.lock(self._key(session_id), timeout=self.timeout_s, thread_local=False)
        token = f"{'run' if run else 'turn'}:{uuid.uuid4().hex}"
        try:
            acquired = self._acquire_for_turn(lock, token, self._waiting_key(session_id))
        except RedisError as exc:
            log.warning(
                "[%s] lock store unreachable (%s); using a process-local lock", tag(session_id), exc
            )
            with self._local_lock(session_id):
                yield
            return
        if not acquired:
            raise ThreadBusy("a compaction patch is being written to this session; try again")
        with self._kept(lock, session_id):
            yield

    def _acquire_for_turn(self, lock: redis.lock.Lock, token: str, waiting: str) -> bool:
        """A turn lets a patch that is waiting for the lock go first (a patch is short), or a
        client posting turns back to back would keep every patch out."""
        deadline = time.monotonic() + self.wait_s
        while True:
            # one clock reading per round: the round that finds the wait over also tries the lock
            waited_out = time.monotonic() >= deadline
            patch_waits = not waited_out and self.redis.exists(waiting)
            if not patch_waits and lock.acquire(blocking=False, token=token):
                return True
            holder = self.redis.get(lock.name)
            if isinstance(holder, bytes) and holder.startswith((b"turn:", b"run:")):
                raise ThreadBusy("another turn is in progress on this session")
            if waited_out:
                return False
            time.sleep(0.005)

    @contextmanager
    def _local_lock(self, session_id: str) -> Iterator[None]:
        with self._local_guard:
            lock = self._local.get(session_id)
            if lock is None:
                lock = threading.Lock()
                self._local[session_id] = lock
        if not lock.acquire(blocking=False):
            raise ThreadBusy("another turn is in progress on this session")
        try:
            yield
        finally:
            lock.release()

    @contextmanager
    def patch(self, session_id: str) -> Iterator[None]:
        """Hold the thread's lock for one patch. Turns arriving meanwhile wait for it (while
        the patch waits for the lock, a marker says so). Raises :class:`RunInProgress` at once if an agent
        run holds the thread, :class:`LockUnavailable` if the lock is not had in time."""
        lock = self.redis.lock(self._key(session_id), timeout=self.timeout_s, thread_local=False)
        token = f"patch:{uuid.uuid4().hex}"
        waiting = self._waiting_key(session_id)
        deadline = time.monotonic() + self.wait_s
        try:
            # a free lock is taken at once; a patch that must wait for it says so meanwhile
            if not (acquired := lock.acquire(blocking=False, token=token)):
                self.redis.set(waiting, token, px=max(1, int(self.wait_s * 1000)))
                try:
                    while not (acquired := lock.acquire(blocking=False, token=token)):
                        holder = self.redis.get(lock.name)
                        if isinstance(holder, bytes) and holder.startswith(b"run:"):
                            raise RunInProgress("an agent run holds the thread")
                        if time.monotonic() >= deadline:
                            break
                        time.sleep(0.005)
                finally:
                    self.redis.delete(waiting)
        except RedisError as exc:
            raise LockUnavailable(f"lock store unreachable: {exc}") from exc
        if not acquired:
            raise LockUnavailable(f"the session's lock was busy for {self.wait_s:g}s")
        with self._kept(lock, session_id):
            yield

    @contextmanager
    def _kept(self, lock: redis.lock.Lock, session_id: str) -> Iterator[None]:
        """Hold ``lock`` (acquired) extended by the keeper; release it at the end."""

        def extend() -> bool:
            try:
                return bool(lock.extend(self.timeout_s, replace_ttl=True))
            except LockError:  # no longer ours
                return False

        self.keeper.hold(
            lock, extend, lambda: _lost(session_id), f"the thread lock of {tag(session_id)}"
        )
        try:
            yield
        finally:
            self.keeper.drop(lock)
            _release(lock, session_id)


def _release(lock: redis.lock.Lock, session_id: str) -> None:
    try:
        lock.release()
    except LockError:
        log.error(
            "[%s] thread lock expired before it was released (its process stalled)", tag(session_id)
        )
    except RedisError as exc:
        log.warning(
            "[%s] could not release the thread lock (%s); it will expire", tag(session_id), exc
        )


class DatabaseLocks:
    """The same locks in the usage database, for a single machine without Redis (the
    embedded demo: ``LOCK_BACKEND=database``). Rows of ``thread_locks`` expire like Redis
    keys; a row's insert is the atomic acquire."""

    def __init__(self, engine: Any, *, timeout_s: float, wait_s: float) -> None:
        self.engine = engine
        self.timeout_s = timeout_s
        self.wait_s = wait_s
        self.keeper = Renewer(timeout_s / 3, "offpath-lock-keeper")

    def _extend(self, name: str, token: str) -> bool:
        with self.engine.begin() as conn:
            res = conn.execute(
                sa.text("UPDATE thread_locks SET expires_at = :e WHERE name = :n AND token = :t"),
                {"n": name, "t": token, "e": time.time() + self.timeout_s},
            )
            return bool(res.rowcount)

    @contextmanager
    def _kept(self, name: str, token: str, session_id: str) -> Iterator[None]:
        what = f"the thread lock of {tag(session_id)}"
        self.keeper.hold(token, lambda: self._extend(name, token), lambda: _lost(session_id), what)
        try:
            yield
        finally:
            self.keeper.drop(token)
            self._release(name, token)

    def _try(self, name: str, token: str, ttl: float) -> bool:
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(
                sa.text("DELETE FROM thread_locks WHERE name = :n AND expires_at < :now"),
                {"n": name, "now": now},
            )
            try:
                with conn.begin_nested():
                    conn.execute(
                        sa.text(
                            "INSERT INTO thread_locks (name, token, expires_at) VALUES (:n, :t, :e)"
                        ),
                        {"n": name, "t": token, "e": now + ttl},
                    )
            except sa.exc.IntegrityError:
                return False
        return True

    def _holder(self, name: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(
                sa.text("SELECT token FROM thread_locks WHERE name = :n"), {"n": name}
            ).scalar()

    def _release(self, name: str, token: str) -> bool:
        with self.engine.begin() as conn:
            res = conn.execute(
                sa.text("DELETE FROM thread_locks WHERE name = :n AND token = :t"),
                {"n": name, "t": token},
            )
            return bool(res.rowcount)

    @contextmanager
    def turn(self, session_id: str, run: bool = False) -> Iterator[None]:
        name, token = f"thread:{session_id}", f"{'run' if run else 'turn'}:{uuid.uuid4().hex}"
        deadline = time.monotonic() + self.wait_s
        while not self._try(name, token, self.timeout_s):
            holder = self._holder(name) or ""
            if holder.startswith(("turn:", "run:")):
                raise ThreadBusy("another turn is in progress on this session")
            if time.monotonic() >= deadline:
                raise ThreadBusy("a compaction patch is being written to this session; try again")
            time.sleep(0.02)
        with self._kept(name, token, session_id):
            yield

    @contextmanager
    def patch(self, session_id: str) -> Iterator[None]:
        name, token = f"thread:{session_id}", f"patch:{uuid.uuid4().hex}"
        deadline = time.monotonic() + self.wait_s
        while not self._try(name, token, self.timeout_s):
            if (self._holder(name) or "").startswith("run:"):
                raise RunInProgress("an agent run holds the thread")
            if time.monotonic() >= deadline:
                raise LockUnavailable(f"the session's lock was busy for {self.wait_s:g}s")
            time.sleep(0.02)
        with self._kept(name, token, session_id):
            yield
