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
  (its view is superseded);
* a broker or database failure is logged, never raised; Redis calls and the
  publish are bounded by ``PUBLISH_TIMEOUT_S``. A job the broker could not take
  is recorded unpublished, and the reconciler publishes it once the broker is
  back.

Chat runs of offpath's own agent do the same from inside the run, in the
middleware (:mod:`offpath.agent.middleware`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from langchain_core.messages import BaseMessage

from offpath.compaction.accounting import total_chars
from offpath.compaction.planner.budgets import min_gain_chars
from offpath.compaction.planner.cut import plan_compaction
from offpath.compaction.planner.plans import Skip, SkipReason
from offpath.compaction.summary.message import is_summary, summary_meta
from offpath.coordination.job_values import HookResult, held
from offpath.coordination.logs import tag
from offpath.coordination.runtime import Client
from offpath.stores.leases.claims import Claim, State
from offpath.stores.usage.crossings import note_crossing

log = logging.getLogger("offpath.hook")

#: ``apply(session_id, job_id)`` applies a prepared compaction to offpath's own thread now.
Applier = Callable[[str, str], str]


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
        return self.client.jobs.queue(
            session_id,
            plan.total_chars,
            superseded=lambda c: not saw_compaction(messages, c.job_id),
            min_gain=min_gain_chars(settings),
            say_outages=True,
            threshold=settings.summarization_threshold_chars,
        )

    def _holder(self, session_id: str) -> Claim | None:
        """The thread's claim; None if the store is away (queueing records that)."""
        try:
            return self.client.leases.holder(session_id)
        except Exception:
            return None
