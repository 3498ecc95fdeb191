"""Each message's facts, found once where the message arrives and kept in Redis by the
message's key (:func:`offpath.compaction.facts.extraction.key_digest`), where the job that
removes it reads them (:meth:`FactStore.preload`) instead of finding them again: the fact
guard, the archive's index and the loss report of a compaction then merge facts found before.

Best effort: with Redis away, an entry lapsed or never written, a write dropped (the store's
writer thread keeps at most :data:`MAX_PENDING` batches waiting), the job finds the facts of
those messages itself (what it did without this store). Only with Redis as the claim store
(``LOCK_BACKEND=redis``); with the database (``redis`` None) the store keeps nothing and each
worker finds the facts it needs: a table would add a write of every arriving message to the
database a turn writes its checkpoint to (SQLite takes one writer at a time) and a cleanup of
what expired, to save a job tens of milliseconds of CPU off any turn's path.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import orjson
import redis
from langchain_core.messages import BaseMessage

from offpath.compaction.facts.extraction import (
    Kept,
    Seen,
    facts_of,
    found_now,
    key_digest,
    take,
)
from offpath.compaction.tokens import message_tokens

log = logging.getLogger("offpath.facts")

#: How long (s) a message's facts are kept: a thread's messages are removed by a compaction
#: within hours of arriving, or read again by the job that needs them (then found there).
FACTS_TTL_S = 6 * 3600
#: Most messages one :meth:`FactStore.remember` reads (the first turn seen of a long thread).
MAX_REMEMBERED = 256
#: Key digests one process remembers having stored (16 bytes and a dict slot each).
STORED_KEPT = 65_536
#: After a write Redis failed, how long (s) the store tries no other: a store that is away
#: (down, or dropping packets: a write then waits out the socket timeout) costs one attempt.
RETRY_AFTER_S = 30.0
#: Most batches waiting for a store's writer thread (:meth:`FactStore.remember_soon`),
#: besides the one it stores; one more is dropped: its facts are found by the job.
MAX_PENDING = 64


#: Fields of one fact as :func:`encode` writes it (those of :class:`Seen`).
_FIELDS = len(Seen._fields)


def encode(message: BaseMessage, *, kept: bool = False) -> bytes:
    """The facts of ``message`` as bytes for :func:`decode` in another process: its tokens
    (:func:`~offpath.compaction.tokens.message_tokens`, where this process counts tokens
    already; else -1, and the job counts them) on a line of their own, read without the facts
    (:func:`stored_tokens`), then JSON, ``[lines, facts]``,
    each fact an array that names its line by index (the facts of one log line share it).
    ``kept``: found through this process's cache (a process that reads them itself too: the
    middleware), else found now and not kept (the API's hook)."""
    lines: dict[str, int] = {}
    seen = facts_of(message) if kept else found_now(message)
    facts = [(*s[:3], lines.setdefault(s.line, len(lines)), *s[4:]) for s in seen]
    tokens = message_tokens(message, load=False)
    return b"%d\n" % (-1 if tokens is None else tokens) + orjson.dumps([list(lines), facts])


def stored_tokens(raw: bytes | None) -> int | None:
    """The tokens of a message as :func:`encode` stored them with its facts; None: none
    stored (no entry, one written without them, or counted without quicktok)."""
    if not raw or raw[:1] == b"[":
        return None
    head = raw.partition(b"\n")[0]
    return int(head) if head.isdigit() else None


def decode(raw: bytes) -> Kept:
    """What :func:`encode` wrote, as the facts of its message (each one's :class:`Seen`
    fields as a plain tuple, as the process keeps them: :data:`~offpath.compaction.facts.
    extraction.Kept`); ValueError if it is not."""
    if raw[:1] != b"[":  # the tokens' line first (an entry written without it has none)
        raw = raw.partition(b"\n")[2]
    try:
        lines, facts = orjson.loads(raw)
        out = []
        for f in facts:  # each fact's array made its tuple in place: a job decodes thousands
            if type(f) is not list or len(f) != _FIELDS:
                raise ValueError(f"not a fact of {_FIELDS} fields: {str(f)[:60]}")
            f[3] = lines[f[3]]
            f[4] = tuple(f[4])
            out.append(tuple(f))
        return tuple(out)
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
        self._pending: queue.Queue[Sequence[BaseMessage]] = queue.Queue(MAX_PENDING)
        self._writer: threading.Thread | None = None
        self._away_until = 0.0  # time.monotonic(): no write tried before (Redis failed)

    def key(self, digest: bytes) -> str:
        return f"{self.prefix}:facts:{digest.hex()}"

    def remember(
        self,
        messages: Sequence[BaseMessage],
        arrived: Sequence[BaseMessage] = (),
        *,
        kept: bool = False,
    ) -> int:
        """Find and store the facts of the messages a turn added to a thread (``messages``):
        those after the last one this process stored (at most :data:`MAX_REMEMBERED`, newest
        first), and those of ``arrived`` not stored yet (the originals of results shortened
        as they arrived, which the job reads from the archive). ``kept``: found through this
        process's cache, where a process that reads them too (the middleware) finds each
        once (:func:`encode`). Returns how many were stored; a Redis failure is logged,
        never raised."""
        if self.redis is None:
            return 0
        fresh: dict[bytes, BaseMessage] = {}
        known = False  # the walk back met a message this process stored
        for m in reversed(messages):
            digest = key_digest(m)
            if digest in self._stored:
                known = True
                break
            if len(fresh) >= MAX_REMEMBERED:
                break
            fresh[digest] = m
        for m in arrived:
            digest = key_digest(m)
            if digest not in self._stored and len(fresh) < MAX_REMEMBERED:
                fresh.setdefault(digest, m)
        if not known and len(fresh) > 1:
            # the thread's first turn this process sees (a new process: a team's agent run
            # as a command, a restart): another process may have stored its messages' facts
            fresh = self._missing(fresh)
        return self._put(fresh, kept=kept)

    def _missing(self, fresh: dict[bytes, BaseMessage]) -> dict[bytes, BaseMessage]:
        """Those of ``fresh`` (by key digest) Redis does not hold, found with one round trip
        of EXISTS instead of finding all their facts again; those it holds count as stored
        by this process. With Redis away, none (the write would fail too)."""
        if self.redis is None or time.monotonic() < self._away_until:
            return {}
        try:
            with self.redis.pipeline(transaction=False) as pipe:
                for digest in fresh:
                    pipe.exists(self.key(digest))
                held = pipe.execute()
        except redis.RedisError as exc:
            self._failed(len(fresh), exc)
            return {}
        self._mark(d for d, there in zip(fresh, held, strict=True) if there)
        return {d: m for (d, m), there in zip(fresh.items(), held, strict=True) if not there}

    def remember_soon(self, messages: Sequence[BaseMessage]) -> bool:
        """:meth:`remember` on the store's writer thread (started on first use), so that the
        caller (the API's post-turn hook) never waits for the facts or for Redis. At most
        :data:`MAX_PENDING` batches wait; one more is dropped (False): the job that removes
        those messages finds their facts itself."""
        if self.redis is None:
            return False
        with self._lock:
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write, name="offpath-facts-store", daemon=True
                )
                self._writer.start()
        try:
            self._pending.put_nowait(list(messages))
        except queue.Full:
            log.debug("facts not stored: %d batches wait already", MAX_PENDING)
            return False
        return True

    def _write(self) -> None:
        while True:
            messages = self._pending.get()
            try:
                self.remember(messages)
            except Exception as exc:  # found by the job instead
                log.warning("facts not stored: %s", exc)
            finally:
                self._pending.task_done()

    def _put(self, fresh: Mapping[bytes, BaseMessage], *, kept: bool) -> int:
        """Set each of ``fresh`` (by key digest) to its encoded facts, in one round trip."""
        if not fresh or self.redis is None or time.monotonic() < self._away_until:
            return 0
        try:
            with self.redis.pipeline(transaction=False) as pipe:
                for digest, m in fresh.items():
                    pipe.set(self.key(digest), encode(m, kept=kept), ex=int(self.ttl_s))
                pipe.execute()
        except redis.RedisError as exc:
            self._failed(len(fresh), exc)
            return 0
        self._away_until = 0.0
        self._mark(fresh)
        return len(fresh)

    def _mark(self, digests: Iterable[bytes]) -> None:
        """Remember ``digests`` as stored (the newest :data:`STORED_KEPT`)."""
        with self._lock:
            for digest in digests:
                self._stored[digest] = None
            while len(self._stored) > STORED_KEPT:
                self._stored.popitem(last=False)

    def _failed(self, n: int, exc: Exception) -> None:
        """A write of ``n`` messages' facts failed: no other is tried for
        :data:`RETRY_AFTER_S`. The claim store's outage, which its callers report: said
        once here, at info."""
        level = logging.DEBUG if self._away_until else logging.INFO
        log.log(level, "facts not stored (%d messages): %s", n, exc)
        self._away_until = time.monotonic() + RETRY_AFTER_S

    def fetch(self, digests: list[bytes]) -> Mapping[bytes, bytes]:
        """The stored facts of those of ``digests`` Redis holds (``{}`` with Redis away)."""
        return {d: v for d, v in self.lookup(digests).items() if v is not None}

    def lookup(self, digests: list[bytes]) -> dict[bytes, bytes | None]:
        """Each of ``digests`` and its stored entry (None: Redis holds none), in one round
        trip; ``{}`` with Redis away (or none given)."""
        if not digests or self.redis is None:
            return {}
        try:
            values = self.redis.mget([self.key(d) for d in digests])
        except redis.RedisError as exc:
            log.warning("facts not read (%d messages): %s", len(digests), exc)
            return {}
        # bytes: the client does not decode responses
        return {
            d: v if isinstance(v, bytes) else None for d, v in zip(digests, values, strict=True)
        }

    def thread(self, messages: Sequence[BaseMessage]) -> Stored:
        """What the store holds of each of a thread's ``messages`` (one round trip): their
        tokens (:meth:`Stored.tokens`) and facts (:meth:`preload` takes them from it)."""
        digests = [key_digest(m) for m in messages]
        return Stored(digests, self.lookup(list(dict.fromkeys(digests))))

    def preload(self, messages: Sequence[BaseMessage], read: Stored | None = None) -> int:
        """Take the stored facts of ``messages`` into this process's extraction cache (a job,
        before its guard reads them); one it lacks is found when asked for. ``read``: what was
        read of the thread already (:meth:`thread`): only the others are read now. Returns how
        many were taken."""
        digests = list(dict.fromkeys(key_digest(m) for m in messages))
        got = dict(read.entries) if read is not None else {}
        if missing := [d for d in digests if d not in got]:
            got.update(self.lookup(missing))
        taken = 0
        for digest in digests:
            if (raw := got.get(digest)) is None:
                continue
            try:
                take(digest, decode(raw))
            except ValueError:
                continue  # an entry of another version: found again
            taken += 1
        return taken


@dataclass(frozen=True, slots=True)
class Stored:
    """What :meth:`FactStore.thread` read of a thread: ``digests``, each message's key digest
    in thread order, and ``entries``, each digest looked up and its entry (None: none)."""

    digests: list[bytes]
    entries: Mapping[bytes, bytes | None]

    def tokens(self) -> list[int | None]:
        """Each message's tokens as stored with its facts (None: not stored)."""
        return [stored_tokens(self.entries.get(d)) for d in self.digests]
