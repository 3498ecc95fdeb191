"""The thread lock lasts while its holder lives and ``LOCK_TIMEOUT_S`` after it dies
(``offpath/coordination/locks.py``), on both lock stores: Redis and the usage database
(SQLite here). A turn longer than the lock's time to live keeps the thread; a process
killed while holding it frees the thread within that time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
from stack import REDIS_URL, ROOT

from offpath.coordination.locks import DatabaseLocks, ThreadBusy, ThreadLocks

TTL_S = 1.5


def _locks(kind: str, folder: Path, prefix: str) -> ThreadLocks | DatabaseLocks:
    if kind == "redis":
        return ThreadLocks(
            redis.Redis.from_url(REDIS_URL), timeout_s=TTL_S, wait_s=0.2, prefix=prefix
        )
    from offpath.config import load_settings
    from offpath.stores.db.engine import make_engine, migrate

    settings = load_settings(data_dir=str(folder))
    migrate(settings)
    return DatabaseLocks(make_engine(settings), timeout_s=TTL_S, wait_s=0.2)


@pytest.mark.parametrize("kind", ["redis", "database"])
def test_a_turn_longer_than_the_locks_time_to_live_keeps_the_thread(kind, tmp_path):
    prefix = f"keeper-{uuid.uuid4().hex[:6]}"
    mine, other = _locks(kind, tmp_path, prefix), _locks(kind, tmp_path, prefix)
    with mine.turn("t", run=True):
        time.sleep(3 * TTL_S)  # three lifetimes: only the keeper's extensions keep it
        with pytest.raises(ThreadBusy):
            with other.turn("t"):
                pass
    with other.turn("t"):  # released at the end of the turn, not left to expire
        pass


HOLD = """
import sys, time
sys.path.insert(0, {tests!r})
from test_lock_keeper import _locks
from pathlib import Path
locks = _locks({kind!r}, Path({folder!r}), {prefix!r})
with locks.turn("t", run=True):
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("kind", ["redis", "database"])
def test_a_holder_killed_frees_the_thread_within_the_locks_time_to_live(kind, tmp_path):
    prefix = f"keeper-{uuid.uuid4().hex[:6]}"
    code = HOLD.format(
        tests=str(Path(__file__).parent), kind=kind, folder=str(tmp_path), prefix=prefix
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{Path(__file__).parents[1]}"},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        other = _locks(kind, tmp_path, prefix)
        time.sleep(2 * TTL_S)  # alive: its keeper extends the lock
        with pytest.raises(ThreadBusy):
            with other.turn("t"):
                pass
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        killed = time.monotonic()
        while True:
            try:
                with other.turn("t"):
                    break
            except ThreadBusy:
                assert time.monotonic() - killed < TTL_S + 5, "the dead holder's lock stayed"
                time.sleep(0.05)
    finally:
        holder.kill()


def test_a_patch_says_it_waits_only_while_it_waits_and_a_turn_lets_it_go_first():
    """A patch takes a free lock at once, writing no marker; one that must wait for a turn
    marks the thread while it waits, so that the next turn lets it go first, and takes the lock
    once the turn ends."""
    import threading

    prefix = f"marker-{uuid.uuid4().hex[:6]}"
    turns = _locks("redis", Path("."), prefix)
    patches = ThreadLocks(redis.Redis.from_url(REDIS_URL), timeout_s=TTL_S, wait_s=5, prefix=prefix)
    assert isinstance(turns, ThreadLocks)
    marked: list[str] = []
    real_set = patches.redis.set
    patches.redis.set = lambda key, *a, **k: marked.append(key) or real_set(key, *a, **k)
    waiting = patches._waiting_key("t")
    with patches.patch("t"):
        assert waiting not in marked  # free: taken at once
    entered = threading.Event()

    def patch() -> None:
        with patches.patch("t"):
            entered.set()

    with turns.turn("t"):
        worker = threading.Thread(target=patch)
        worker.start()
        deadline = time.monotonic() + 5
        while not turns.redis.exists(waiting) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert marked.count(waiting) == 1 and not entered.is_set()
    worker.join(10)
    assert entered.is_set() and not turns.redis.exists(waiting)
    turns.redis.set(waiting, "patch:x", px=5_000)  # what a waiting patch leaves
    started = time.monotonic()
    with turns.turn("t"):  # a turn lets a waiting patch go first, for up to its wait
        assert time.monotonic() - started >= turns.wait_s
    turns.redis.delete(waiting)


def test_a_turn_whose_wait_for_a_patch_runs_out_during_a_slow_read_still_takes_the_free_lock():
    """A turn that let a waiting patch go first for its whole wait takes the lock if it is
    free then, however slow the lock store was during that wait: a patch that never came is
    no reason to refuse the turn."""
    prefix = f"slow-{uuid.uuid4().hex[:6]}"
    turns = ThreadLocks(redis.Redis.from_url(REDIS_URL), timeout_s=TTL_S, wait_s=0.2, prefix=prefix)
    waiting = turns._waiting_key("t")
    turns.redis.set(waiting, "patch:x", px=5_000)  # a patch said it waits and never took the lock
    real_get = turns.redis.get
    slowed: list[str] = []

    def slow_get(key, *a, **k):  # the holder read that straddles the end of the wait
        if not slowed:
            slowed.append(key)
            time.sleep(turns.wait_s + 0.05)
        return real_get(key, *a, **k)

    turns.redis.get = slow_get
    try:
        with turns.turn("t"):
            assert slowed and turns.redis.get(turns._key("t")).startswith(b"turn:")
    finally:
        turns.redis.delete(waiting)
