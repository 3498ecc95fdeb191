"""The key stores a thread's claim lives in: :class:`KeyStore` (one atomic compare-and-swap
on string keys that expire), :class:`RedisKeyStore` (a Lua script) and
:class:`SqlKeyStore` (the usage database's ``thread_locks`` table)."""

from __future__ import annotations

import time
from typing import Any, Protocol

import redis
import sqlalchemy as sa


class KeyStore(Protocol):
    """One atomic operation on string keys that expire."""

    def get(self, key: str) -> str | None:
        """The key's value, or None if it is absent or expired."""
        ...

    def swap(self, key: str, expected: str | None, new: str | None, ttl_s: float) -> bool:
        """If the key holds ``expected`` (None: absent), set it to ``new`` expiring after
        ``ttl_s`` (None: delete it) and return True; else change nothing, return False."""
        ...


_SWAP = """
local cur = redis.call('GET', KEYS[1])
if (ARGV[1] == '' and not cur) or cur == ARGV[1] then
  if ARGV[2] == '' then redis.call('DEL', KEYS[1])
  else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
  return 1
end
return 0
"""


class RedisKeyStore:
    """Claims in Redis: ``swap`` is one Lua script (redis-py's ``register_script``)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._swap = client.register_script(_SWAP)

    def get(self, key: str) -> str | None:
        value = self.redis.get(key)
        return value.decode() if isinstance(value, bytes) else value

    def swap(self, key: str, expected: str | None, new: str | None, ttl_s: float) -> bool:
        ttl_ms = max(1, int(ttl_s * 1000))
        return bool(self._swap(keys=[key], args=[expected or "", new or "", ttl_ms]))


class SqlKeyStore:
    """Claims in the usage database's ``thread_locks`` table (``LOCK_BACKEND=database``)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def get(self, key: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(
                sa.text("SELECT token FROM thread_locks WHERE name = :n AND expires_at >= :now"),
                {"n": key, "now": time.time()},
            ).scalar()

    def swap(self, key: str, expected: str | None, new: str | None, ttl_s: float) -> bool:
        now = time.time()
        args = {"n": key, "t": expected, "v": new, "e": now + ttl_s, "now": now}
        with self.engine.begin() as conn:
            conn.execute(
                sa.text("DELETE FROM thread_locks WHERE name = :n AND expires_at < :now"), args
            )
            if expected is None:
                if new is None:
                    return (
                        conn.execute(
                            sa.text("SELECT 1 FROM thread_locks WHERE name = :n"), args
                        ).first()
                        is None
                    )
                try:
                    with conn.begin_nested():
                        conn.execute(
                            sa.text(
                                "INSERT INTO thread_locks (name, token, expires_at) "
                                "VALUES (:n, :v, :e)"
                            ),
                            args,
                        )
                except sa.exc.IntegrityError:
                    return False
                return True
            if new is None:
                sql = "DELETE FROM thread_locks WHERE name = :n AND token = :t"
            else:
                sql = "UPDATE thread_locks SET token = :v, expires_at = :e WHERE name = :n AND token = :t"
            return bool(conn.execute(sa.text(sql), args).rowcount)


def reconciler_key(prefix: str) -> str:
    """The key that holds when the reconciler last finished a pass (``time.time()`` as text;
    it lasts a day): written by :func:`offpath.worker.reconciler.reconcile`, read by
    ``offpath beat --check``."""
    return f"{prefix}:reconciler:last"
