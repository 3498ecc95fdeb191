"""Each message's facts, found once where the message arrives and kept in Redis by the
message's key (:func:`offpath.compaction.facts.extraction.key_digest`), where the job that
removes it reads them (:meth:`FactStore.preload`) instead of finding them again: the fact
guard, the archive's index and the loss report of a compaction then merge facts found before.

Best effort: with Redis away, an entry lapsed or never written, the job finds the facts of
those messages itself (what it did without this store). Only with Redis as the claim store
(``LOCK_BACKEND=redis``); with the database (``redis`` None) the store keeps nothing and each
worker finds the facts it needs.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import orjson
import redis
from langchain_core.messages import BaseMessage

from offpath.compaction.facts.extraction import Seen, found_now, key_digest, take

log = logging.getLogger("offpath.facts")

#: How long (s) a message's facts are kept: a thread's messages are removed by a compaction
#: within hours of arriving, or read again by the job that needs them (then found there).
FACTS_TTL_S = 6 * 3600
#: Most messages one :meth:`FactStore.remember` reads (the first turn seen of a long thread).
MAX_REMEMBERED = 256
#: Key digests one process remembers having stored (16 bytes and a dict slot each).
STORED_KEPT = 65_536


def encode(message: BaseMessage) -> bytes:
    """The facts of ``message``, found now, as bytes for :func:`decode` in another process:
    JSON, ``[lines, facts]``, each fact an array that names its line by index (the facts of
    one log line share it)."""
    lines: dict[str, int] = {}
    facts = [(*s[:3], lines.setdefault(s.line, len(lines)), *s[4:]) for s in found_now(message)]
    return orjson.dumps([list(lines), facts])


def decode(raw: bytes) -> tuple[Seen, ...]:
    """What :func:`encode` wrote, as the facts of its message; ValueError if it is not."""
    try:
        lines, facts = orjson.loads(raw)
        return tuple(
            Seen(v, k, mid, lines[line], tuple(found), *flags)
            for v, k, mid, line, found, *flags in facts
        )
    except (TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"not a message's facts: {exc}") from exc


class FactStore:
    """Messages' facts in Redis under ``<prefix>:facts:<key digest, hex>``, expiring after
    :data:`FACTS_TTL_S`; ``client`` None: none kept (each method does nothing). Thread-safe."""

    def __init__(self, client: redis.Redis | None, prefix: str, ttl_s: float = FACTS_TTL_S) -> None:
        self.redis = client
        self.prefix = prefix
        self.ttl_s = ttl_s
        self._stored: OrderedDict[bytes, None] = OrderedDict()  # digests this process put
        self._lock = threading.Lock()

    def key(self, digest: bytes) -> str:
        return f"{self.prefix}:facts:{digest.hex()}"

    def remember(self, messages: Sequence[BaseMessage]) -> int:
        """Find and store the facts of the messages a turn added to a thread: those after
        the last one this process stored (at most :data:`MAX_REMEMBERED`, newest first).
        Returns how many were stored; a Redis failure is logged, never raised."""
        if self.redis is None:
            return 0
        fresh: dict[bytes, BaseMessage] = {}
        for m in reversed(messages):
            digest = key_digest(m)
            if digest in self._stored or len(fresh) >= MAX_REMEMBERED:
                break
            fresh[digest] = m
        if not fresh:
            return 0
        try:
            with self.redis.pipeline(transaction=False) as pipe:
                for digest, m in fresh.items():
                    pipe.set(self.key(digest), encode(m), ex=int(self.ttl_s))
                pipe.execute()
        except redis.RedisError as exc:
            log.warning("facts not stored (%d messages): %s", len(fresh), exc)
            return 0
        with self._lock:
            for digest in fresh:
                self._stored[digest] = None
            while len(self._stored) > STORED_KEPT:
                self._stored.popitem(last=False)
        return len(fresh)

    def fetch(self, digests: list[bytes]) -> Mapping[bytes, bytes]:
        """The stored facts of those of ``digests`` Redis holds (``{}`` with Redis away)."""
        if not digests or self.redis is None:
            return {}
        try:
            values = self.redis.mget([self.key(d) for d in digests])
        except redis.RedisError as exc:
            log.warning("facts not read (%d messages): %s", len(digests), exc)
            return {}
        # bytes: the client does not decode responses
        return {d: v for d, v in zip(digests, values, strict=True) if isinstance(v, bytes)}

    def preload(self, messages: Sequence[BaseMessage]) -> int:
        """Take the stored facts of ``messages`` into this process's extraction cache (a job,
        before its guard reads them); one it lacks is found when asked for. Returns how many
        were taken."""
        taken = 0
        for digest, raw in self.fetch(list(dict.fromkeys(key_digest(m) for m in messages))).items():
            try:
                take(digest, decode(raw))
            except ValueError:
                continue  # an entry of another version: found again
            taken += 1
        return taken
