"""The post-turn hook: after a turn appended through ``/turns``, apply a prepared compaction or
queue a job, on the turn's own state.

Runs after every imported turn, after the response has been sent (off the event
loop), so it never slows or fails the turn (DESIGN.md invariant 5):

* disabled: returns at once, no Redis, database or LLM call (invariant 7);
* plans on the messages the turn already produced: no checkpoint read, no LLM; with the
  thread's size passed in (the API keeps it incrementally) and the thread's claim
  taken (a job queued, running or prepared), it does nothing that walks the thread;
* a compaction prepared ahead and the thread now over its threshold: it applies
  it (a state update, no LLM: milliseconds); the same under the threshold, over the prepare
  floor, for a thread that was idle ``SUMMARIZATION_IDLE_APPLY_S`` before this turn (a
  thread that stopped between the prepare floor and its threshold and came back: its
  provider's prompt cache is cold by then, so the summary costs no cached prefix);
* under the threshold, a job starts preparing only from the thread's *prepare point*:
  the prepare floor (``SUMMARIZATION_PREPARE_AT`` x the threshold) for a thread that grows
  fast, later for one whose growth (chars per second and per turn, kept per thread in this
  process) says the crossing is further away than a job takes (the summarizer's p90
  latency and a job's overhead): at the last turn from which its summary is ready before
  the turn after the crossing. A summary prepared for a thread that then stops under its
  threshold is paid for and never applied; one queued at the crossing of a thread whose
  turns are further apart than a job takes is applied before its next turn;
* otherwise it queues ``compact_session`` for a plan (the planner's threshold,
  prepare-early and no-progress rules), only if the thread's claim is free
  (:mod:`offpath.stores.leases`): no job queued, running or prepared, no
  failure backoff, and no compaction that landed after the state this turn saw
  (its view is superseded);
* past the thread's keep window, the facts of the turn's new messages go to the fact store's
  writer thread (:meth:`~offpath.stores.facts.FactStore.remember_soon`): the hook never
  waits for them nor for Redis, and at most ``MAX_PENDING`` batches wait there (one dropped
  costs the job that removes those messages the CPU of finding their facts);
* a broker or database failure is logged, never raised; Redis calls and the
  publish are bounded by ``PUBLISH_TIMEOUT_S``. A job the broker could not take
  is recorded unpublished, and the reconciler publishes it once the broker is
  back.

Chat runs of offpath's own agent do the same from inside the run, in the
middleware (:mod:`offpath.agent.middleware`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from langchain_core.messages import BaseMessage

from offpath.compaction.accounting import total_chars
from offpath.compaction.planner import (
    Skip,
    SkipReason,
    blended_rate,
    min_gain_chars,
    plan_compaction,
    turn_lead_chars,
)
from offpath.compaction.summary import is_summary, summary_meta
from offpath.coordination.jobs import HookResult, held
from offpath.coordination.logs import tag
from offpath.coordination.outages import cause, is_outage
from offpath.coordination.runtime import Client
from offpath.stores.db.transitions import note_crossing
from offpath.stores.leases.claims import Claim, State
from offpath.stores.usage.totals import SummarizerLatency

log = logging.getLogger("offpath.hook")

#: ``apply(session_id, job_id)`` applies a prepared compaction to offpath's own thread now.
Applier = Callable[[str, str], str]

#: Threads whose growth one hook keeps; the least recently seen is let go first.
TRACKED_THREADS = 10_000


class Growth:
    """Each thread's growth, as the turns the hook sees say: in chars per second and in chars
    per turn, exponential moving averages over the turns in which the thread grew (a
    compaction, which shrinks it, starts a new interval). Bounded to :data:`TRACKED_THREADS`
    threads; thread-safe (hooks of several turns run at once)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        # t, chars, rate, step
        self._seen: OrderedDict[str, tuple[float, int, float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def note(self, session_id: str, chars: int) -> tuple[float, int]:
        """Record that thread ``session_id`` is ``chars`` long now; returns its growth rate
        (chars per second) and its turn (chars), each 0 while unknown: fewer than two growing
        turns seen."""
        now = self.clock()
        with self._lock:
            last = self._seen.pop(session_id, None)
            rate = step = 0.0
            if last is not None:
                t, before, rate, step = last
                if now > t and chars > before:
                    rate = blended_rate(rate, (chars - before) / (now - t))
                    step = blended_rate(step, chars - before)
            self._seen[session_id] = (now, chars, rate, step)
            while len(self._seen) > TRACKED_THREADS:
                self._seen.popitem(last=False)
            return rate, round(step)


def saw_compaction(messages: Sequence[BaseMessage], job_id: str) -> bool:
    """The thread state ``messages`` already holds the summary of job ``job_id`` (it sits
    right after the system messages, so this looks at the head only)."""
    for m in messages:
        if m.type != "system":
            return is_summary(m) and summary_meta(m).get("job_id") == job_id
    return False


class PostTurnHook:
    """``hook(session_id, messages)`` after a turn; ``apply`` (offpath's own threads) applies
    a prepared compaction, None: never (then a prepared one waits for the worker)."""

    def __init__(
        self,
        client: Client,
        apply: Applier | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.settings = client.settings
        self.apply = apply
        self.clock = clock
        self.growth = Growth(clock)
        self.latency = SummarizerLatency(clock=clock)

    def __call__(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        chars: int | None = None,
        idle_s: float | None = None,
    ) -> HookResult:
        """``chars``: the size of ``messages`` if the caller keeps it (the API advances it over
        each turn's new messages): then the hook does O(new messages) work unless the
        thread may get a job (the claim is free), when it plans on the whole thread.
        ``idle_s``: seconds the thread was idle before this turn (since its previous write;
        None: unknown, never idle)."""
        try:
            return self._run(session_id, messages, chars, idle_s)
        except Exception as exc:  # the hook never fails a turn
            if is_outage(exc):  # expected while a store is away: one line, the next turn retries
                log.warning(
                    "[%s] post-turn hook: a store did not answer (%s); the next turn tries again",
                    tag(session_id),
                    cause(exc),
                )
            else:
                log.exception("[%s] post-turn hook failed: %s", tag(session_id), exc)
            return HookResult("error", str(exc))

    def _run(
        self,
        session_id: str,
        messages: Sequence[BaseMessage],
        chars: int | None,
        idle_s: float | None = None,
    ) -> HookResult:
        settings = self.settings
        if not settings.active:
            return HookResult("skipped", SkipReason.DISABLED)
        size = total_chars(messages) if chars is None else chars
        rate, step = self.growth.note(session_id, size)
        if size > settings.summarization_keep_chars:
            # a thread past its keep window has messages a compaction will remove: their
            # facts are found once, on the fact store's writer thread (bounded; never in the
            # way of this hook's apply or queue), for the job that removes them
            self.client.facts.remember_soon(messages)
        if size < settings.prepare_floor_chars:
            return HookResult("skipped", SkipReason.UNDER_THRESHOLD)
        over = size > settings.summarization_threshold_chars
        far = not over and size < self.prepare_point(rate, step)  # the crossing is far
        idle = settings.idle_apply(idle_s)  # over the prepare floor, back after an idle time
        if far and not idle:
            return HookResult("skipped", SkipReason.UNDER_THRESHOLD)
        holder = self._holder(session_id)
        if over:
            note_crossing(self.client.engine, holder)  # the compaction lag runs from here
        if (over or idle) and self.apply is not None:
            if holder is not None and holder.state is State.PREPARED:
                if not over:
                    log.info(
                        "[%s] idle %.0f s under the threshold: applying prepared job %s",
                        tag(session_id),
                        idle_s,
                        holder.job_id,
                    )
                done = self.apply(session_id, holder.job_id)
                if done == "applied":
                    return HookResult("applied", job_id=holder.job_id)
                holder = self._holder(session_id)
        if far:
            return HookResult("skipped", SkipReason.UNDER_THRESHOLD)
        threshold = settings.summarization_threshold_chars
        if holder is not None and not holder.frees_for(size, min_gain_chars(settings), threshold):
            return held(holder, session_id)  # no job now: no plan either
        plan = plan_compaction(messages, settings, early=True)
        if isinstance(plan, Skip):
            if plan.reason is SkipReason.NO_PROGRESS:
                log.info("[%s] not queued: %s", tag(session_id), plan.detail)
            return HookResult("skipped", plan.reason)
        return self.client.jobs.queue(
            session_id,
            plan.total_chars,
            superseded=lambda c: not saw_compaction(messages, c.job_id),
            min_gain=min_gain_chars(settings),
            say_outages=True,
            threshold=settings.summarization_threshold_chars,
        )

    def prepare_point(self, rate: float, step: int = 0) -> int:
        """The size (chars) from which a thread growing at ``rate`` chars per second, by turns
        of ``step`` chars (0: unknown), gets a job:
        :func:`~offpath.compaction.planner.turn_lead_chars` before the threshold (the
        summarizer's p90 latency, read inline at most every minute), never before the prepare
        floor; the floor while the rate is unknown."""
        s = self.settings
        floor, threshold = s.prepare_floor_chars, s.summarization_threshold_chars
        if rate <= 0:
            return floor
        if self.latency.due():
            self.latency.refresh(self.client.engine)
        return max(floor, threshold - turn_lead_chars(rate, self.latency.seconds, step))

    def _holder(self, session_id: str) -> Claim | None:
        """The thread's claim; None if the store is away (queueing records that)."""
        try:
            return self.client.leases.holder(session_id)
        except Exception:
            return None
