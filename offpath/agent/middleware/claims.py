"""A thread's job as its model calls see it, from a claim read to a job queued.

Its claim, read in the background (:class:`Claims`): when it is refreshed, how long a model
call over the threshold waits for the first read, whether a prepared job was asked for by an
operator, and a queued job no worker takes.

When its job is queued (:class:`Pacing`): the *prepare point*, from the run's growth
(chars per second) and the summarizer's measured latency (p90 of the deployment's recent
compactions), early enough for the summary to be ready when the thread crosses its
threshold; and the crossing that frees a thread a skip holds.

Queuing it from a model call (:class:`Publisher`), in the background: the call never waits,
not even for a broker that is down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from langchain_core.messages import BaseMessage

from offpath.agent.middleware.counting import ThreadSettings
from offpath.agent.middleware.pools import Background
from offpath.agent.middleware.reports import Reports, log
from offpath.agent.middleware.state import Place, outside_of
from offpath.compaction.planner import (
    blended_rate,
    earliest_worth,
    lead_chars,
    min_gain_chars,
    prepare_from_chars,
)
from offpath.compaction.tracking import KEY
from offpath.coordination.jobs import JobOptions, head_mark
from offpath.coordination.logs import tag
from offpath.coordination.outages import LEASE_STORE, USAGE_DB
from offpath.coordination.runtime import Client
from offpath.stores.db.job_queries import job_options, job_row
from offpath.stores.leases.claims import Claim, State
from offpath.stores.usage.totals import SummarizerLatency

#: How often (seconds) the background thread re-reads a thread's claim while the thread is
#: over its prepare point (every call, once over the threshold with a job in flight); and
#: how long it leaves an unreachable store alone.
CLAIM_REFRESH_S = 0.2
STORE_RETRY_S = 5.0
#: The longest (s) a model call over the threshold waits for the first read of its thread's
#: claim (a new process, a new run): a Redis GET takes a millisecond once the client is open
#: (:meth:`Claims.warm` opens it as the agent is built), but a new process's
#: first call can come before that ends (about 50 ms, more on a loaded host); a store that
#: does not answer costs at most this, once per thread and process. Without it the call
#: shortens older results and the compaction the worker prepared waits for a later crossing.
FIRST_READ_WAIT_S = 0.25
#: How long (s) whether a prepared job was forced (compact now) is remembered before the job
#: row is read again.
FORCED_REFRESH_S = 2.0
#: A queued job no worker has taken after this long (s) is reported once; at most this many
#: queued jobs' ages are remembered.
PICKUP_WARN_S = 10.0
MAX_WATCHED = 10_000


@dataclass(slots=True)
class _Seen:
    """A thread's claim as last read."""

    claim: Claim | None = None
    at: float = 0.0  # monotonic time of the last read (or failed read)
    failed: bool = False
    reading: bool = False
    #: the prepared job of ``claim`` was asked for by an operator (compact now), as last read
    forced: bool = False
    forced_at: float = 0.0
    #: set once a read has ended (:meth:`Claims.await_claim` waits on it)
    read: threading.Event = field(default_factory=threading.Event)


class Claims:
    """The threads' claims as last read in the background (never waited for but once per
    thread, over the threshold), whether a prepared job was forced, and the watch on a queued
    job no worker takes.

    Requires: the settings in force, the client (opened on first use), the background
    threads, the reports, and ``patch`` (offpath's own API agent: no job of it is forced).
    Provides: :meth:`claim_of`, :meth:`await_claim`, :meth:`read_claim`, :meth:`now`,
    :meth:`forced`, :meth:`freed`, :meth:`forget`, :meth:`reading`, :meth:`in_flight`,
    :meth:`warm`, and the
    pickup watch (:meth:`check_pickup`, :meth:`note_queued`, :meth:`watch_pickup`)."""

    def __init__(
        self,
        settings: ThreadSettings,
        client: Callable[[], Client],
        background: Background,
        reports: Reports,
        *,
        patch: bool,
    ) -> None:
        self.settings = settings
        self.client = client
        self.background = background
        self.reports = reports
        self.patch = patch
        self._guard = threading.Lock()
        self._claims: dict[str, _Seen] = {}
        self._queued_since: dict[str, float] = {}  # queued job -> when (time.time())

    def claim_of(self, session_id: str, urgent: bool = False) -> tuple[bool, Claim | None]:
        """``(known, claim)``: the thread's claim as last read in the background (known:
        read at all, and not failing), and a refresh started if it is older than
        :data:`CLAIM_REFRESH_S` (``urgent``: the thread is over its threshold with a job in
        flight, refreshed at every call). Never waits for the store but for a thread's first
        read over the threshold (:data:`FIRST_READ_WAIT_S`)."""
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
            self.background.read(self.read_claim, session_id)
        if urgent and first:  # over the threshold, never read: worth a few ms for the read
            return self.await_claim(session_id, FIRST_READ_WAIT_S)  # (this one's or earlier)
        return known, seen.claim

    def prepared(self, session_id: str, urgent: bool = False) -> Claim | None:
        """The thread's claim as :meth:`claim_of` has it, if it is known and names a prepared
        job."""
        known, holder = self.claim_of(session_id, urgent)
        return holder if known and holder is not None and holder.state is State.PREPARED else None

    def warm(self) -> None:
        """Open the client and its lease store's connection (on the reader thread, as the
        agent is built): a new process's first model call over the threshold then reads its
        thread's claim in a millisecond, inside :data:`FIRST_READ_WAIT_S`, and applies a
        compaction the worker prepared (else it finds it unknown under load, shortens older
        results instead and leaves the compaction prepared)."""
        try:
            self.client().leases.holder(f"{KEY}-warm-up")
        except Exception as exc:  # said once when a run needs the store
            log.debug("offpath: lease store not reachable yet: %s", exc)

    def await_claim(self, session_id: str, timeout_s: float) -> tuple[bool, Claim | None]:
        """``(known, claim)`` once a read of the thread's claim (started by
        :meth:`claim_of`) has ended, waiting at most ``timeout_s``; ``(False, None)`` if
        none ended by then or it failed."""
        with self._guard:
            seen = self._claims.setdefault(session_id, _Seen())
        seen.read.wait(timeout_s)
        with self._guard:
            return (True, seen.claim) if seen.at > 0 and not seen.failed else (False, None)

    def read_claim(self, session_id: str) -> None:
        """Read the thread's claim from the lease store (and, for a prepared job, whether it
        was forced, at most every :data:`FORCED_REFRESH_S`): what :meth:`claim_of` gives."""
        try:
            claim, failed = self.client().leases.holder(session_id), False
        except Exception as exc:  # Redis away: the run goes on, no compaction for now
            effect = "model calls go on, bounded, with no compaction until it answers"
            line = f"offpath: lease store unreachable ({exc})"
            self.reports.trouble(LEASE_STORE, exc, line, effect)
            claim, failed = None, True
        else:
            self.reports.answered(LEASE_STORE)
            if claim is not None and claim.state is State.QUEUED:
                self._age_of_queued(session_id, claim)
        with self._guard:
            seen = self._claims.setdefault(session_id, _Seen())
            same = seen.claim is not None and claim is not None and seen.claim.raw == claim.raw
            forced, forced_at = (seen.forced, seen.forced_at) if same else (False, 0.0)
        if (
            not self.patch
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

    def now(self, session_id: str) -> Claim | None:
        """The thread's claim, read from the lease store now (a refused call has failed
        already: a read is worth its milliseconds there); None if it cannot be read."""
        try:
            return self.client().leases.holder(session_id)
        except Exception as exc:  # the store is away: shortened and masked instead
            log.warning("[%s] could not read the thread's claim: %s", tag(session_id), exc)
            return None

    def reading(self, session_id: str) -> bool:
        """A read of the thread's claim is in flight."""
        with self._guard:
            seen = self._claims.get(session_id)
            return seen is not None and seen.reading

    def in_flight(self, session_id: str) -> bool:
        """The thread's claim, read now from the lease store, names a job queued or running;
        when it does not, the claim just read becomes the one :meth:`claim_of` gives (unless a
        read is in flight). False when the store cannot be read."""
        try:
            claim = self.client().leases.holder(session_id)
        except Exception:
            return False
        if claim is not None and claim.in_flight:
            return True
        with self._guard:
            seen = self._claims.setdefault(session_id, _Seen())
            if not seen.reading:
                seen.claim, seen.failed, seen.at = claim, False, time.monotonic()
                seen.read.set()
        return False

    def _read_forced(self, job_id: str) -> bool:
        """Job ``job_id`` was asked for by an operator (``POST /sessions/{id}/compact``)."""
        try:
            options = job_options(self.client().engine, job_id)
        except Exception:  # the usage database is away: applied over the threshold only
            return False
        return bool((options or {}).get("force"))

    def forced(self, session_id: str) -> bool:
        """The thread's prepared compaction, as last read, was asked for by an operator."""
        with self._guard:
            seen = self._claims.get(session_id)
            return bool(seen and seen.forced)

    def freed(self, session_id: str) -> None:
        """The thread's claim is known free: this process's call ended its prepared job,
        which handed the thread on. A job queued on it (:meth:`claim_of` gives no claim) takes
        the thread unless another claim holds it: the lease store decides."""
        seen = _Seen(at=time.monotonic())
        seen.read.set()
        with self._guard:
            self._claims[session_id] = seen

    def forget(self, session_id: str) -> None:
        """The claim changed (this call applied or dropped a prepared compaction)."""
        with self._guard:
            self._claims.pop(session_id, None)

    def check_pickup(self, session_id: str, holder: Claim | None) -> None:
        """Say once when the thread's queued job has waited :data:`PICKUP_WARN_S` with no
        worker taking it (:meth:`_say_not_taken`). Its age is known from this process's
        publish, or from the job's row (read once by :meth:`read_claim`, for a job an earlier
        process queued)."""
        if holder is None or holder.state is not State.QUEUED:
            return
        with self._guard:
            since = self._queued_since.get(holder.job_id)
        if since is not None and time.time() - since >= PICKUP_WARN_S:
            self._say_not_taken(holder.job_id, since)

    def watch_pickup(self, session_id: str, job_id: str, delay_s: float = PICKUP_WARN_S) -> None:
        """In ``delay_s``, read the thread's claim and say so if job ``job_id`` is still queued
        (on a timer thread: a run that ends, or makes no further model call, is told too)."""
        timer = threading.Timer(delay_s, self._pickup_due, (session_id, job_id))
        timer.daemon = True
        timer.start()

    def _pickup_due(self, session_id: str, job_id: str) -> None:
        try:
            holder = self.client().leases.holder(session_id)
        except Exception:  # the lease store is away: said by the claim reads
            return
        if holder is not None and holder.state is State.QUEUED and holder.job_id == job_id:
            with self._guard:
                since = self._queued_since.get(job_id, time.time() - PICKUP_WARN_S)
            self._say_not_taken(job_id, since)
        else:  # taken: a later job that waits is said again
            self.reports.forget("pickup")

    def note_queued(self, job_id: str, since: float | None = None) -> None:
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
            row = job_row(self.client().engine, claim.job_id)
        except Exception:  # the usage database is away: said where it is written
            return
        created = (row or {}).get("created_at")
        if isinstance(created, datetime):  # SQLite gives it back naive: it is UTC
            since = (created if created.tzinfo else created.replace(tzinfo=UTC)).timestamp()
        else:
            since = time.time()
        self.note_queued(claim.job_id, since)
        left = since + PICKUP_WARN_S - time.time()
        if left > 0:
            self.watch_pickup(session_id, claim.job_id, left)
        else:
            self.check_pickup(session_id, claim)

    def _say_not_taken(self, job_id: str, since: float) -> None:
        """One warning (per process, until a job is taken again) naming the queue and the
        broker where job ``job_id`` waits."""
        from kombu.utils.url import sanitize_url

        s = self.settings.current
        self.reports.warn_once(
            "pickup",
            f"offpath: compaction job {job_id} has waited {time.time() - since:.0f} s in queue "
            f"{s.celery_queue!r} on the broker at {sanitize_url(s.broker_url)} and no worker "
            "has taken it: start `offpath worker` with the same CELERY_QUEUE and broker "
            "(CELERY_BROKER_URL, else REDIS_URL). Until one runs nothing is compacted, and "
            "model calls over the hard limit are masked.",
        )


class Pacing:
    """The prepare point of a thread, from what its private key holds (its fixed part, its
    growth rate) and the summarizer's latency.

    Requires: the settings in force, the client (opened on first use: the latency's read)
    and the background threads (where it is read). Provides: :meth:`track_rate`,
    :meth:`point`, :meth:`frees`, :meth:`crossing_frees`, :attr:`latency`."""

    def __init__(
        self, settings: ThreadSettings, client: Callable[[], Client], background: Background
    ) -> None:
        self.settings = settings
        self.client = client
        self.background = background
        self.latency = SummarizerLatency()

    def frees(self, holder: Claim | None, chars: int, threshold: bool = False) -> bool:
        """A job may be queued for a thread of ``chars`` whose claim is ``holder`` (none, or a
        skip that a thread this size no longer respects; ``threshold``: weighed against the
        threshold as well)."""
        s = self.settings.current
        if holder is None:
            return True
        if threshold:
            return holder.frees_for(chars, min_gain_chars(s), s.summarization_threshold_chars)
        return holder.frees_for(chars, min_gain_chars(s))

    def crossing_frees(self, holder: Claim | None, reached: int, private: dict[str, Any]) -> bool:
        """A skip decided under the threshold frees a thread that crossed it (``reached``:
        its size before this call shortened older results), once until the next compaction
        is applied: the thread's counted size is held near the prepare floor by that
        shortening, so the skip's gain rule alone would hold it while every call goes over
        the threshold. A job queued so, which then finds nothing worth compacting, leaves a
        skip decided under the threshold again: the ``crossed`` flag stops a job per call."""
        if holder is None or private.get("crossed"):
            return False
        if not self.frees(holder, reached, threshold=True):
            return False
        private["crossed"] = True
        return True

    def track_rate(self, private: dict[str, Any], chars: int) -> None:
        """Keep the run's growth in chars per second (a moving average over its model calls)
        in the private key."""
        now = time.time()
        rate = dict(private.get("rate") or {})
        last_t, last_chars = rate.get("t"), rate.get("chars")
        if isinstance(last_t, float | int) and isinstance(last_chars, int):
            dt = now - float(last_t)
            if 0 < dt < 600 and chars > last_chars:
                sample = (chars - last_chars) / dt
                g = rate.get("g")
                rate["g"] = blended_rate(float(g or 0.0), sample)
        rate["t"], rate["chars"] = now, chars
        private["rate"] = rate

    def point(self, private: dict[str, Any]) -> int:
        """The size (chars) from which a job is queued: early enough that its summary is ready
        when the thread crosses its threshold (the run's growth rate x the summarizer's p90
        latency and a job's overhead), never later than the prepare floor
        (``SUMMARIZATION_PREPARE_AT``; for a thread whose fixed part is over it, where a
        compaction lands it and a least gain: :func:`~offpath.compaction.planner.
        prepare_from_chars`), and not before a compaction could be worth it (the keep window, a
        summary's budget and the no-progress gain of the thread, whose fixed part no compaction
        removes: :func:`~offpath.compaction.planner.earliest_worth`). Sizes as a call sends
        them."""
        s = self.settings.current
        fixed = int(private.get("fixed") or outside_of(private))
        floor = prepare_from_chars(s, fixed)  # the prepare floor, unless the fixed part is over
        growth = float((private.get("rate") or {}).get("g") or 0.0)
        if growth <= 0:
            return floor
        if self.latency.due():  # read again in the background; this call uses the last
            self.background.read(lambda: self.latency.refresh(self.client().engine))
        ahead = s.summarization_threshold_chars - lead_chars(growth, self.latency.seconds)
        # sizes as a call sends them: a system prompt given to the agent is in every one
        return min(floor, max(earliest_worth(s, fixed), ahead))


class Publisher:
    """The jobs a middleware queues, one at a time per thread.

    Requires: the settings in force, the client (opened on first use: its
    :class:`~offpath.coordination.jobs.Jobs` queues), the background threads, the reports,
    the claims (read again once a job is queued, and its pickup watched), the pacing (the
    prepare point a job may plan from) and the agent's
    :class:`~offpath.coordination.jobs.JobOptions`. Provides: :meth:`publish_soon`, :meth:`publishing`."""

    def __init__(
        self,
        settings: ThreadSettings,
        client: Callable[[], Client],
        background: Background,
        reports: Reports,
        claims: Claims,
        pacing: Pacing,
        options: JobOptions,
    ) -> None:
        self.settings = settings
        self.client = client
        self.background = background
        self.reports = reports
        self.claims = claims
        self.pacing = pacing
        self.options = options
        self._guard = threading.Lock()
        self._publishing: set[str] = set()

    def publishing(self, session_id: str) -> bool:
        """A job for the thread is being queued by this process."""
        with self._guard:
            return session_id in self._publishing

    def publish_soon(
        self,
        session_id: str,
        chars: int,
        messages: Sequence[BaseMessage],
        private: dict[str, Any],
        place: Place,
        planned: int | None = None,
    ) -> None:
        """Queue a job for the thread in a background thread (the model call does not wait).
        The job carries the run's ``messages`` (a user's own agent: the job plans on them)
        and names the run's newest message (``seen``: a job planned on the checkpoint waits
        for it to hold it, as LangGraph writes it in the background), where the run's messages are
        (its ``thread_id`` and checkpoint namespace: a subgraph's, a callee's), and the size it
        may plan from (the prepare point, or ``planned``)."""
        with self._guard:
            if session_id in self._publishing:
                return
            self._publishing.add(session_id)
        options = replace(
            self.options,
            seen=messages[-1].id if messages else None,
            head=head_mark(messages),
            checkpoint_ns=place.ns or None,
            thread_id=place.thread_id if place.thread_id != session_id else None,
            floor=min(chars if planned is None else planned, self.pacing.point(private)),
            outside=outside_of(private),
            chars_per_token=self.settings.ratio(session_id),
            # the thread the run goes on from: the job plans on it, not on a checkpoint that
            # lags (offpath's own agent's worker patches the checkpoint: it reads it)
            messages=None if self.options.patch else tuple(messages),
        )
        self.background.write(self._publish, session_id, chars, options)

    def _publish(self, session_id: str, chars: int, options: JobOptions) -> None:
        s = self.settings.current
        try:
            result = self.client().jobs.queue(
                session_id,
                chars,
                options=options,
                min_gain=min_gain_chars(s),
                threshold=s.summarization_threshold_chars,
                say_outages=True,
            )
            if result.action != "error":
                self.reports.answered(USAGE_DB)
            if result.action == "queued" and result.job_id:
                self.claims.note_queued(result.job_id)
                self.claims.watch_pickup(session_id, result.job_id)
                self.reports.tell(session_id, result.job_id, "in_progress", chars)
        except Exception as exc:
            line = f"[{tag(session_id)}] compaction not queued: {exc}"
            self.reports.trouble(USAGE_DB, exc, line, "compaction not queued")
        finally:
            self.claims.read_claim(session_id)  # the claim it took (or found), before the next try
            with self._guard:
                self._publishing.discard(session_id)
