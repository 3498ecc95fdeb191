"""The post-turn hook: decide on the turn's own state whether to queue a compaction job.

Runs after every turn on both write routes, after the response has been sent
(FastAPI background task, in the thread pool, off the event loop), so it never
slows or fails the turn (DESIGN.md invariant 5):

* disabled: returns at once, no Redis, database or LLM call (invariant 7);
* plans on the messages the turn already produced: no checkpoint read, no LLM;
* queues ``compact_session`` only for a plan (the planner's threshold and
  no-progress rules), and only if no job for the thread is queued or running
  (the Redis claim);
* a broker or database failure is logged, never raised; Redis calls and the
  publish are bounded by ``PUBLISH_TIMEOUT_S``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from langchain_core.messages import BaseMessage
from sqlalchemy.engine import Engine

from compaction.planner import Skip, SkipReason, plan_compaction
from compaction.settings import Settings
from service.db import FINAL_VALUES, JobStatus, create_job, job_status, now_utc, set_job
from service.locks import Locks

log = logging.getLogger("offpath.hook")

#: ``publish(session_id, job_id)`` sends the job to the broker; raises on failure.
Publisher = Callable[[str, str], None]


@dataclass(frozen=True, slots=True)
class HookResult:
    """What the hook did: ``queued`` with the job id, or why not."""

    action: str  # "queued", "skipped", "already_queued", "error"
    detail: str = ""
    job_id: str | None = None


class PostTurnHook:
    def __init__(
        self, settings: Settings, locks: Locks, engine: Engine, publish: Publisher
    ) -> None:
        self.settings = settings
        self.locks = locks
        self.engine = engine
        self.publish = publish

    def __call__(self, session_id: str, messages: Sequence[BaseMessage]) -> HookResult:
        try:
            return self._run(session_id, messages)
        except Exception as exc:  # the hook never fails a turn
            log.exception("[%s] post-turn hook failed: %s", session_id[:8], exc)
            return HookResult("error", str(exc))

    def _run(self, session_id: str, messages: Sequence[BaseMessage]) -> HookResult:
        if not self.settings.active:
            return HookResult("skipped", SkipReason.DISABLED)
        plan = plan_compaction(messages, self.settings)
        if isinstance(plan, Skip):
            if plan.reason is SkipReason.NO_PROGRESS:
                log.info("[%s] not queued: %s", session_id[:8], plan.detail)
            return HookResult("skipped", plan.reason)
        job_id = uuid.uuid4().hex
        sid = session_id[:8]
        try:
            if not self._claim(session_id, job_id):
                return HookResult("already_queued")
        except Exception as exc:  # Redis (or the lock database) unreachable
            log.warning("[%s] compaction not queued: broker unreachable (%s)", sid, exc)
            return HookResult("error", f"broker unreachable: {exc}")
        try:
            create_job(self.engine, job_id, session_id, plan.total_chars)
        except Exception as exc:
            log.warning("[%s] compaction not queued: usage database error (%s)", sid, exc)
            self._unclaim(session_id, job_id)
            return HookResult("error", f"database error: {exc}")
        try:
            self.publish(session_id, job_id)
        except Exception as exc:
            log.warning("[%s] compaction not queued: publish failed (%s)", sid, exc)
            self._unclaim(session_id, job_id)
            try:
                set_job(
                    self.engine, job_id, session_id, JobStatus.FAILED, f"could not publish: {exc}"
                )
            except Exception:  # already logged above; the row stays queued
                pass
            return HookResult("error", f"publish failed: {exc}")
        log.info("[%s] compaction queued: job %s (%d chars)", sid, job_id, plan.total_chars)
        return HookResult("queued", job_id=job_id)

    def _claim(self, session_id: str, job_id: str) -> bool:
        """Claim the thread for ``job_id``. A claim is taken over when its job has ended (it
        releases the claim just after writing its final status) or has not moved for
        ``JOB_TIME_LIMIT_S`` (its worker died: the redelivery may be an hour away)."""
        if self.locks.claim_job(session_id, job_id):
            return True
        holder = self.locks.claimed_by(session_id)
        if holder is None:
            return self.locks.claim_job(session_id, job_id)
        status, updated_at = job_status(self.engine, holder)
        stale = (
            updated_at is not None
            and (now_utc() - updated_at).total_seconds() > self.settings.job_time_limit_s
        )
        if status not in FINAL_VALUES and not stale:
            return False
        log.info(
            "[%s] taking over the claim of job %s (%s)",
            session_id[:8],
            holder,
            status if not stale else "stale",
        )
        self.locks.release_job(session_id, holder)
        return self.locks.claim_job(session_id, job_id)

    def _unclaim(self, session_id: str, job_id: str) -> None:
        try:
            self.locks.release_job(session_id, job_id)
        except Exception:  # the claim expires on its own
            pass
