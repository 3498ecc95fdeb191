"""The post-turn hook: decide on the turn's own state whether to queue a compaction job.

Runs after every turn on both write routes, after the response has been sent
(FastAPI background task, in the thread pool, off the event loop), so it never
slows or fails the turn (DESIGN.md invariant 5):

* disabled: returns at once, no Redis, database or LLM call (invariant 7);
* plans on the messages the turn already produced: no checkpoint read, no LLM;
* queues ``compact_session`` only for a plan (the planner's threshold and
  no-progress rules), and only if the thread's claim is free (:mod:`service.leases`):
  no job queued or running, no failure backoff, and no compaction that landed
  after the state this turn saw (its view is superseded: issue 8, item 7);
* a broker or database failure is logged, never raised; Redis calls and the
  publish are bounded by ``PUBLISH_TIMEOUT_S``. A job the broker could not take
  is recorded unpublished, and the reconciler publishes it once the broker is
  back (issue 8, item 3).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from langchain_core.messages import BaseMessage
from sqlalchemy.engine import Engine

from offpath.compaction.planner import Skip, SkipReason, plan_compaction
from offpath.compaction.settings import Settings
from offpath.compaction.summary import is_summary, summary_meta
from offpath.service.db import create_job, has_unpublished_job, set_published
from offpath.service.leases import Claim, Leases, State
from offpath.service.logs import tag

log = logging.getLogger("offpath.hook")

#: ``publish(session_id, job_id)`` sends the job to the broker; raises on failure.
Publisher = Callable[[str, str], None]


@dataclass(frozen=True, slots=True)
class HookResult:
    """What the hook did: ``queued`` with the job id, or why not."""

    # "queued", "skipped", "already_queued", "superseded", "backoff", "error"
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
    def __init__(self, settings: Settings, leases: Leases, engine: Engine, publish: Publisher):
        self.settings = settings
        self.leases = leases
        self.engine = engine
        self.publish = publish

    def __call__(self, session_id: str, messages: Sequence[BaseMessage]) -> HookResult:
        try:
            return self._run(session_id, messages)
        except Exception as exc:  # the hook never fails a turn
            log.exception("[%s] post-turn hook failed: %s", tag(session_id), exc)
            return HookResult("error", str(exc))

    def _run(self, session_id: str, messages: Sequence[BaseMessage]) -> HookResult:
        if not self.settings.active:
            return HookResult("skipped", SkipReason.DISABLED)
        plan = plan_compaction(messages, self.settings)
        if isinstance(plan, Skip):
            if plan.reason is SkipReason.NO_PROGRESS:
                log.info("[%s] not queued: %s", tag(session_id), plan.detail)
            return HookResult("skipped", plan.reason)
        return queue_job(
            self.leases,
            self.engine,
            self.publish,
            session_id,
            plan.total_chars,
            superseded=lambda c: not saw_compaction(messages, c.job_id),
        )


def queue_job(
    leases: Leases,
    engine: Engine,
    publish: Publisher,
    session_id: str,
    chars: int | None,
    superseded: Callable[[Claim], bool] = lambda _: False,
) -> HookResult:
    """Claim the thread for a new job, write its ``queued`` row and publish it (the hook's and
    the reconciler's one way to queue a job)."""
    sid = tag(session_id)
    job_id = uuid.uuid4().hex
    try:
        holder = leases.claim(session_id, job_id, superseded)
    except Exception as exc:  # Redis (or the lock database) unreachable
        log.warning("[%s] compaction not queued: broker unreachable (%s)", sid, exc)
        _record_unpublished(engine, session_id, job_id, chars, f"lock store unreachable: {exc}")
        return HookResult("error", f"broker unreachable: {exc}")
    if holder is not None:
        if holder.state is State.DONE:
            log.info(
                "[%s] not queued: job %s compacted the thread after this turn", sid, holder.job_id
            )
            return HookResult("superseded", holder.job_id)
        if holder.state is State.BACKOFF:
            return HookResult("backoff", f"job {holder.job_id} failed; backing off")
        return HookResult("already_queued", holder.job_id)
    try:
        create_job(engine, job_id, session_id, chars)
    except Exception as exc:
        log.warning("[%s] compaction not queued: usage database error (%s)", sid, exc)
        leases.release_queued(session_id, job_id)
        return HookResult("error", f"database error: {exc}")
    try:
        publish(session_id, job_id)
    except Exception as exc:
        # the claim stays, so later turns do not pile up jobs; the reconciler publishes it
        log.warning("[%s] compaction not queued: publish failed (%s)", sid, exc)
        try:
            set_published(engine, job_id, False, f"publish failed: {exc}")
        except Exception:  # already logged above; the job row stays queued
            pass
        return HookResult("error", f"publish failed: {exc}")
    log.info("[%s] compaction queued: job %s (%s chars)", sid, job_id, chars)
    return HookResult("queued", job_id=job_id)


def _record_unpublished(
    engine: Engine, session_id: str, job_id: str, chars: int | None, reason: str
) -> None:
    """Remember that the thread needs a job the broker could not take (one such row per
    thread), for the reconciler."""
    try:
        if not has_unpublished_job(engine, session_id):
            create_job(engine, job_id, session_id, chars, published=False, reason=reason)
    except Exception as exc:
        log.warning("[%s] could not record the unqueued job either: %s", tag(session_id), exc)
