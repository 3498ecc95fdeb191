"""The values a job's life passes around (:mod:`offpath.coordination.jobs`): what a job
carries (:class:`JobOptions`, kept in its row and message), how it ends early
(:class:`JobEnded`), what queueing one did (:class:`HookResult`), what starting a delivery
found (:class:`Started`), and a compaction being applied (:class:`Applying`, :class:`Landed`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage

from offpath.compaction.digest import digest
from offpath.compaction.patch.prepared import Fitted
from offpath.compaction.planner.plans import SkipReason
from offpath.compaction.tokens import stored_ratio
from offpath.coordination.logs import tag
from offpath.stores.db.tables import JobStatus
from offpath.stores.leases.claims import Claim, Held, Start, State

_log = logging.getLogger("offpath.hook")


@dataclass(frozen=True, slots=True)
class JobOptions:
    """How a job's compaction may be applied (kept in the job's row and message).

    ``patch``: the thread is one of offpath's own agent threads, whose checkpoint the
    worker (or the post-turn hook) may write when no run holds it. False for a
    user's own agent: only its middleware applies the compaction, as a state update
    of its run. ``checkpoints``: the URL of the checkpointer that holds the thread,
    if it is not offpath's own (``postgresql://...`` or ``sqlite:///path``). ``seen``: the
    id of the newest message the run had when it queued the job; the worker waits (up to
    ``CHECKPOINT_LAG_S``) for the checkpoint to hold it before planning, as LangGraph writes
    a run's checkpoints in the background and they lag the live state.
    """

    patch: bool = True
    checkpoints: str | None = None
    seen: str | None = None
    #: An operator asked for it (``POST /sessions/{id}/compact``): planned with the planner's
    #: ``force`` and applied at once, under the threshold too.
    force: bool = False
    #: The checkpoint namespace the thread's messages live in: a subgraph's
    #: (``agent:<task id>``) when the agent runs as a node of a parent graph; None: the root.
    checkpoint_ns: str | None = None
    #: The size (chars) the job may plan from: the middleware's prepare point when it queued
    #: the job earlier than ``SUMMARIZATION_PREPARE_AT`` (a fast run); None: that floor.
    floor: int | None = None
    #: ``"<id>:<digest>"`` of the run's first message after the system prompt when it queued
    #: the job (:func:`head_mark`): after an in-run apply that is the new summary, which the
    #: checkpoint holds only a step later, while it already holds ``seen``; a job planned on
    #: the checkpoint before it was found stale at its swap ("message 0001 changed"), every
    #: time under load
    head: str | None = None
    #: Chars each model call of the run sends besides the thread (a system prompt given as
    #: ``create_agent(system_prompt=...)``, which no checkpoint holds): the planner counts
    #: them against the threshold (the bound is on what a call sends).
    outside: int = 0
    #: LangGraph's ``thread_id`` of the checkpoints that hold the messages, when the session
    #: is not named by it (an agent run as a callee inside another run: its session is
    #: ``<thread_id>|<namespace>``); None: the session id is the ``thread_id``.
    thread_id: str | None = None
    #: The thread's chars per token as its model counts them (:mod:`offpath.compaction.tokens`;
    #: None: not known, the worker counts the thread it reads)
    chars_per_token: float | None = None

    def thread_of(self, session_id: str) -> str:
        """The ``thread_id`` the checkpoints of ``session_id``'s messages are kept under."""
        return self.thread_id or session_id

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"patch": self.patch, "checkpoints": self.checkpoints}
        if self.seen:
            data["seen"] = self.seen
        if self.force:
            data["force"] = True
        if self.checkpoint_ns:
            data["checkpoint_ns"] = self.checkpoint_ns
        if self.floor is not None:
            data["floor"] = self.floor
        if self.head:
            data["head"] = self.head
        if self.outside:
            data["outside"] = self.outside
        if self.thread_id:
            data["thread_id"] = self.thread_id
        if self.chars_per_token:
            data["chars_per_token"] = self.chars_per_token
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> JobOptions:
        if not data:
            return cls()
        return cls(
            patch=bool(data.get("patch", True)),
            checkpoints=data.get("checkpoints"),
            seen=data.get("seen"),
            force=bool(data.get("force", False)),
            checkpoint_ns=data.get("checkpoint_ns") or None,
            floor=int(data["floor"]) if isinstance(data.get("floor"), int) else None,
            head=data["head"] if isinstance(data.get("head"), str) else None,
            outside=max(0, data["outside"]) if isinstance(data.get("outside"), int) else 0,
            thread_id=data["thread_id"] if isinstance(data.get("thread_id"), str) else None,
            chars_per_token=stored_ratio(data.get("chars_per_token")),
        )


def head_mark(messages: Sequence[BaseMessage]) -> str | None:
    """``"<id>:<digest>"`` of the first message after the system prompt (None: there is none),
    as :attr:`JobOptions.head` names it."""
    first = next((m for m in messages if m.type != "system"), None)
    return None if first is None else f"{first.id}:{digest(first)}"


#: The reason code of a job that failed on a value of its thread the database refused.
UNSTORABLE = "unstorable_value"


class JobEnded(Exception):
    """The job ended ``failed`` or ``skipped`` with ``code`` and ``reason`` (recorded by the
    caller); ``chars``: the thread's size when a planner skip was decided, ``worth_at``: the
    size from which its planner found a compaction worth it (0: not known)."""

    def __init__(
        self, status: JobStatus, code: str, reason: str, chars: int = 0, worth_at: int = 0
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.code = code
        self.reason = reason
        self.chars = chars
        self.worth_at = worth_at


#: The options of a job on one of offpath's own threads (its graph, its checkpointer).
OWN_THREAD = JobOptions()


@dataclass(frozen=True, slots=True)
class HookResult:
    """What the hook did: ``queued`` with the job id, ``applied``, or why not."""

    # "queued", "applied", "skipped", "already_queued", "prepared", "superseded", "backoff",
    # "error"
    action: str
    detail: str = ""
    job_id: str | None = None


def held(holder: Claim, session_id: str) -> HookResult:
    """What a turn that finds the thread's claim taken by ``holder`` did: nothing."""
    if holder.state is State.DONE:
        _log.info(
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


@dataclass(frozen=True, slots=True)
class Started:
    """What :meth:`Jobs.start` found: ``done``, the status of a job past running (nothing to
    do); else ``start`` and the claim ``before`` it, ``stored`` (a previous delivery's
    result) and, when it started, the running ``lease`` (renewed until the job ends)."""

    done: JobStatus | None
    stored: dict[str, Any] | None = None
    start: Start | None = None
    before: Claim | None = None
    lease: Held | None = None


@dataclass(frozen=True, slots=True)
class Landed:
    """:meth:`Jobs.apply` found the job's summary in the thread already (now recorded)."""

    record: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Applying:
    """A compaction fitted to the thread ``messages`` and about to be written: what a
    :class:`Writer` archives and writes. ``holding``: the claim it is applied under (the
    worker's running lease, or ``p:<job>``)."""

    session_id: str
    job_id: str
    result: Mapping[str, Any]
    fitted: Fitted
    messages: Sequence[BaseMessage]
    holding: Held | State | None = None
