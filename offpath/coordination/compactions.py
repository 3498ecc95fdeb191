"""Applying a prepared compaction to offpath's own threads, and how a job may do it.

A job prepares (plans and summarizes); the compaction is applied once the thread
is free and over its threshold (DESIGN.md "Compaction during a run"):

* by the worker, at once, if no agent run holds the thread;
* by the post-turn hook, after the turn that pushed the thread over (``/turns``);
* by the middleware, inside a run, at its next model call
  (:mod:`offpath.agent.middleware`; the only way for a user's own agent, whose
  checkpoint offpath never writes).

The worker and the hook both go through :func:`apply_locked`, under the thread's
lock: it recognises a patch that already landed, fits the prepared compaction to
the thread as it is, refuses a patch that would orphan a tool call, stores
offpath's own record of the summary, writes the checkpoint and records the
usage event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.messages import BaseMessage, RemoveMessage, convert_to_messages
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.graph.message import REMOVE_ALL_MESSAGES, add_messages

from offpath.compaction.accounting import content_text, total_chars
from offpath.compaction.digest import digest
from offpath.compaction.loss import loss_report
from offpath.compaction.pairing import new_unpaired
from offpath.compaction.patch import Fitted, Prepared, Stale, fit, landed
from offpath.compaction.planner import landing_chars
from offpath.compaction.tokens import stored_ratio
from offpath.coordination.faults import failpoint
from offpath.coordination.logs import tag
from offpath.stores import archive
from offpath.stores.db import JobStatus, finalize, job_row, set_job
from offpath.stores.leases import Leases, State
from offpath.stores.tenants import note_size
from offpath.stores.values import Unstorable

if TYPE_CHECKING:
    from offpath.coordination.runtime import Runtime

log = logging.getLogger("offpath.compactions")


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
    #: time under load (benchmark 17, issue 18)
    head: str | None = None
    #: Chars each model call of the run sends besides the thread (a system prompt given as
    #: ``create_agent(system_prompt=...)``, which no checkpoint holds): the planner counts
    #: them against the threshold (issue 18: the bound is on what a call sends).
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


@dataclass(frozen=True, slots=True)
class Thread:
    """A thread as read from its latest checkpoint: its messages and the checkpoint itself
    (``base``, None for a thread with none), so that a patch can start from it."""

    messages: list[BaseMessage]
    base: CheckpointTuple | None = None

    @property
    def checkpoint_id(self) -> str | None:
        return self.base.checkpoint["id"] if self.base is not None else None


def read_thread(saver: BaseCheckpointSaver, session_id: str, ns: str | None = None) -> Thread:
    """The thread's latest checkpoint and its messages (one read, no graph; a ``messages``
    channel kept as a ``DeltaChannel``, deepagents' default, is rebuilt from its history);
    ``ns``: the checkpoint namespace of a subgraph's thread (None: the root's)."""
    config = {"configurable": {"thread_id": session_id, "checkpoint_ns": ns or ""}}
    tup = saver.get_tuple(config)  # type: ignore[arg-type]
    if tup is None:
        return Thread([])
    return Thread(checkpoint_messages(saver, tup), tup)


def checkpoint_messages(saver: BaseCheckpointSaver, tup: CheckpointTuple) -> list[BaseMessage]:
    """The ``messages`` channel's value at checkpoint ``tup``. A ``DeltaChannel`` (deepagents
    keeps its messages in one) stores nothing at most checkpoints, or a snapshot now and then:
    its value is its nearest snapshot with the writes since replayed through ``add_messages``,
    as LangGraph itself rebuilds it (``get_delta_channel_history``)."""
    checkpoint = tup.checkpoint
    stored = checkpoint.get("channel_values", {}).get("messages")
    if isinstance(stored, _DeltaSnapshot):
        stored = stored.value
    if stored is not None or "messages" not in checkpoint.get("channel_versions", {}):
        return list(stored or [])
    history = saver.get_delta_channel_history(config=tup.config, channels=["messages"])
    found = history.get("messages") or {"writes": []}
    channel = DeltaChannel(_add_each, list).from_checkpoint(found.get("seed"))
    channel.replay_writes(found["writes"])
    return list(channel.get())


def _add_each(state: list[BaseMessage], writes: Sequence[Any]) -> list[BaseMessage]:
    """A ``DeltaChannel`` reducer: ``add_messages`` over each write in turn, except that a
    ``RemoveMessage`` of an id not there (any more) is skipped, as the reducers a
    ``DeltaChannel`` of messages is used with skip it (deepagents', LangGraph's
    ``_messages_delta_reducer``); ``add_messages`` would raise, and the thread the graph
    reads fine could not be read here."""
    for write in writes:
        present = {m.id for m in state}
        batch = []
        for m in convert_to_messages(write if isinstance(write, list) else [write]):
            if isinstance(m, RemoveMessage):
                if m.id == REMOVE_ALL_MESSAGES:
                    present = set()
                elif m.id not in present:
                    continue
                present.discard(m.id)
            else:
                present.add(m.id)
            batch.append(m)
        state = add_messages(state, batch)
    return state


def read_messages(saver: BaseCheckpointSaver, session_id: str) -> list[BaseMessage]:
    """The thread's messages, read straight from its latest checkpoint (one read, no graph)."""
    return read_thread(saver, session_id).messages


def read_caught_up(
    saver: BaseCheckpointSaver,
    session_id: str,
    seen: str | None,
    wait_s: float,
    ns: str | None = None,
    head: str | None = None,
) -> Thread:
    """The thread once its checkpoint holds message ``seen`` (the newest one when the job was
    queued) and, when ``head`` is given, starts with that message (:func:`head_mark`: the
    summary of an apply made in the run), re-read every 0.1 s (backing off to 0.5 s) for up
    to ``wait_s`` seconds; after
    that, what the checkpoint holds (logged). A run's checkpoints are written in the background (LangGraph's
    default durability), so a job queued from inside a run can find them steps behind:
    planning on them wastes a summary (found stale) or skips a thread that is over."""
    deadline = time.monotonic() + wait_s
    pause = 0.1
    while True:
        thread = read_thread(saver, session_id, ns)
        held = not seen or any(m.id == seen for m in reversed(thread.messages))
        if held and (not head or head_mark(thread.messages) == head):
            return thread
        if time.monotonic() >= deadline:
            log.info(
                "[%s] checkpoint still without message %s (head %s; it holds %s, %s) after "
                "%.1f s: planning on what it holds",
                tag(session_id),
                seen,
                head,
                "it" if held else "not it",
                head_mark(thread.messages),
                wait_s,
            )
            return thread
        time.sleep(pause)
        pause = min(0.5, pause * 1.5)


def apply_locked(
    rt: Runtime,
    session_id: str,
    job_id: str,
    result: Mapping[str, Any],
    current: Sequence[BaseMessage],
    base: CheckpointTuple | None = None,
    *,
    force: bool = False,
) -> Fitted | Stale | None:
    """Apply the job's prepared compaction (``result["prepared"]``) to offpath's own thread,
    whose messages are ``current``; the caller holds the thread's lock. ``base``: the
    checkpoint ``current`` was read from, known to be the latest (the patch starts from it).
    The compaction must leave the thread under its prepare floor (kept tool results are
    shortened to get there; DESIGN.md invariant 13), unless an operator asked for it
    (``force``: "compact now").

    Returns the fitted compaction (applied and recorded), None if it had landed already
    (now recorded), or :class:`Stale`. Raises :class:`JobEnded` if the patch would
    orphan a tool call, or if the database refuses a value of the thread the archive would
    keep (its reason names the message and the field).
    """
    if landed(current, job_id, result.get("record")):
        finalize(rt.engine, job_id, session_id)
        return None
    target = None if force else landing_chars(rt.settings)
    fitted = fit(
        Prepared.from_json(result["prepared"]), current, target=target, settings=rt.settings
    )
    if isinstance(fitted, Stale):
        return fitted
    if broken := new_unpaired(current, add_messages(current, fitted.patch)):
        raise JobEnded(
            JobStatus.FAILED, "orphan_guard", f"patch would orphan tool calls {sorted(broken)}"
        )
    # offpath's own record of what it patches in, and the originals it removes (the
    # archive), written together before the patch: a patch never lands unarchived
    rows = archive.rows_for(
        session_id, job_id, str(fitted.summary.id), current, fitted.removed, fitted.shortened
    )
    record = with_loss(fitted, current)
    try:
        archive.store_record(rt.engine, job_id, {**result, "record": record}, rows)
    except Unstorable as exc:  # a value the thread holds that the database refused: named
        raise JobEnded(JobStatus.FAILED, UNSTORABLE, f"not archived: {exc}") from exc
    failpoint("after_archive")
    rt.patch(session_id, {"messages": fitted.patch}, base)
    failpoint("after_patch")
    finalize(rt.engine, job_id, session_id, {**result, "record": record})
    after = add_messages(current, fitted.patch)
    note_size(rt.engine, session_id, len(after), total_chars(after))  # the session list's
    return fitted


def with_loss(
    fitted: Fitted,
    current: Sequence[BaseMessage],
    ground_truth: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``fitted.record`` with its loss report under ``"loss"`` (issue 19): what the compaction
    takes out of the model's view of the thread ``current`` (the messages it was fitted to),
    and the facts of it that neither its summary nor the kept messages hold
    (:func:`offpath.compaction.loss.loss_report`; ``ground_truth``: fact strings chosen
    independently of the fact guard, which only benchmarks have). Both apply paths store it
    with the job's record: :func:`apply_locked` and the middleware. The report costs one
    fact extraction over what is removed (about 16 ms for a 40,000-char removed part);
    if it fails, the record says so (``"loss": {"error": ...}``) and the compaction goes on."""
    try:
        after = add_messages(list(current), fitted.patch)
        removed, cut = set(fitted.removed), set(fitted.shortened)
        now = {m.id: m for m in after}
        report = loss_report(
            [m for m in current if m.id in removed],
            content_text(fitted.summary.content),
            [m for m in after if m.id != fitted.summary.id],
            shortened=[(m, now[m.id]) for m in current if m.id in cut and m.id in now],
            ground_truth=ground_truth,
        )
        loss: dict[str, Any] = report.to_json()
    except Exception as exc:  # the report is a record of the compaction, never its condition
        log.warning("loss report of a compaction not made: %s", exc)
        loss = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    return {**fitted.record, "loss": loss}


def apply_prepared(rt: Runtime, session_id: str, job_id: str) -> str:
    """Apply job ``job_id``'s prepared compaction to offpath's own thread now (the post-turn
    hook, after the turn that pushed the thread over its threshold). Takes the thread's
    lock; hands the claim on. Returns what happened: ``applied``, ``stale``, ``gone``
    (nothing prepared any more) or ``failed``."""
    with rt.locks.patch(session_id):
        row = job_row(rt.engine, job_id)
        if row is None or row["status"] != JobStatus.PREPARED or not row["result"]:
            return "gone"
        thread = read_thread(rt.checkpoints.saver, session_id)
        try:
            fitted = apply_locked(
                rt, session_id, job_id, row["result"], thread.messages, thread.base
            )
        except JobEnded as exc:
            set_job(rt.engine, job_id, session_id, exc.status, exc.reason, exc.code)
            rt.leases.settle(session_id, job_id, None)
            return "failed"
    if isinstance(fitted, Stale):
        end_stale(rt.engine, rt.leases, session_id, job_id, fitted)
        return "stale"
    rt.leases.settle(session_id, job_id, Leases.after(job_id, State.DONE))
    if fitted is not None:
        log.info(
            "[%s] compaction applied: job %s, -%d chars",
            tag(session_id),
            job_id,
            fitted.record["chars_removed"],
        )
    return "applied"


def end_stale(engine: Any, leases: Leases, session_id: str, job_id: str, stale: Stale) -> None:
    """A prepared compaction that no longer fits: the job ends ``skipped: stale``, the thread
    is free for a new job."""
    log.info(
        "[%s] prepared compaction of job %s dropped: %s", tag(session_id), job_id, stale.reason
    )
    set_job(engine, job_id, session_id, JobStatus.SKIPPED, f"stale: {stale.reason}", "stale")
    leases.settle(session_id, job_id, None)
