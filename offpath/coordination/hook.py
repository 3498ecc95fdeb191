"""The post-turn hook: after a turn appended through ``/turns``, apply a prepared compaction or
queue a job, on the turn's own state.

Runs after every imported turn, after the response has been sent (off the event
loop), so it never slows or fails the turn (DESIGN.md invariant 5):

* disabled: returns at once, no Redis, database or LLM call (invariant 7);
* plans on the messages the turn already produced: no checkpoint read, no LLM; with the
  thread's size passed in (the API keeps it incrementally) and the thread's claim
  taken (a job queued, running or prepared), it does nothing that walks the thread;
* a compaction prepared ahead and the thread now over its threshold: it applies
  it (a state update, no LLM: milliseconds);
* otherwise it queues ``compact_session`` for a plan (the planner's threshold,
  prepare-early and no-progress rules), only if the thread's claim is free
  (:mod:`offpath.stores.leases`): no job queued, running or prepared, no
  failure backoff, and no compaction that landed after the state this turn saw
  (its view is superseded: issue 8, item 7);
* a broker or database failure is logged, never raised; Redis calls and the
  publish are bounded by ``PUBLISH_TIMEOUT_S``. A job the broker could not take
  is recorded unpublished, and the reconciler publishes it once the broker is
  back (issue 8, item 3).

Chat runs of offpath's own agent do the same from inside the run, in the
middleware (:mod:`offpath.agent.middleware`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from langchain_core.messages import BaseMessage
from sqlalchemy.engine import Engine

from offpath.compaction.accounting import total_chars
from offpath.compaction.planner import Skip, SkipReason, min_gain_chars, plan_compaction
from offpath.compaction.settings import Settings
from offpath.compaction.summary import is_summary, summary_meta
from offpath.coordination.compactions import JobOptions
from offpath.coordination.logs import tag
from offpath.coordination.outages import BROKER, LEASE_STORE, OUTAGES, USAGE_DB, is_outage, where
from offpath.coordination.runtime import Client, Publisher
from offpath.stores.db import create_job, has_unpublished_job, set_published
from offpath.stores.leases import Claim, Leases, State
from offpath.stores.usage import note_crossing

log = logging.getLogger("offpath.hook")

#: The options of a job on one of offpath's own threads (its graph, its checkpointer).
OWN_THREAD = JobOptions()
#: ``apply(session_id, job_id)`` applies a prepared compaction to offpath's own thread now.
Applier = Callable[[str, str], str]


@dataclass(frozen=True, slots=True)
class HookResult:
    """What the hook did: ``queued`` with the job id, ``applied``, or why not."""

    # "queued", "applied", "skipped", "already_queued", "prepared", "superseded", "backoff",
    # "error"
    action: str
    detail: str = ""
    job_id: str | None = None


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

    def __init__(self, client: Client, apply: Applier | None = None) -> None:
        self.client = client
        self.settings = client.settings
        self.apply = apply

    def __call__(
        self, session_id: str, messages: Sequence[BaseMessage], chars: int | None = None
    ) -> HookResult:
        """``chars``: the size of ``messages`` if the caller keeps it (the API advances it over
        each turn's new messages): then the hook does O(new messages) work unless the
        thread may get a job (the claim is free), when it plans on the whole thread."""
        try:
            return self._run(session_id, messages, chars)
        except Exception as exc:  # the hook never fails a turn
            log.exception("[%s] post-turn hook failed: %s", tag(session_id), exc)
            return HookResult("error", str(exc))

    def _run(
        self, session_id: str, messages: Sequence[BaseMessage], chars: int | None
    ) -> HookResult:
        settings = self.settings
        if not settings.active:
            return HookResult("skipped", SkipReason.DISABLED)
        size = total_chars(messages) if chars is None else chars
        if size < settings.prepare_floor_chars:
            return HookResult("skipped", SkipReason.UNDER_THRESHOLD)
        holder = self._holder(session_id)
        if size > settings.summarization_threshold_chars:
            note_crossing(self.client.engine, holder)  # the compaction lag runs from here
        if size > settings.summarization_threshold_chars and self.apply is not None:
            if holder is not None and holder.state is State.PREPARED:
                done = self.apply(session_id, holder.job_id)
                if done == "applied":
                    return HookResult("applied", job_id=holder.job_id)
                holder = self._holder(session_id)
        threshold = settings.summarization_threshold_chars
        if holder is not None and not holder.frees_for(size, min_gain_chars(settings), threshold):
            return held(holder, session_id)  # no job now: no plan either
        plan = plan_compaction(messages, settings, early=True)
        if isinstance(plan, Skip):
            if plan.reason is SkipReason.NO_PROGRESS:
                log.info("[%s] not queued: %s", tag(session_id), plan.detail)
            return HookResult("skipped", plan.reason)
        return queue_job(
            self.client.leases,
            self.client.engine,
            self.client.publish,
            session_id,
            plan.total_chars,
            superseded=lambda c: not saw_compaction(messages, c.job_id),
            min_gain=min_gain_chars(settings),
            settings=settings,
            threshold=settings.summarization_threshold_chars,
        )

    def _holder(self, session_id: str) -> Claim | None:
        """The thread's claim; None if the store is away (queueing records that)."""
        try:
            return self.client.leases.holder(session_id)
        except Exception:
            return None


def queue_job(
    leases: Leases,
    engine: Engine,
    publish: Publisher,
    session_id: str,
    chars: int | None,
    superseded: Callable[[Claim], bool] = lambda _: False,
    *,
    options: JobOptions = OWN_THREAD,
    min_gain: int = 0,
    threshold: int = 0,
    settings: Settings | None = None,
) -> HookResult:
    """Claim the thread for a new job, write its ``queued`` row and publish it (the hook's, the
    middleware's and the reconciler's one way to queue a job). ``chars`` is the thread's
    size, if known; a thread a job found nothing worth compacting in is queued again only
    once it has grown by ``min_gain`` chars, or crossed its ``threshold`` (chars; 0: not
    known) since a skip decided under it (:meth:`Claim.frees_for`). ``settings``: say a
    store that cannot be reached once, naming it, then count its failures
    (:mod:`offpath.coordination.outages`); without, each failure is logged."""
    sid = tag(session_id)

    def failed(store: str, exc: Exception, what: str) -> None:
        if settings is not None and is_outage(exc):
            OUTAGES.failed(store, where(store, settings), exc, what)
        else:
            log.warning("[%s] %s (%s)", sid, what, exc)

    job_id = uuid.uuid4().hex
    opts = options.to_json()
    try:
        holder = leases.claim(
            session_id, job_id, superseded, chars=chars, min_gain=min_gain, threshold=threshold
        )
    except Exception as exc:  # Redis (or the lock database) unreachable
        failed(LEASE_STORE, exc, "compaction not queued: broker unreachable")
        _record_unpublished(
            engine,
            session_id,
            job_id,
            chars,
            f"lock store unreachable ({type(exc).__name__})",
            opts,
        )
        return HookResult("error", f"broker unreachable: {exc}")
    if holder is not None:
        return held(holder, session_id)
    try:
        create_job(engine, job_id, session_id, chars, options=opts)
    except Exception as exc:
        failed(USAGE_DB, exc, "compaction not queued: usage database error")
        leases.release_queued(session_id, job_id)
        return HookResult("error", f"database error: {exc}")
    try:
        publish(session_id, job_id, opts)
    except Exception as exc:
        # the claim stays, so later turns do not pile up jobs; the reconciler publishes it
        failed(BROKER, exc, "compaction not queued: publish failed")
        try:
            set_published(engine, job_id, False, f"publish failed ({type(exc).__name__})")
        except Exception:  # already logged above; the job row stays queued
            pass
        return HookResult("error", f"publish failed: {exc}")
    log.info("[%s] compaction queued: job %s (%s chars)", sid, job_id, chars)
    return HookResult("queued", job_id=job_id)


def held(holder: Claim, session_id: str) -> HookResult:
    """What a turn that finds the thread's claim taken by ``holder`` did: nothing."""
    if holder.state is State.DONE:
        log.info(
            "[%s] not queued: job %s compacted the thread after this turn",
            tag(session_id),
            holder.job_id,
        )
        return HookResult("superseded", holder.job_id)
    if holder.state is State.BACKOFF:
        return HookResult("backoff", f"job {holder.job_id} failed; backing off")
    if holder.state is State.PREPARED:
        return HookResult("prepared", holder.job_id)
    if holder.state is State.SKIPPED:
        return HookResult("skipped", SkipReason.NO_PROGRESS)
    return HookResult("already_queued", holder.job_id)


def _record_unpublished(
    engine: Engine,
    session_id: str,
    job_id: str,
    chars: int | None,
    reason: str,
    options: dict[str, object],
) -> None:
    """Remember that the thread needs a job the broker could not take (one such row per
    thread), for the reconciler."""
    try:
        if not has_unpublished_job(engine, session_id):
            create_job(
                engine, job_id, session_id, chars, published=False, reason=reason, options=options
            )
    except Exception as exc:
        log.warning("[%s] could not record the unqueued job either: %s", tag(session_id), exc)
