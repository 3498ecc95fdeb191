"""A thread's job claim, read in the background: when it is refreshed, how long a model call
over the threshold waits for the first read, whether a prepared job was asked for by an
operator, recording the thread as a session, and a queued job no worker takes."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from offpath.agent.middleware.helpers import log
from offpath.agent.middleware.state import _Seen
from offpath.compaction.tracking import KEY
from offpath.coordination.logs import tag
from offpath.coordination.outages import CHECKPOINTER, LEASE_STORE, USAGE_DB
from offpath.stores.db.job_queries import job_options, job_row
from offpath.stores.leases.claims import Claim, State
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
#: A queued job no worker has taken after this long (s) is reported once (issue 21, item 3;
#: issue 35, item 2); at most this many queued jobs' ages are remembered.
PICKUP_WARN_S = 10.0
MAX_WATCHED = 10_000


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
        if not self.options.patch:
            self._write(self._warm_tables)
            if self.options.checkpoints:
                self._write(self._check_checkpointer, self.options.checkpoints)

    def _check_checkpointer(self, url: str) -> None:
        """Say once, as the agent is built, when the checkpointer the worker is to read this
        agent's threads from (``checkpointer_url``) cannot be reached from here."""
        from kombu.utils.url import sanitize_url

        from offpath.coordination.outages import OUTAGES, check_checkpointer

        try:
            check_checkpointer(url, self.settings.publish_timeout_s * 5)
        except Exception as exc:
            effect = "the worker reads this agent's threads there: no compaction until it can"
            OUTAGES.failed(CHECKPOINTER, sanitize_url(url), exc, effect)

    def _warm_tables(self) -> None:
        """Make offpath's tables in the usage database, or bring them up to date, if this
        process is the first to use them (an agent started before ``offpath migrate`` or
        any worker: :meth:`~offpath.coordination.runtime.Client.ensure_tables`), on the
        writer thread as the agent is built."""
        try:  # a new connection checks them first (Client.ensure_tables)
            self.client.engine.connect().close()
        except Exception as exc:
            effect = "no compaction is queued or recorded until it can be"
            self._trouble(USAGE_DB, exc, f"offpath: {exc}", effect)

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
            effect = "model calls go on, bounded, with no compaction until it answers"
            self._trouble(LEASE_STORE, exc, f"offpath: lease store unreachable ({exc})", effect)
            claim, failed = None, True
        else:
            self._answered(LEASE_STORE)
            if claim is not None and claim.state is State.QUEUED:
                self._age_of_queued(session_id, claim)
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

    def _note_soon(
        self,
        session_id: str,
        messages: int,
        chars: int,
        every: float | None = None,
        fixed: int | None = None,
    ):
        """Record the thread as a session of kind ``own agent`` (its size, last activity, its
        ``fixed`` part if known, with the threshold) in the background, at most every
        ``every`` seconds (:data:`NOTE_EVERY_S`); a size held back by that is written when the
        period ends."""
        every = NOTE_EVERY_S if every is None else every
        now = time.monotonic()
        with self._guard:
            last = self._noted.get(session_id)
            if last is not None and now - last < every:
                # the latest size is written once the period ends: a run that raises (a
                # tool's error, the recursion limit) reaches no run's end to note it at
                waiting = session_id in self._note_later
                self._note_later[session_id] = (messages, chars, fixed)
                if waiting:
                    return
                delay = every - (now - last)
            else:
                delay = None
                self._note_later.pop(session_id, None)
                if len(self._noted) > 10_000:
                    self._noted.clear()
                self._noted[session_id] = now
        if delay is None:
            self._write(self._note, session_id, messages, chars, fixed)
            return
        timer = threading.Timer(delay, self._note_latest, (session_id,))
        timer.daemon = True
        timer.start()

    def _note_latest(self, session_id: str) -> None:
        """Write the thread's latest size held back by :meth:`_note_soon`'s period, if no
        note has written it since."""
        with self._guard:
            later = self._note_later.pop(session_id, None)
            if later is None:
                return
            self._noted[session_id] = time.monotonic()
        self._write(self._note, session_id, *later)

    def _note(self, session_id: str, messages: int, chars: int, fixed: int | None = None) -> None:
        try:
            mine = note_own_thread(
                self.client.engine,
                session_id,
                self.tenant,
                self.options.checkpoints,
                messages,
                chars,
                fixed=fixed,
                threshold=self.settings.summarization_threshold_chars,
            )
        except Exception as exc:
            line = f"[{tag(session_id)}] could not record the thread as a session: {exc}"
            self._trouble(USAGE_DB, exc, line)
            return
        self._answered(USAGE_DB)
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
        """Say once when the thread's queued job has waited :data:`PICKUP_WARN_S` with no
        worker taking it (:meth:`_say_not_taken`). Its age is known from this process's
        publish, or from the job's row (read once by :meth:`_read_claim`, for a job an earlier
        process queued)."""
        if holder is None or holder.state is not State.QUEUED:
            return
        with self._guard:
            since = self._queued_since.get(holder.job_id)
        if since is not None and time.time() - since >= PICKUP_WARN_S:
            self._say_not_taken(holder.job_id, since)

    def _watch_pickup(self, session_id: str, job_id: str, delay_s: float = PICKUP_WARN_S) -> None:
        """In ``delay_s``, read the thread's claim and say so if job ``job_id`` is still queued
        (on a timer thread: a run that ends, or makes no further model call, is told too)."""
        timer = threading.Timer(delay_s, self._pickup_due, (session_id, job_id))
        timer.daemon = True
        timer.start()

    def _pickup_due(self, session_id: str, job_id: str) -> None:
        try:
            holder = self.client.leases.holder(session_id)
        except Exception:  # the lease store is away: said by the claim reads
            return
        if holder is not None and holder.state is State.QUEUED and holder.job_id == job_id:
            with self._guard:
                since = self._queued_since.get(job_id, time.time() - PICKUP_WARN_S)
            self._say_not_taken(job_id, since)
        else:  # taken: a later job that waits is said again
            self._warned.discard("pickup")

    def _note_queued(self, job_id: str, since: float | None = None) -> None:
        """Remember when job ``job_id`` was queued (``time.time()``; None: now); at most
        :data:`MAX_WATCHED` jobs are remembered."""
        with self._guard:
            if len(self._queued_since) >= MAX_WATCHED:
                self._queued_since.clear()
            self._queued_since[job_id] = time.time() if since is None else since

    def _age_of_queued(self, session_id: str, claim: Claim) -> None:
        """For a queued job this process did not publish, when it was queued (its row's
        ``created_at``), read once; a watch on it if it is younger than
        :data:`PICKUP_WARN_S`."""
        with self._guard:
            if claim.job_id in self._queued_since:
                return
        try:
            row = job_row(self.client.engine, claim.job_id)
        except Exception:  # the usage database is away: said where it is written
            return
        created = (row or {}).get("created_at")
        if isinstance(created, datetime):  # SQLite gives it back naive: it is UTC
            since = (created if created.tzinfo else created.replace(tzinfo=UTC)).timestamp()
        else:
            since = time.time()
        self._note_queued(claim.job_id, since)
        left = since + PICKUP_WARN_S - time.time()
        if left > 0:
            self._watch_pickup(session_id, claim.job_id, left)
        else:
            self._check_pickup(session_id, claim)

    def _say_not_taken(self, job_id: str, since: float) -> None:
        """One warning (per process, until a job is taken again) naming the queue and the
        broker where job ``job_id`` waits (issue 35, item 2)."""
        from kombu.utils.url import sanitize_url

        s = self.settings
        self._warn_once(
            "pickup",
            f"offpath: compaction job {job_id} has waited {time.time() - since:.0f} s in queue "
            f"{s.celery_queue!r} on the broker at {sanitize_url(s.broker_url)} and no worker "
            "has taken it: start `offpath worker` with the same CELERY_QUEUE and broker "
            "(CELERY_BROKER_URL, else REDIS_URL). Until one runs nothing is compacted, and "
            "model calls over the hard limit are masked.",
        )
