"""A thread's job claim, read in the background: when it is refreshed, how long a model call
over the threshold waits for the first read, whether a prepared job was asked for by an
operator, recording the thread as a session, and a queued job no worker takes."""

from __future__ import annotations

import time

from offpath.agent.middleware.helpers import log
from offpath.agent.middleware.state import _Seen
from offpath.compaction.tracking import KEY
from offpath.coordination.logs import tag
from offpath.stores.db import job_options
from offpath.stores.leases import Claim, State
from offpath.stores.tenants import note_own_thread

#: How often (seconds) the background thread re-reads a thread's claim while the thread is
#: over its prepare point (every call, once over the threshold with a job in flight); and
#: how long it leaves an unreachable store alone.
CLAIM_REFRESH_S = 0.2
STORE_RETRY_S = 5.0
#: The longest (s) a model call over the threshold waits for the first read of its thread's
#: claim (a new process, a new run): a Redis GET takes a millisecond once the client is open
#: (:meth:`OffPathCompaction._warm` opens it as the agent is built), but a new process's
#: first call can come before that ends (about 50 ms, more on a loaded host); a store that
#: does not answer costs at most this, once per thread and process. Without it the call
#: shortens older results and the compaction the worker prepared waits for a later crossing.
FIRST_READ_WAIT_S = 0.25
#: How often (s) at most a thread's size and last activity are recorded in offpath's
#: ``sessions`` table during a run (also at its first call and at the run's end).
NOTE_EVERY_S = 5.0
#: How long (s) whether a prepared job was forced (compact now) is remembered before the job
#: row is read again.
FORCED_REFRESH_S = 2.0
#: A queued job no worker has taken after this long (s) is reported once (issue 21, item 3).
PICKUP_WARN_S = 10.0


class ClaimsMixin:
    """:class:`~offpath.agent.middleware.OffPathCompaction`'s reads of its threads' claims (in
    the background, never waited for but once per thread), of a prepared job's ``force``, and
    its notes of a thread as a session. Its methods use the attributes set in
    ``OffPathCompaction.__init__``."""

    def _claim_of(self, session_id: str, urgent: bool = False) -> tuple[bool, Claim | None]:
        """``(known, claim)``: the thread's claim as last read in the background (known:
        read at all, and not failing), and a refresh started if it is older than
        :data:`CLAIM_REFRESH_S` (``urgent``: the thread is over its threshold with a job in
        flight, refreshed at every call). Never waits for the store."""
        now = time.monotonic()
        with self._guard:
            seen = self._claims.setdefault(session_id, _Seen())
            known = seen.at > 0 and not seen.failed
            first = seen.at == 0
            every = 0.0 if urgent and seen.claim is not None and seen.claim.in_flight else None
            wait = STORE_RETRY_S if seen.failed else every if every is not None else CLAIM_REFRESH_S
            refresh = not seen.reading and now - seen.at >= wait
            if refresh:
                seen.reading = True
        if refresh:
            self._read(self._read_claim, session_id)
        if urgent and first:  # over the threshold, never read: worth a few ms for the read
            return self._await_claim(session_id, FIRST_READ_WAIT_S)  # (this one's or earlier)
        return known, seen.claim

    def _warm(self) -> None:
        """Open the client and its lease store's connection on the reader thread, as the
        agent is built: a new process's first model call over the threshold then reads its
        thread's claim in a millisecond, inside :data:`FIRST_READ_WAIT_S`, and applies a
        compaction the worker prepared (it found it unknown under load, shortened older
        results instead and left the compaction prepared)."""
        try:
            self.client.leases.holder(f"{KEY}-warm-up")
        except Exception as exc:  # said once when a run needs the store
            log.debug("offpath: lease store not reachable yet: %s", exc)

    def _await_claim(self, session_id: str, timeout_s: float) -> tuple[bool, Claim | None]:
        """``(known, claim)`` once a read of the thread's claim (started by
        :meth:`_claim_of`) has ended, waiting at most ``timeout_s``; ``(False, None)`` if
        none ended by then or it failed."""
        with self._guard:
            seen = self._claims.setdefault(session_id, _Seen())
        seen.read.wait(timeout_s)
        with self._guard:
            return (True, seen.claim) if seen.at > 0 and not seen.failed else (False, None)

    def _read_claim(self, session_id: str) -> None:
        try:
            claim, failed = self.client.leases.holder(session_id), False
        except Exception as exc:  # Redis away: the run goes on, no compaction for now
            self._warn_once("store", f"offpath: lease store unreachable ({exc}); not compacting")
            claim, failed = None, True
        with self._guard:
            seen = self._claims.setdefault(session_id, _Seen())
            same = seen.claim is not None and claim is not None and seen.claim.raw == claim.raw
            forced, forced_at = (seen.forced, seen.forced_at) if same else (False, 0.0)
        if (
            not self.options.patch
            and claim is not None
            and claim.state is State.PREPARED
            and time.monotonic() - forced_at >= FORCED_REFRESH_S
        ):
            forced, forced_at = self._read_forced(claim.job_id), time.monotonic()
        with self._guard:
            seen = self._claims.setdefault(session_id, _Seen())
            seen.claim, seen.failed, seen.at, seen.reading = claim, failed, time.monotonic(), False
            seen.forced, seen.forced_at = forced, forced_at
            seen.read.set()

    def _read_forced(self, job_id: str) -> bool:
        """Job ``job_id`` was asked for by an operator (``POST /sessions/{id}/compact``)."""
        try:
            options = job_options(self.client.engine, job_id)
        except Exception:  # the usage database is away: applied over the threshold only
            return False
        return bool((options or {}).get("force"))

    def _forced(self, session_id: str) -> bool:
        """The thread's prepared compaction, as last read, was asked for by an operator."""
        with self._guard:
            seen = self._claims.get(session_id)
            return bool(seen and seen.forced)

    def _note_soon(self, session_id: str, messages: int, chars: int, every: float = NOTE_EVERY_S):
        """Record the thread as a session of kind ``own agent`` (its size, last activity) in
        the background, at most every ``every`` seconds."""
        now = time.monotonic()
        with self._guard:
            last = self._noted.get(session_id)
            if last is not None and now - last < every:
                return
            if len(self._noted) > 10_000:
                self._noted.clear()
            self._noted[session_id] = now
        self._write(self._note, session_id, messages, chars)

    def _note(self, session_id: str, messages: int, chars: int) -> None:
        try:
            mine = note_own_thread(
                self.client.engine,
                session_id,
                self.tenant,
                self.options.checkpoints,
                messages,
                chars,
            )
        except Exception as exc:
            log.warning("[%s] could not record the thread as a session: %s", tag(session_id), exc)
            return
        if not mine:
            self._warn_once(
                f"taken:{session_id}",
                f"[{tag(session_id)}] offpath: thread id {session_id!r} is already another "
                f"tenant's session or an API session: it is not listed as tenant "
                f"{self.tenant!r}'s own agent thread",
            )

    def _forget_claim(self, session_id: str) -> None:
        """The claim changed (this call applied or dropped a prepared compaction)."""
        with self._guard:
            self._claims.pop(session_id, None)

    def _check_pickup(self, session_id: str, holder: Claim | None) -> None:
        """Say once when a job this process queued has waited :data:`PICKUP_WARN_S` with no
        worker taking it, naming the queue and the broker (issue 21, item 3)."""
        if holder is None or holder.state is not State.QUEUED:
            return
        with self._guard:
            job, since = self._published.get(session_id, (None, 0.0))
        if job != holder.job_id or time.monotonic() - since < PICKUP_WARN_S:
            return
        from kombu.utils.url import sanitize_url

        s = self.settings
        self._warn_once(
            "pickup",
            f"offpath: compaction job {holder.job_id} has waited over {PICKUP_WARN_S:g} s in "
            f"queue {s.celery_queue!r} on broker {sanitize_url(s.broker_url)} and no worker "
            "has taken it: is an offpath worker (`offpath worker`) running against that broker "
            "and queue? Until one is, model calls over the hard limit are masked.",
        )
