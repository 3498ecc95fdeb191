"""Session admin: compact a session now, delete a session (issue 12). The routes are in
:mod:`offpath.api.admin`; the reads are in :mod:`offpath.service.usage`.

Compact now goes through the one way to queue a job
(:func:`offpath.service.hook.queue_job`: claim, ``queued`` row, publish), with
``JobOptions(force=True)``: the worker plans with the planner's ``force`` (no threshold,
any cut that removes more than its summary adds) and applies at once, under the
threshold too. A compaction already prepared is applied now instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from offpath.compaction.planner import Skip, plan_compaction
from offpath.service import archive
from offpath.service.compactions import JobOptions, apply_prepared, read_messages
from offpath.service.hook import queue_job
from offpath.service.leases import State
from offpath.service.logs import tag
from offpath.service.runtime import Runtime
from offpath.service.usage import forget_rows

log = logging.getLogger("offpath.admin")

#: A job queued by an operator.
FORCED = JobOptions(force=True)


class NothingToCompact(Exception):
    """The planner finds no cut worth making (``code``: its skip reason)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"nothing to compact now ({code}): {detail}")
        self.code = code


class JobInFlight(Exception):
    """A job holds the thread (queued or running), or its failure backoff runs."""


class NotQueued(Exception):
    """The broker or the lock store could not take the job (the reconciler publishes a job
    recorded unpublished once the broker is back)."""


@dataclass(frozen=True, slots=True)
class Compaction:
    """What compact-now did: ``queued`` (``job_id`` is the new job), or ``applied`` (a
    compaction prepared ahead, ``job_id``, was applied at once)."""

    job_id: str
    status: str


def compact_now(rt: Runtime, session_id: str) -> Compaction:
    """Queue a compaction of offpath's own thread ``session_id`` now, or apply the one prepared.

    Raises :class:`JobInFlight` (a job queued or running, or the failure backoff),
    :class:`NothingToCompact` (the planner finds no cut: the thread fits its keep window,
    no cut leaves tool-call pairs whole, or fewer than 4 messages would go),
    :class:`NotQueued` (broker or lock store unreachable), ``LookupError`` (no thread).
    """
    messages = read_messages(rt.checkpoints.saver, session_id)
    if not messages:
        raise LookupError(f"no thread {session_id!r} in offpath's checkpointer")
    holder = rt.leases.holder(session_id)
    if holder is not None and holder.in_flight:
        raise JobInFlight(f"job {holder.job_id} is {holder.state.name.lower()} on this session")
    if holder is not None and holder.state is State.BACKOFF:
        raise JobInFlight(
            f"job {holder.job_id} failed and the session is in its failure backoff "
            f"({float(holder.token or 0):g} s; see GET /sessions/{session_id}/compactions)"
        )
    if holder is not None and holder.state is State.PREPARED:
        if apply_prepared(rt, session_id, holder.job_id) == "applied":
            return Compaction(holder.job_id, "applied")
        messages = read_messages(rt.checkpoints.saver, session_id)  # stale: plan anew
    plan = plan_compaction(messages, rt.settings, force=True)
    if isinstance(plan, Skip):
        raise NothingToCompact(plan.reason.value, plan.detail)
    done = queue_job(rt.leases, rt.engine, rt.publish, session_id, plan.total_chars, options=FORCED)
    if done.action == "queued" and done.job_id:
        log.info("[%s] compaction queued on request: job %s", tag(session_id), done.job_id)
        return Compaction(done.job_id, "queued")
    if done.action == "error":
        raise NotQueued(f"the job could not be queued: {done.detail}")
    raise JobInFlight(f"the session is held: {done.action} {done.detail}".strip())


def delete_session(rt: Runtime, session_id: str) -> dict[str, int]:
    """Delete everything offpath keeps of ``session_id``: its checkpoints (offpath's own
    checkpointer), archived originals, job rows, usage events, fallback maskings, owner row
    and claim. Takes the thread's lock (``ThreadBusy`` while a turn runs).

    Raises :class:`JobInFlight` while a job is queued or running (its worker would write
    rows back). Checkpoints go first, then the rows: a delete that fails half-way leaves
    rows that a second delete removes. Returns how many rows of each kind went.
    """
    with rt.locks.turn(session_id):
        holder = rt.leases.holder(session_id)
        if holder is not None and holder.in_flight:
            raise JobInFlight(
                f"job {holder.job_id} is {holder.state.name.lower()} on this session: "
                "delete it once the job ended"
            )
        rt.checkpoints.saver.delete_thread(session_id)
        gone = {"archive": archive.forget(rt.engine, session_id)}
        gone.update(forget_rows(rt.engine, session_id))
        if holder is not None:
            rt.leases.store.swap(rt.leases.key(session_id), holder.raw, None, 0)
    log.info("[%s] session deleted: %s", tag(session_id), gone)
    return gone
