"""The two ways a fitted compaction is written (:class:`~offpath.coordination.jobs.Writer`), as
LangGraph puts its backends behind one ``BaseCheckpointSaver``:

* :class:`CheckpointWriter` patches the checkpoint of offpath's own thread, under the thread's
  lock: the worker, when no run holds the thread, and the post-turn hook
  (:func:`apply_prepared`). Its record, loss report included, and the originals it removes
  are archived first, then the patch is written and the usage event recorded.
* :class:`StateUpdateWriter` returns the patch as a :class:`StateUpdate` of the run that holds
  the thread (the middleware, at a model call; the only way for a user's own agent, whose
  checkpoint offpath never writes). Its record and originals are archived before the update
  is returned (or while the model answers, and the update waits for them); its loss report is
  made after; the usage event is recorded once the summary is in the run's state
  (:meth:`~offpath.coordination.jobs.Jobs.record`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.base import CheckpointTuple

from offpath.compaction.accounting import content_text, total_chars
from offpath.compaction.loss import loss_report
from offpath.compaction.patch import Fitted, Stale, patched
from offpath.coordination.faults import failpoint
from offpath.coordination.jobs import UNSTORABLE, Applying, JobEnded, JobOptions, Jobs
from offpath.coordination.logs import tag
from offpath.stores.checkpoints import read_thread
from offpath.stores.db.job_queries import job_row
from offpath.stores.db.tables import JobStatus
from offpath.stores.values import Unstorable

if TYPE_CHECKING:
    from offpath.coordination.runtime import Runtime

log = logging.getLogger("offpath.compactions")

#: The loss report of a compaction applied in a run, until it is made: it is made after the
#: swap, on the writer thread (the removed part's facts: tens of ms of CPU that the model
#: call no longer waits for), and replaces this in the job's stored record.
LOSS_PENDING = {
    "error": "made after the swap, off the model call's path: not there yet, or the agent's "
    "process ended before it was made"
}


def with_loss(
    fitted: Fitted,
    current: Sequence[BaseMessage],
    ground_truth: Sequence[str] | None = None,
    after: Sequence[BaseMessage] | None = None,
) -> dict[str, Any]:
    """``fitted.record`` with its loss report under ``"loss"``: what the compaction takes out of
    the model's view of the thread ``current`` (the messages it was fitted to), and the facts
    of it that neither its summary nor the kept messages hold
    (:func:`offpath.compaction.loss.loss_report`; ``ground_truth``: fact strings chosen
    independently of the fact guard, which only benchmarks have; ``after``: ``current`` with
    the patch applied, if the caller made it already). Both writers store it with
    the job's record. The report costs one fact extraction over what is removed (about 16 ms
    for a 40,000-char removed part); if it fails, the record says so
    (``"loss": {"error": ...}``) and the compaction goes on."""
    try:
        if after is None:
            after = patched(current, fitted.patch)
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


class CheckpointWriter:
    """Patches offpath's own thread through ``rt``'s graph, from checkpoint ``base`` (the one
    the messages were read from, known to be the latest: the caller holds the thread's
    lock)."""

    def __init__(self, rt: Runtime, base: CheckpointTuple | None) -> None:
        self.rt = rt
        self.base = base

    def write(self, jobs: Jobs, applying: Applying) -> Fitted:
        """Archive (the record with its loss report; a value the database refuses ends the
        job, named), patch, record; returns the fitted compaction."""
        a = applying
        after = a.patched_messages
        record = with_loss(a.fitted, a.messages, after=after)
        try:
            jobs.archive(a, record)
        except Unstorable as exc:  # a value the thread holds that the database refused: named
            raise JobEnded(JobStatus.FAILED, UNSTORABLE, f"not archived: {exc}") from exc
        failpoint("after_archive")
        self.rt.patch(a.session_id, {"messages": a.fitted.patch}, self.base)
        failpoint("after_patch")
        size = (len(after), total_chars(after))  # the session list's, written with the record
        jobs.record(a.session_id, a.job_id, {**a.result, "record": record}, holding=a.holding,
                    size=size)  # fmt: skip
        return a.fitted


@dataclass(frozen=True, slots=True)
class StateUpdate:
    """A compaction to apply as the run's own state update: ``fitted.patch`` to its
    ``messages``, and ``pending`` (``{"job_id", "record"}``) to record once it is in."""

    fitted: Fitted
    pending: dict[str, Any]


#: An archive write a model call's update waits for: ``(job_id, write)`` (no job: a
#: shortening's).
Write = tuple[str | None, Callable[[], None]]


class StateUpdateWriter:
    """Returns the patch as a :class:`StateUpdate`. ``writes``: where the archive write goes
    to run while the model answers (None: it runs now, before the update is returned).
    ``later(fn, *args)``: runs the loss report off the model call's path (None: now);
    ``trouble(exc, line)``: says a loss report that could not be stored (None: logged)."""

    def __init__(
        self,
        writes: list[Write] | None = None,
        later: Callable[..., None] | None = None,
        trouble: Callable[[Exception, str], None] | None = None,
    ) -> None:
        self.writes = writes
        self.later = later
        self.trouble = trouble

    def write(self, jobs: Jobs, applying: Applying) -> StateUpdate:
        a = applying

        def store() -> None:
            jobs.archive(a, {**a.fitted.record, "loss": LOSS_PENDING})
            if self.later is None:
                self._report(jobs, a)
            else:
                self.later(self._report, jobs, a)

        if self.writes is None:
            store()
        else:
            self.writes.append((a.job_id, store))
        return StateUpdate(a.fitted, {"job_id": a.job_id, "record": a.fitted.record})

    def _report(self, jobs: Jobs, a: Applying) -> None:
        """Make the loss report (:func:`with_loss`, which never raises) and store it."""
        loss = with_loss(a.fitted, a.messages, after=a.patched_messages)["loss"]
        try:
            jobs.report_loss(a.job_id, str(a.fitted.summary.id), loss)
        except Exception as exc:  # the record keeps LOSS_PENDING, which says so
            line = f"[{tag(a.session_id)}] could not store the loss report of job {a.job_id}: {exc}"
            if self.trouble is None:
                log.warning("%s", line)
            else:
                self.trouble(exc, line)


def apply_prepared(rt: Runtime, session_id: str, job_id: str) -> str:
    """Apply job ``job_id``'s prepared compaction to offpath's own thread now (the post-turn
    hook, after the turn that pushed the thread over its threshold; an operator's compact
    now). Takes the thread's lock; hands the claim on. Returns what happened: ``applied``,
    ``stale``, ``gone`` (nothing prepared any more) or ``failed``."""
    with rt.locks.patch(session_id):
        row = job_row(rt.engine, job_id)
        if row is None or row["status"] != JobStatus.PREPARED or not row["result"]:
            return "gone"
        thread = read_thread(rt.checkpoints.saver, session_id)
        options = JobOptions.from_json(row["options"])
        done = rt.jobs.apply(
            CheckpointWriter(rt, thread.base),
            session_id,
            job_id,
            row["result"],
            thread.messages,
            force=options.force,
            outside=options.outside,
            settings=rt.settings,
        )
    if isinstance(done, JobEnded):
        return "failed"
    if isinstance(done, Stale):
        return "stale"
    if isinstance(done, Fitted):
        log.info(
            "[%s] compaction applied: job %s, -%d chars",
            tag(session_id),
            job_id,
            done.record["chars_removed"],
        )
    return "applied"
