"""Session admin: compact a session now, delete a session. The routes are in
:mod:`offpath.api.admin`; the reads are in :mod:`offpath.stores.usage`.

Compact now goes through the one way to queue a job
(:meth:`offpath.coordination.jobs.Jobs.queue`: claim, ``queued`` row, publish), with
``JobOptions(force=True)``: the worker plans with the planner's ``force`` (no threshold,
any cut that removes more than its summary adds) and applies at once, under the
threshold too. A compaction already prepared is applied now instead.

A team's own agent's thread (kind ``own agent``: :mod:`offpath.agent.middleware`) is read from the
agent's checkpointer and never written by offpath: compact now queues a job that the worker
prepares (``patch=False``) and the agent's middleware applies at the thread's next model call,
under the threshold too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from offpath.compaction.planner import Skip, plan_compaction
from offpath.coordination.jobs import JobOptions
from offpath.coordination.logs import tag
from offpath.coordination.runtime import Runtime
from offpath.coordination.writers import apply_prepared
from offpath.stores import archive
from offpath.stores.checkpoints import Thread, read_messages, read_thread
from offpath.stores.db.tables import JOBS
from offpath.stores.leases.claims import Claim, State
from offpath.stores.tenants import API, OWN_AGENT, session_of
from offpath.stores.usage.sessions import forget_rows

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


#: What compact now answers for a thread of a team's own agent.
OWN_AGENT_NEXT = (
    "a thread of a team's own agent: offpath never writes its checkpoint, so the worker "
    "prepares the compaction and the agent's OffPathCompaction middleware applies it at the "
    "thread's next model call (or the end of a run going on now)"
)


@dataclass(frozen=True, slots=True)
class Compaction:
    """What compact-now did: ``queued`` (``job_id`` is the new job), ``applied`` (a
    compaction prepared ahead, ``job_id``, was applied at once) or ``prepared`` (a team's own
    agent's thread: its middleware applies it at the next model call); ``kind``: the
    session's; ``detail``: what happens next, in words."""

    job_id: str
    status: str
    kind: str = API
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Source:
    """Where a session's thread lives: ``kind`` (``api`` or ``own agent``), the URL of the
    checkpointer that holds it (None: offpath's own) and its checkpoint namespace (a
    subgraph's; None: the root)."""

    kind: str = API
    checkpoints: str | None = None
    ns: str | None = None

    @property
    def own_agent(self) -> bool:
        return self.kind == OWN_AGENT


def source_of(rt: Runtime, session_id: str) -> Source:
    """Where ``session_id``'s thread is read from: its ``sessions`` row (kind, the agent's
    checkpointer URL) and its latest job's options (the URL the worker reads, a subgraph's
    namespace). A thread the middleware compacted before sessions had kinds, with no row, is
    an own agent's when its jobs say so (``patch`` false)."""
    info = session_of(rt.engine, session_id)
    if info is not None and not info.own_agent:
        return Source()
    with rt.engine.connect() as conn:
        options: dict[str, Any] = (
            conn.execute(
                sa.select(JOBS.c.options)
                .where(JOBS.c.session_id == session_id)
                .order_by(JOBS.c.created_at.desc())
                .limit(1)
            ).scalar()
            or {}
        )
    if info is None and options.get("patch", True):
        return Source()
    return Source(
        OWN_AGENT,
        (info.checkpoints if info is not None else None) or options.get("checkpoints"),
        options.get("checkpoint_ns") or None,
    )


def read_session(rt: Runtime, session_id: str) -> tuple[Source, Thread]:
    """The session's thread, read straight from the checkpointer that holds it (an own
    agent's by URL: :func:`source_of`); an empty :class:`Thread` if there is none."""
    source = source_of(rt, session_id)
    saver = rt.checkpoints_for(source.checkpoints).saver
    return source, read_thread(saver, session_id, source.ns)


def compact_now(rt: Runtime, session_id: str) -> Compaction:
    """Queue a compaction of ``session_id`` now, or apply the one prepared (a team's own
    agent's thread: :func:`compact_own`).

    Raises :class:`JobInFlight` (a job queued or running, or the failure backoff),
    :class:`NothingToCompact` (the planner finds no cut: the thread fits its keep window,
    no cut leaves tool-call pairs whole, or fewer than 4 messages would go),
    :class:`NotQueued` (broker or lock store unreachable), ``LookupError`` (no thread).
    """
    source = source_of(rt, session_id)
    if source.own_agent:
        return compact_own(rt, session_id, source)
    messages = read_messages(rt.checkpoints.saver, session_id)
    if not messages:
        raise LookupError(f"no thread {session_id!r} in offpath's checkpointer")
    holder = rt.leases.holder(session_id)
    refuse_if_held(holder, session_id)
    if holder is not None and holder.state is State.PREPARED:
        if apply_prepared(rt, session_id, holder.job_id) == "applied":
            return Compaction(holder.job_id, "applied")
        messages = read_messages(rt.checkpoints.saver, session_id)  # stale: plan anew
    plan = plan_compaction(messages, rt.settings, force=True)
    if isinstance(plan, Skip):
        raise NothingToCompact(plan.reason.value, plan.detail)
    done = rt.jobs.queue(session_id, plan.total_chars, options=FORCED)
    if done.action == "queued" and done.job_id:
        log.info("[%s] compaction queued on request: job %s", tag(session_id), done.job_id)
        return Compaction(done.job_id, "queued")
    if done.action == "error":
        raise NotQueued(f"the job could not be queued: {done.detail}")
    raise JobInFlight(f"the session is held: {done.action} {done.detail}".strip())


def refuse_if_held(holder: Claim | None, session_id: str) -> None:
    """Raise :class:`JobInFlight` if ``holder`` (the thread's claim) has a job in flight or
    holds the thread in its failure backoff: compact now waits for neither."""
    if holder is not None and holder.in_flight:
        raise JobInFlight(f"job {holder.job_id} is {holder.state.name.lower()} on this session")
    if holder is not None and holder.state is State.BACKOFF:
        raise JobInFlight(
            f"job {holder.job_id} failed and the session is in its failure backoff "
            f"({float(holder.token or 0):g} s; see GET /sessions/{session_id}/compactions)"
        )


def compact_own(rt: Runtime, session_id: str, source: Source) -> Compaction:
    """Compact now a thread of a team's own agent: a forced job the worker prepares (never
    patches) and the agent's middleware applies at the thread's next model call, under the
    threshold too; a compaction prepared already is marked forced (applied so as well).
    Raises as :func:`compact_now`."""
    thread = read_thread(rt.checkpoints_for(source.checkpoints).saver, session_id, source.ns)
    if not thread.messages:
        raise LookupError(f"no thread {session_id!r} in its agent's checkpointer")
    holder = rt.leases.holder(session_id)
    refuse_if_held(holder, session_id)
    if holder is not None and holder.state is State.PREPARED and rt.jobs.force(holder.job_id):
        return Compaction(holder.job_id, "prepared", OWN_AGENT, OWN_AGENT_NEXT)
    plan = plan_compaction(thread.messages, rt.settings, force=True)
    if isinstance(plan, Skip):
        raise NothingToCompact(plan.reason.value, plan.detail)
    options = JobOptions(
        patch=False, checkpoints=source.checkpoints, force=True, checkpoint_ns=source.ns
    )
    done = rt.jobs.queue(session_id, plan.total_chars, options=options)
    if done.action == "queued" and done.job_id:
        log.info(
            "[%s] own agent's compaction queued on request: job %s", tag(session_id), done.job_id
        )
        return Compaction(done.job_id, "queued", OWN_AGENT, OWN_AGENT_NEXT)
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
        rt.jobs.forget(session_id, holder)
    log.info("[%s] session deleted: %s", tag(session_id), gone)
    return gone
