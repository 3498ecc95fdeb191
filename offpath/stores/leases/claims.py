"""The claim protocol on a :class:`~offpath.stores.leases.key_stores.KeyStore` (the values
and what they mean: :mod:`offpath.stores.leases`): a claim (:class:`State`,
:class:`Claim`), :class:`Leases` (claim, start, renew, hand on a thread), the
:class:`LeaseKeeper` that renews this process's running leases, and the failure backoff
(:func:`failure_backoff_s`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from offpath.stores.leases.key_stores import KeyStore
from offpath.stores.renewal import Renewer

log = logging.getLogger("offpath.leases")

#: How long ``d:<job>`` stays after a compaction (the post-turn hook's view may lag by this).
DONE_TTL_S = 600.0
#: How long a prepared compaction waits for its thread to cross the threshold, and how long
#: ``s:<job>:<chars>:<at>`` remembers a skip.
PREPARED_TTL_S = SKIPPED_TTL_S = 86_400.0


class State(StrEnum):
    QUEUED = "q"
    RUNNING = "r"
    PREPARED = "p"
    DONE = "d"
    SKIPPED = "s"
    BACKOFF = "b"


@dataclass(frozen=True, slots=True)
class Claim:
    """A parsed claim value; ``raw`` is the value as stored."""

    state: State
    job_id: str
    token: str | None
    raw: str

    @classmethod
    def parse(cls, raw: str | None) -> Claim | None:
        if not raw:
            return None
        state, _, rest = raw.partition(":")
        job_id, _, token = rest.partition(":")
        return cls(State(state), job_id, token or None, raw)

    @property
    def in_flight(self) -> bool:
        """A job is queued or running on the thread."""
        return self.state in (State.QUEUED, State.RUNNING)

    @property
    def chars(self) -> int:
        """The size a skip was decided at (``s:<job>:<chars>``; 0 for other states)."""
        return self._skip_size(0)

    @property
    def worth_at(self) -> int:
        """The size from which the skip's planner found a compaction worth it
        (``s:<job>:<chars>:<at>``; 0: not known, or another state)."""
        return self._skip_size(1)

    def _skip_size(self, k: int) -> int:
        if self.state is not State.SKIPPED or not self.token:
            return 0
        parts = self.token.split(":")
        return int(parts[k]) if len(parts) > k and parts[k].isdigit() else 0

    def frees_for(self, chars: int | None, min_gain: int, threshold: int = 0) -> bool:
        """A new job may take the thread from this claim: the last job is done, or it skipped
        and the thread (``chars``, if known) has reached the size from which its planner found
        a compaction worth it (:attr:`worth_at`; when not known, grown by ``min_gain`` since),
        or has crossed its ``threshold`` (chars; 0: not known) since a skip decided under it.

        Why the skip's own size: a fixed growth after a skip (the least gain, 3.5k chars at
        20,000 / 6,000) held a coding run while a compaction could already land, and one
        too short held a thread whose fixed part left little room.

        The crossing frees it because a skip decided under the threshold (a job queued from
        the prepare point right after a compaction landed, ending ``no_progress`` or
        ``too_few_messages``) would otherwise hold a thread that is over its threshold until
        it grew ``min_gain`` more past the skip (a fast run crosses while held). One job per
        crossing: a skip decided over the threshold holds as before,
        so a thread with nothing worth compacting does not queue a job per call."""
        if self.state is State.DONE:
            return True
        if self.state is not State.SKIPPED or chars is None:
            return self.state is State.SKIPPED
        crossed = 0 < threshold < chars and self.chars <= threshold
        return crossed or chars >= (self.worth_at or self.chars + min_gain)


class Start(StrEnum):
    """What :meth:`Leases.start` found."""

    OK = "ok"  # this delivery holds the running lease now
    DUPLICATE = "duplicate"  # another delivery of the same job is running
    SUPERSEDED = "superseded"  # another job holds the thread
    BACKOFF = "backoff"  # the thread is in its failure backoff


class Leases:
    """The claim protocol on a :class:`KeyStore`; see the module doc."""

    def __init__(self, store: KeyStore, *, prefix: str, lease_s: float, queued_ttl_s: float):
        self.store = store
        self.prefix = prefix
        self.lease_s = lease_s
        self.queued_ttl_s = queued_ttl_s

    def key(self, session_id: str) -> str:
        return f"{self.prefix}:job:thread:{session_id}"

    def holder(self, session_id: str) -> Claim | None:
        """Who holds the thread now (None: free)."""
        return Claim.parse(self.store.get(self.key(session_id)))

    def claim(
        self,
        session_id: str,
        job_id: str,
        superseded: Callable[[Claim], bool] = lambda _: False,
        *,
        chars: int | None = None,
        min_gain: int = 0,
        threshold: int = 0,
    ) -> Claim | None:
        """Claim a free thread for the queued job ``job_id``.

        Returns None when claimed, else the claim that keeps it (a job in flight, a
        prepared compaction, a backoff, a skip the thread of ``chars`` has not grown
        ``min_gain`` past, or ``d:<job>`` of a compaction that ``superseded`` says the
        caller's view has not seen).
        """
        key, value = self.key(session_id), f"q:{job_id}"
        for _ in range(5):
            current = self.holder(session_id)
            if current is not None and (
                not current.frees_for(chars, min_gain, threshold)
                or (current.state is State.DONE and superseded(current))
            ):
                return current
            if self.store.swap(key, current.raw if current else None, value, self.queued_ttl_s):
                return None
        return self.holder(session_id)

    def start(self, session_id: str, job_id: str, token: str) -> tuple[Start, Claim | None]:
        """Take the running lease for one delivery of ``job_id``; also returns what held the
        thread before (None: free, e.g. a lapsed claim)."""
        key, value = self.key(session_id), f"r:{job_id}:{token}"
        # what a queued job's delivery mostly finds: its own queued claim (one round trip)
        queued = f"q:{job_id}"
        if self.store.swap(key, queued, value, self.lease_s):
            return Start.OK, Claim.parse(queued)
        for _ in range(5):
            current = self.holder(session_id)
            if current is not None:
                if current.job_id == job_id and current.state is State.RUNNING:
                    return Start.DUPLICATE, current
                if current.job_id != job_id and (
                    current.in_flight or current.state is State.PREPARED
                ):
                    return Start.SUPERSEDED, current
                if current.job_id != job_id and current.state is State.BACKOFF:
                    return Start.BACKOFF, current
            if self.store.swap(key, current.raw if current else None, value, self.lease_s):
                return Start.OK, current
        raise RuntimeError(f"the claim of thread {session_id!r} kept changing")

    def renew(self, session_id: str, job_id: str, token: str) -> bool:
        """Extend the running lease; False if this delivery no longer holds it."""
        value = f"r:{job_id}:{token}"
        return self.store.swap(self.key(session_id), value, value, self.lease_s)

    def requeue(self, session_id: str, job_id: str, token: str) -> bool:
        """Running -> queued while the job waits for its retry (the lease is not renewed)."""
        return self.store.swap(
            self.key(session_id), f"r:{job_id}:{token}", f"q:{job_id}", self.queued_ttl_s
        )

    def finish(self, session_id: str, job_id: str, token: str, then: Claim | None) -> bool:
        """Hand the thread on from this delivery's running lease to ``then`` (see
        :meth:`after`). False if this delivery no longer held the lease."""
        new, ttl = (then.raw, _ttl(then)) if then is not None else (None, 0.0)
        return self.store.swap(self.key(session_id), f"r:{job_id}:{token}", new, ttl)

    def settle(self, session_id: str, prepared_job: str, then: Claim | None) -> bool:
        """Hand the thread on from a prepared compaction (applied, or found stale)."""
        new, ttl = (then.raw, _ttl(then)) if then is not None else (None, 0.0)
        return self.store.swap(self.key(session_id), f"p:{prepared_job}", new, ttl)

    @staticmethod
    def after(
        job_id: str, state: State, *, chars: int = 0, backoff_s: float = 0, worth_at: int = 0
    ) -> Claim | None:
        """The claim a job leaves: ``d`` (applied), ``p`` (prepared), ``s`` (nothing worth
        compacting at ``chars``; worth it from ``worth_at`` chars, 0: not known), ``b``
        (failed, for ``backoff_s``), or None (free)."""
        if state is State.BACKOFF and backoff_s <= 0:
            return None
        skip = f"{chars}:{worth_at}" if worth_at > 0 else str(chars)
        token = (
            skip if state is State.SKIPPED else (f"{backoff_s:g}" if state is State.BACKOFF else "")
        )
        return Claim.parse(f"{state.value}:{job_id}" + (f":{token}" if token else ""))

    def set_from(self, session_id: str, expected: Claim | None, then: Claim | None) -> bool:
        """Replace the claim ``expected`` (None: free) with ``then`` (None: free); False if the
        thread's claim is no longer ``expected``. A revert leaves ``s:<job>:<chars>`` so that
        the thread is not compacted again before it grew."""
        new, ttl = (then.raw, _ttl(then)) if then is not None else (None, 0.0)
        return self.store.swap(self.key(session_id), expected.raw if expected else None, new, ttl)

    def release_queued(self, session_id: str, job_id: str) -> bool:
        """Free a thread claimed for a job that was never published (the hook's undo)."""
        return self.store.swap(self.key(session_id), f"q:{job_id}", None, 0)


@dataclass(eq=False)
class Held:
    """One lease held by this process; ``lost`` is set when a renewal found it gone."""

    session_id: str
    job_id: str
    token: str
    since: float = field(default_factory=time.monotonic)
    lost: threading.Event = field(default_factory=threading.Event)
    #: when the lease was last taken or renewed (``time.monotonic()`` before the call)
    renewed: float = field(default_factory=time.monotonic)


class LeaseKeeper:
    """Renews every running lease of this process, every third of ``JOB_LEASE_S``.

    One daemon thread per process, whatever the number of jobs (a :class:`Renewer`). A
    lease held longer than ``max_age_s`` (``JOB_TIME_LIMIT_S``: a job stuck in a call with
    no timeout) is no longer renewed, so it lapses and the thread is queued again. A lease
    found gone is marked ``lost``: its job stops before it patches.
    """

    def __init__(self, leases: Leases, max_age_s: float) -> None:
        self.leases = leases
        self.max_age_s = max_age_s
        self.renewer = Renewer(leases.lease_s / 3, "offpath-lease-keeper")

    def hold(self, session_id: str, job_id: str, token: str) -> Held:
        held = Held(session_id, job_id, token)
        what = f"the lease of job {job_id}"
        self.renewer.hold(held, lambda: self._renew(held), lambda: self._lost(held), what)
        return held

    def drop(self, held: Held) -> None:
        self.renewer.drop(held)

    def stop(self) -> None:
        self.renewer.stop()

    def _aged(self, h: Held) -> bool:
        return time.monotonic() - h.since > self.max_age_s

    def _renew(self, h: Held) -> bool:
        if self._aged(h):
            log.error(
                "job %s has run for over %ds: its lease is left to lapse", h.job_id, self.max_age_s
            )
            return False
        asked = time.monotonic()
        kept = self.leases.renew(h.session_id, h.job_id, h.token)
        if kept:
            h.renewed = asked
        return kept

    def _lost(self, h: Held) -> None:
        if not self._aged(h):
            log.warning("job %s lost its lease on the thread (%s)", h.job_id, self.why_lost(h))
        h.lost.set()

    def why_lost(self, h: Held, now: float | None = None) -> str:
        """Why a renewal found ``h`` gone: ``lapsed`` (not renewed for a whole lease: this
        process was held up, e.g. starved of CPU) or ``taken over`` (renewed in time, so
        another holder replaced it), with the seconds since its last renewal."""
        ago = (time.monotonic() if now is None else now) - h.renewed
        how = "lapsed" if ago >= self.leases.lease_s else "taken over"
        return f"{how}: renewed {ago:.1f}s ago, lease {self.leases.lease_s:g}s"


def _ttl(claim: Claim) -> float:
    if claim.state is State.BACKOFF:
        return float(claim.token or 0)
    return {State.DONE: DONE_TTL_S, State.PREPARED: PREPARED_TTL_S}.get(claim.state, SKIPPED_TTL_S)


def failure_backoff_s(failures: int, base_s: float, cap_s: float) -> float:
    """How long a thread waits for its next job after ``failures`` failed jobs in a row:
    ``base_s`` doubling with each further failure, at most ``cap_s`` (a
    permanently failing LLM costs a bounded number of calls per thread per hour)."""
    if failures <= 0 or base_s <= 0:
        return 0.0
    return float(min(cap_s, base_s * 2 ** min(failures - 1, 30)))
