"""The open ``GET /sessions/{id}/events`` streams of one API process (:class:`StreamHub`):
how many each key and the process may hold, one poller that reads the job rows of every
watched session for all of them, and the caller's rights, re-checked at each event.

* Caps: :data:`STREAMS_PER_KEY` streams per API key and :data:`STREAMS_MAX` per process;
  past either, :class:`TooManyStreams` (the route's 429 with ``Retry-After``).
* One poller: every :data:`~api.session_jobs.EVENTS_POLL_S` one query reads the job rows
  that changed for every session a stream watches (:func:`offpath.stores.updates.updates_of`)
  and hands each stream its session's changes; an idle stream costs no query and no thread.
  Rows are read back :data:`LOOKBACK_S` before the newest seen (writers' clocks and commits
  do not come in the order of their times); each stream drops what it told already.
* Rights: a stream ends when its key is revoked, or its session is deleted or claimed again
  (its owner row is gone or another: a later tenant's events never reach it). Checked
  before each batch of events is handed on, and every :data:`RIGHTS_S` for every stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import orjson
from starlette.concurrency import run_in_threadpool

from offpath.coordination.runtime import Runtime
from offpath.metrics import EVENT_STREAM_POLLS, EVENT_STREAMS
from offpath.stores.db.tables import now_utc
from offpath.stores.tenants import Principal, identities, principal_of
from offpath.stores.updates import Changed, updates_of

from .session_jobs import EVENTS_KEEPALIVE_S, EVENTS_MAX_S, EVENTS_POLL_S, EVENTS_RETRY_MS

log = logging.getLogger("offpath.api")

#: Open streams one API key may hold (an ``EventSource`` per browser tab), and one process.
STREAMS_PER_KEY = 8
STREAMS_MAX = 256
#: How far back (s) of the previous poll each poll reads the job rows again.
LOOKBACK_S = 5.0
#: How often (s) every stream's key and session are checked, events or not.
RIGHTS_S = 2.0
#: ``Retry-After`` (s) of a stream refused past a cap.
RETRY_AFTER_S = 5
#: What a stream's queue gets when it must end (its rights are gone).
ENDED = None


class TooManyStreams(Exception):
    """A stream past a cap (``detail`` names the setting)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


#: Who owns a session and which claim of its id it is (None: no owner row).
Identity = tuple[str, datetime] | None


@dataclass(eq=False)
class Stream:
    """One open stream: who reads it (``key``: the key presented, None with
    ``AUTH_DISABLED``; ``sender``: its digest, for the cap), which session, the session's
    :data:`Identity` when it opened, and the queue the poller hands it changes on."""

    session_id: str
    caller: Principal
    key: str | None
    sender: str
    identity: Identity
    queue: asyncio.Queue[list[Changed] | None] = field(default_factory=asyncio.Queue)
    ended: bool = False


class StreamHub:
    """The open streams of one API process and their one poller (see the module doc)."""

    def __init__(
        self, rt: Runtime, per_key: int = STREAMS_PER_KEY, max_streams: int = STREAMS_MAX
    ) -> None:
        self.rt = rt
        self.per_key = per_key
        self.max_streams = max_streams
        self.streams: set[Stream] = set()
        self.by_sender: dict[str, int] = {}
        self.last_poll: datetime | None = None
        self._task: asyncio.Task[None] | None = None
        self._checked = 0.0

    # --- streams ----------------------------------------------------------------------------

    def open(self, stream: Stream) -> None:
        """Count ``stream`` in (the poller starts with the first); raises
        :class:`TooManyStreams` past a cap."""
        mine = self.by_sender.get(stream.sender, 0)
        if mine >= self.per_key:
            raise TooManyStreams(
                f"this API key has {mine} event streams open, the most one key may: close "
                "one, or retry later"
            )
        if len(self.streams) >= self.max_streams:
            raise TooManyStreams(
                f"this API process has {len(self.streams)} event streams open, the most it "
                "serves: retry later"
            )
        self.streams.add(stream)
        self.by_sender[stream.sender] = mine + 1
        EVENT_STREAMS.set(len(self.streams))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="offpath event streams")

    def close(self, stream: Stream) -> None:
        if stream not in self.streams:
            return
        self.streams.discard(stream)
        EVENT_STREAMS.set(len(self.streams))
        left = self.by_sender.get(stream.sender, 1) - 1
        if left > 0:
            self.by_sender[stream.sender] = left
        else:
            self.by_sender.pop(stream.sender, None)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # --- the poller -------------------------------------------------------------------------

    async def _run(self) -> None:
        """Poll while any stream is open; a failed read is logged and tried at the next tick."""
        loop = asyncio.get_running_loop()
        while self.streams:
            await asyncio.sleep(EVENTS_POLL_S)
            streams = list(self.streams)
            if not streams:
                break
            try:
                await self._tick(streams, loop.time())
            except Exception as exc:  # the database down: the streams wait, keep-alives go on
                log.warning("event streams: could not read the job rows: %s", exc)

    async def _tick(self, streams: list[Stream], now: float) -> None:
        sessions = {s.session_id for s in streams}
        started = now_utc()
        since = (self.last_poll or started) - timedelta(seconds=LOOKBACK_S)
        changes = await run_in_threadpool(updates_of, self.rt.engine, sessions, since)
        self.last_poll = started
        EVENT_STREAM_POLLS.inc()
        every = now - self._checked >= RIGHTS_S
        to_check = [s for s in streams if every or s.session_id in changes]
        if every:
            self._checked = now
        gone = await run_in_threadpool(self._without_rights, to_check) if to_check else set()
        for stream in streams:
            if stream in gone:
                stream.ended = True
                stream.queue.put_nowait(ENDED)
            elif stream.session_id in changes:
                stream.queue.put_nowait(changes[stream.session_id])

    def _without_rights(self, streams: list[Stream]) -> set[Stream]:
        """The streams whose key is revoked, or whose session is gone or another's now (one
        query for the sessions; a key's look-up is cached for a few seconds)."""
        owners = identities(self.rt.engine, {s.session_id for s in streams})
        auth = not self.rt.settings.auth_disabled
        keys: dict[str, Principal | None] = {}
        gone = set()
        for stream in streams:
            if owners.get(stream.session_id) != stream.identity:
                gone.add(stream)
                continue
            if auth and stream.key is not None:
                if stream.key not in keys:
                    keys[stream.key] = principal_of(self.rt.engine, stream.key)
                if keys[stream.key] != stream.caller:
                    gone.add(stream)
        return gone


def identity_of(rt: Runtime, session_id: str) -> Identity:
    """The session's :data:`Identity` now."""
    return identities(rt.engine, [session_id]).get(session_id)


async def event_stream(hub: StreamHub, stream: Stream, first: list[Changed]) -> AsyncIterator[str]:
    """The server-sent events of ``stream`` (opened in ``hub``): the latest of ``first`` (the
    session's job updates when it opened), then each change the poller hands it, once; a
    comment after :data:`EVENTS_KEEPALIVE_S` without one; the end after :data:`EVENTS_MAX_S`
    or when its rights are gone. The stream is counted out of ``hub`` however it ends (a
    client that went away too)."""
    try:
        seen = {c.update.compaction_id: c.update.status for c in first}
        n = 0
        yield f"retry: {EVENTS_RETRY_MS}\n\n"
        if first:
            n += 1
            yield _sse(n, first[-1])
        started = last = time.monotonic()
        while (left := EVENTS_MAX_S - (time.monotonic() - started)) > 0:
            wait = min(left, EVENTS_KEEPALIVE_S - (time.monotonic() - last))
            try:
                changed = await asyncio.wait_for(stream.queue.get(), timeout=max(wait, 0.001))
            except TimeoutError:
                if time.monotonic() - last >= EVENTS_KEEPALIVE_S:
                    last = time.monotonic()
                    yield ": keep-alive\n\n"
                continue
            if changed is ENDED:
                return
            for c in changed:
                if seen.get(c.update.compaction_id) == c.update.status:
                    continue
                if c.update.compaction_id not in seen and c.update.status != "in_progress":
                    # a job queued and ended between two reads: the watcher still hears it
                    # start (ACP: in_progress, then its end), not an end out of nowhere
                    n += 1
                    yield _sse(n, _started(c))
                seen[c.update.compaction_id] = c.update.status
                n += 1
                last = time.monotonic()
                yield _sse(n, c)
    finally:
        hub.close(stream)


def _started(changed: Changed) -> Changed:
    """``changed``'s job as it stood when it started: in progress, no result yet."""
    update = dataclasses.replace(
        changed.update, status="in_progress", chars_after=None, reason=None
    )
    return Changed(update, changed.at)


def _sse(n: int, changed: Changed) -> str:
    update = changed.update
    body = {"sessionId": update.session_id, "update": update.to_acp(), "at": changed.at.isoformat()}
    data = orjson.dumps(body).decode()
    return f"id: {n}\ndata: {data}\n\n"
