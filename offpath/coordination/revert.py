"""Reverting a compaction of one of offpath's own threads (DESIGN.md invariant 16):
``POST /sessions/{id}/compactions/{job}/revert``, ``offpath revert``.

The last compaction still in the thread is undone from the archive: its removed messages go
back where its summary is, in their order, byte for byte as archived; the kept tool results
it shortened are restored; a request copy it added goes; later messages stay as they are
(:func:`offpath.compaction.revert.reverted`, pure). ``add_messages`` cannot insert a message
between others, so the whole list is written, after ``RemoveMessage(REMOVE_ALL_MESSAGES)``,
in one update under the thread's lock, as the graph's last node (like every write offpath
makes to its own threads).

Then the job ends ``reverted`` (reason code ``reverted``), and the thread's claim is left
``s:<job>:<chars>`` at its size now: neither the post-turn hook, nor a run's middleware, nor
the reconciler queues a compaction of it before it has grown by a compaction's worth (the
no-progress rule; :mod:`offpath.stores.leases`). A compaction prepared meanwhile was planned
on the summary that goes: it ends ``skipped`` (``superseded``).

Refused (:class:`RevertRefused`, the API's 409) when: the job is not ``applied``; its summary
is no longer in the thread (a later compaction folded it in: revert that one first, or it is
gone for good); a later compaction is in the thread; a turn, a run or a job (queued or
running) holds the thread; the thread is a team's own agent's (offpath never writes its
checkpoint: its middleware would have to, and it has no undo); or the thread no longer fits
the archive. :class:`NoSuchJob` (404): no such job on this session.

``/stats``: a reverted compaction still counts in ``total_summarizations`` and in the
summarizer's latency and tokens (the summarizer ran; its usage event stays), and no longer in
``total_chars_compacted``, ``approx_tokens_saved`` or ``sessions_compacted`` (nothing it
removed is removed now); ``jobs.reverted`` counts reverted jobs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage, RemoveMessage, messages_to_dict
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from offpath.compaction.patch import landed
from offpath.compaction.revert import RevertConflict, reverted
from offpath.compaction.summary import is_summary, summary_meta
from offpath.compaction.tracking import KEY as SIZE_KEY  # the state key of the thread's size
from offpath.compaction.tracking import ThreadSize
from offpath.coordination.faults import failpoint
from offpath.coordination.jobs import JobOptions
from offpath.coordination.logs import tag
from offpath.coordination.runtime import Runtime
from offpath.coordination.undo import finish_undo
from offpath.stores import archive
from offpath.stores.checkpoints import read_thread
from offpath.stores.db.job_queries import job_row, jobs_of
from offpath.stores.db.tables import JobStatus
from offpath.stores.leases.claims import Claim

log = logging.getLogger("offpath.revert")


class RevertRefused(Exception):
    """The compaction cannot be reverted now; the message says why (the API's 409)."""


class NoSuchJob(LookupError):
    """No job with this id on this session (the API's 404)."""


@dataclass(frozen=True, slots=True)
class Reverted:
    """What a revert did: the job, how many messages and shortened results it put back, and the
    thread's size now (messages, chars)."""

    job_id: str
    messages_restored: int
    results_restored: int
    messages: int
    chars: int


def revert(rt: Runtime, session_id: str, job_id: str) -> Reverted:
    """Revert compaction job ``job_id`` of offpath's own thread ``session_id`` (see the module
    doc). Raises :class:`NoSuchJob`, :class:`RevertRefused`, or ``ThreadBusy`` (a turn or a
    run holds the thread's lock); a store's error leaves the thread and the job as they were.
    """
    row = job_row(rt.engine, job_id)
    if row is None or row["session_id"] != session_id:
        raise NoSuchJob(f"no compaction job {job_id!r} on session {session_id!r}")
    options = JobOptions.from_json(row["options"])
    if not options.patch or options.checkpoints or options.checkpoint_ns:
        raise RevertRefused(
            f"job {job_id} compacted a thread of a team's own agent, whose checkpoint offpath "
            "never writes (its middleware applied the compaction inside a run): it cannot be "
            "reverted from here; its originals are in the archive (GET /sessions/{id}/archive)"
        )
    with rt.locks.turn(session_id):
        finish_undo(rt, session_id)  # a failed run's messages go before the originals return
        return _revert_locked(rt, session_id, job_id)


def _revert_locked(rt: Runtime, session_id: str, job_id: str) -> Reverted:
    row = job_row(rt.engine, job_id)
    assert row is not None
    if row["status"] != JobStatus.APPLIED:
        what = "was reverted already" if row["status"] == JobStatus.REVERTED else row["status"]
        raise RevertRefused(f"job {job_id} {what}: only an applied compaction can be reverted")
    holder = rt.leases.holder(session_id)
    if holder is not None and holder.in_flight:
        raise RevertRefused(
            f"job {holder.job_id} is {holder.state.name.lower()} on this session: revert once "
            "it ended"
        )
    thread = read_thread(rt.checkpoints.saver, session_id)
    messages = thread.messages
    record = (row["result"] or {}).get("record") or {}
    rows = archive.job_rows(rt.engine, session_id, job_id)
    removed, shortened = archive.originals_of(rows)
    if not landed(messages, job_id, record) and _put_back(
        messages, rows, str(record.get("summary_id"))
    ):
        size = ThreadSize().advance(messages)
        return _record(rt, session_id, job_id, len(removed), len(shortened), messages, size.chars)
    if not landed(messages, job_id, record):
        head = next((m for m in messages if is_summary(m)), None)
        later = summary_meta(head).get("job_id") if head is not None else None
        raise RevertRefused(
            f"the summary of job {job_id} is no longer in the thread"
            + (
                f": a later compaction (job {later}) folded it in; revert that one first"
                if later
                else ""
            )
        )
    for other in jobs_of(rt.engine, session_id):
        mine = other["job_id"] == job_id
        other_record = (other["result"] or {}).get("record")
        if (
            not mine
            and other["status"] == JobStatus.APPLIED
            and other["created_at"] > row["created_at"]
        ):
            if landed(messages, other["job_id"], other_record):
                raise RevertRefused(
                    f"job {other['job_id']} compacted the thread after job {job_id}: only the "
                    "latest compaction can be reverted"
                )
    try:
        restored = reverted(
            messages,
            str(record["summary_id"]),
            removed,
            shortened,
            request_copy=record.get("request_copy"),
        )
    except RevertConflict as exc:
        raise RevertRefused(
            f"the thread no longer fits what job {job_id} archived: {exc}"
        ) from None
    values = thread.base.checkpoint.get("channel_values", {}) if thread.base else {}
    private = dict(values.get(SIZE_KEY) or {})
    size = ThreadSize().advance(restored)
    # the claim first: from here no hook, run or reconciler queues a job for this thread
    # before it grew by a compaction's worth; put back if the write fails
    then = rt.jobs.claim_after(session_id, job_id, JobStatus.REVERTED, size.chars)
    if not rt.jobs.hold_for_revert(session_id, holder, then):
        raise RevertRefused("a compaction job took the thread meanwhile: try again")
    try:
        rt.patch(
            session_id,
            {
                "messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *restored],
                SIZE_KEY: {**private, "size": size.to_state()},
            },
            thread.base,
        )
    except BaseException:
        rt.jobs.release_revert(session_id, then, holder)
        raise
    failpoint("after_revert_patch")
    done = _record(
        rt, session_id, job_id, len(removed), len(shortened), restored, size.chars, holder
    )
    log.info(
        "[%s] compaction of job %s reverted: %d messages and %d results restored, %d chars",
        tag(session_id),
        job_id,
        done.messages_restored,
        done.results_restored,
        done.chars,
    )
    return done


def _record(
    rt: Runtime,
    session_id: str,
    job_id: str,
    removed: int,
    shortened: int,
    thread: list[BaseMessage],
    chars: int,
    holder: Claim | None = None,
) -> Reverted:
    """Mark the job ``reverted`` (the thread holds its originals again; a compaction prepared on
    its summary, ``holder``, ends superseded) and note the size."""
    reason = (
        f"reverted: {removed} removed message{'' if removed == 1 else 's'} and {shortened} "
        f"shortened result{'' if shortened == 1 else 's'} put back from the archive"
    )
    rt.jobs.reverted(session_id, job_id, reason, holder)
    _note_size(rt, session_id, thread, chars)
    return Reverted(job_id, removed, shortened, len(thread), chars)


def _put_back(messages: list[BaseMessage], rows: list[dict[str, Any]], summary_id: str) -> bool:
    """The thread holds, under the summary's id, the original it replaced (as archived): a
    revert whose write landed but whose job row was not marked (the process died between)."""
    first = next(
        (r for r in rows if r["kind"] == archive.REMOVED and r["message_id"] == summary_id), None
    )
    now = next((m for m in messages if str(m.id) == summary_id), None)
    return first is not None and now is not None and messages_to_dict([now])[0] == first["message"]


def _note_size(rt: Runtime, session_id: str, messages: list[BaseMessage], chars: int) -> None:
    """The session list's size of the thread (best effort, as after every write)."""
    from offpath.stores.tenants import note_size

    try:
        note_size(rt.engine, session_id, len(messages), chars)
    except Exception as exc:
        log.warning("[%s] could not note the thread's size: %s", tag(session_id), exc)


__all__ = ["NoSuchJob", "RevertRefused", "Reverted", "revert"]
