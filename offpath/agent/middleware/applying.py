"""Applying a compaction the worker prepared in the run (:class:`Applying`), through the client's
:class:`~offpath.coordination.jobs.Jobs` and a
:class:`~offpath.coordination.writers.StateUpdateWriter`: fitted to the thread, its record and
the originals it removes archived while the model answers (or the call's update kept as it
was if that fails), its loss report made after the swap, and recorded once in the state."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import Any

from langchain_core.messages import BaseMessage

from offpath.agent.middleware.claims import Claims
from offpath.agent.middleware.counting import ThreadSettings, ThreadTokens
from offpath.agent.middleware.pools import Background
from offpath.agent.middleware.reports import Reports, log
from offpath.agent.middleware.state import Call, Write
from offpath.compaction.patch import Fitted, Stale, landed, patched
from offpath.compaction.revert import RevertConflict, reverted
from offpath.compaction.shorten import originals_of
from offpath.compaction.summary import is_summary, summary_meta
from offpath.compaction.tracking import KEY, MessageSizes, SizedThreads
from offpath.compaction.turns import OWN_MARKS
from offpath.coordination.jobs import JobEnded, Landed
from offpath.coordination.logs import tag
from offpath.coordination.outages import USAGE_DB
from offpath.coordination.runtime import Client
from offpath.coordination.writers import StateUpdate, StateUpdateWriter
from offpath.stores import archive
from offpath.stores.db.job_queries import job_row
from offpath.stores.db.tables import JobStatus
from offpath.stores.leases.claims import Claim, State

#: Most compactions :meth:`Applying.whole` undoes in one thread (each its own archive read).
WHOLE_MAX_UNDONE = 1_000
#: The longest (s) a model call's answer waits, once the model has answered, for the archive
#: writes of that call's shortenings and apply (they overlap the model call; the state update
#: that shortens or compacts the thread is returned only once its originals are archived).
ARCHIVE_WAIT_S = 30.0


class Applying:
    """The in-run apply of a prepared compaction: the archive writes a call's update waits
    for, storing and recording the compaction, its loss report.

    Requires: the settings in force, the client (opened on first use: its
    :class:`~offpath.coordination.jobs.Jobs` applies), the background threads, the reports,
    the claims (forgotten once a call applied or dropped a job), the threads' sizes and
    tokens (sized anew once a call applied), and ``recall``. Provides: :meth:`apply`,
    :meth:`apply_now`, :meth:`apply_sized`, :meth:`store`, :meth:`settle`, :meth:`record`."""

    def __init__(
        self,
        settings: ThreadSettings,
        client: Callable[[], Client],
        background: Background,
        reports: Reports,
        claims: Claims,
        sizes: SizedThreads,
        tokens: ThreadTokens,
        *,
        recall: bool,
    ) -> None:
        self.settings = settings
        self.client = client
        self.background = background
        self.reports = reports
        self.claims = claims
        self.sizes = sizes
        self.tokens = tokens
        self.recall = recall
        self._guard = threading.Lock()
        self._storing: set[str] = set()  # jobs whose archive write is in flight

    def apply_sized(
        self,
        session_id: str,
        holder: Claim,
        messages: list[BaseMessage],
        private: dict[str, Any],
        chars: int,
        out: int,
        writes: list[Write],
        sizes: MessageSizes,
    ) -> tuple[list[BaseMessage], int, bool]:
        """:meth:`apply_now`, and the thread sized and counted anew if it applied:
        ``(messages, chars, applied)``."""
        after, chars = self.apply_now(session_id, holder, messages, private, chars, out, writes)
        if after is messages:
            return messages, chars, False
        self.tokens.forget(session_id)
        sizes.clear()
        sizes.sync(after)
        return after, chars, True

    def apply_now(
        self,
        session_id: str,
        holder: Claim,
        messages: list[BaseMessage],
        private: dict[str, Any],
        chars: int,
        out: int = 0,
        writes: list[Write] | None = None,
    ) -> tuple[list[BaseMessage], int]:
        """Apply the prepared compaction of ``holder`` to this call's ``messages`` (``out``:
        chars the call sends besides them): the messages and their size after it (unchanged
        if it did not apply). ``writes``: see :meth:`_apply`."""
        applied = self.apply(session_id, holder.job_id, messages, out, writes)
        if applied is None:  # the claim as :meth:`apply` left it
            return messages, chars
        self.claims.forget(session_id)
        fitted, pending = applied
        private["pending"] = pending
        private["removed"] = True
        private["crossed"] = False  # a new crossing may queue a job again
        return patched(messages, fitted.patch), int(fitted.record["chars_after"])

    def store(self, writes: list[Write]) -> Future[Any]:
        """Start a call's archive writes on the archive threads, one after another in the
        order they were made (a result shortened on arrival and again in the same call: the
        first write archives the original, the later one finds it there), while the model
        answers. A job with a write in flight is not applied again until it ends."""
        jobs = {job for job, _ in writes if job}
        with self._guard:
            self._storing |= jobs

        def run() -> None:
            try:
                for _, write in writes:
                    write()
            finally:
                with self._guard:
                    self._storing -= jobs

        return self.background.archive(run)

    def settle(self, call: Call) -> None:
        """Wait (at most :data:`ARCHIVE_WAIT_S`) for the archive writes the call started; if
        they failed, the state update keeps the thread as it was: the model saw it shortened
        or compacted for this call only, nothing is lost (invariant 12: removed is archived),
        the size the state had before the call is kept (the call's new messages are looked at
        again at the next one), and a compaction applied in the call is not recorded (its job
        stays prepared, applied at a later call)."""
        if call.stored is None or call.session_id is None:
            return
        try:
            call.stored.result(timeout=ARCHIVE_WAIT_S)
            return
        except Exception as exc:  # the write failed, or is still running after the wait
            failed = exc
        private = call.update[KEY]
        pending = private.get("pending")
        self.reports.trouble(
            USAGE_DB,
            failed,
            f"[{tag(call.session_id)}] could not archive what this call shortened or removed: "
            f"{failed or 'timed out'}; the thread keeps its messages as they were",
            "what model calls shorten or remove is not archived, so threads keep it whole",
        )
        call.update.pop("messages", None)
        private.update(size=call.size_before, pending=None, removed=False)
        self.sizes.forget(call.session_id)  # sized and counted as the call left them
        self.tokens.forget(call.session_id)
        if pending:
            job_id = pending["job_id"]
            reason = f"not applied in this call (its archive write: {failed or 'timed out'})"
            self.reports.tell(call.session_id, job_id, "cancelled", reason=reason)

    def apply(
        self,
        session_id: str,
        job_id: str,
        messages: list[BaseMessage],
        out: int = 0,
        writes: list[Write] | None = None,
    ) -> tuple[Fitted, dict[str, Any]] | None:
        """The fitted compaction of job ``job_id`` (its patch lands the thread under its
        prepare floor) and what to record once it is in the state; None if there is nothing
        to apply. Applied by the client's :class:`~offpath.coordination.jobs.Jobs` through a
        :class:`~offpath.coordination.writers.StateUpdateWriter`: its record and the originals
        it removes are stored (invariant 12) first, or, given ``writes``, while the model
        answers (see :meth:`~offpath.agent.middleware.shaping.Shaping.shorten`); its loss
        report after that, on the writer thread
        (:data:`~offpath.coordination.writers.LOSS_PENDING` until then).

        When it returns None, the thread's claim is known free if the job handed it on
        (found stale, ended, or recorded as landed: :meth:`Claims.freed`), so that the same
        call queues the next job, not a later one once a background read tells it (a thread
        over its threshold then waits one summary, not a call more); else it is forgotten
        (read again in the background)."""
        client = self.client()
        with self._guard:
            if job_id in self._storing:  # an earlier call's write of it is still running
                self.claims.forget(session_id)
                return None
        try:
            row = job_row(client.engine, job_id)
            if row is None or row["status"] != JobStatus.PREPARED or not row["result"]:
                self.claims.forget(session_id)
                return None
            writer = StateUpdateWriter(
                writes, self.background.write, partial(self.reports.trouble, USAGE_DB)
            )
            done = client.jobs.apply(
                writer,
                session_id,
                job_id,
                row["result"],
                messages,
                # compact now: no bound, as for offpath's own threads
                force=bool((row.get("options") or {}).get("force")),
                outside=out,
                settings=self.settings.current,
                recall=self.recall,
            )
        except Exception as exc:  # the run goes on uncompacted; the reconciler tidies up
            self.reports.trouble(
                USAGE_DB, exc, f"[{tag(session_id)}] could not apply job {job_id}: {exc}"
            )
            self.reports.tell(session_id, job_id, "failed", reason=f"not applied: {exc}")
            self.claims.forget(session_id)
            return None
        if not isinstance(done, StateUpdate):  # the job handed the thread on
            self.claims.freed(session_id)
        if isinstance(done, Landed):  # a crashed run had applied it: recorded now
            record = done.record
            chars = record.get("chars_before"), record.get("chars_after")
            self.reports.tell(session_id, job_id, "completed", *chars)
            return None
        if isinstance(done, Stale):
            self.reports.tell(session_id, job_id, "cancelled", reason=f"stale: {done.reason}")
            return None
        if isinstance(done, JobEnded):
            self.reports.tell(session_id, job_id, "failed", reason=done.reason)
            return None
        fitted = done.fitted
        log.info(
            "[%s] applying job %s in the run: %d -> %d chars",
            tag(session_id),
            job_id,
            fitted.record["chars_before"],
            fitted.record["chars_after"],
        )
        return fitted, done.pending

    def record(self, session_id: str, pending: dict[str, Any], messages: list[BaseMessage]) -> None:
        """Record a compaction this run applied, once its summary is in the state (exactly
        once: the usage event is unique by job id)."""
        job_id, record = pending["job_id"], pending["record"]
        if not landed(messages, job_id, record):
            log.warning(
                "[%s] the update of job %s did not land; not recorded", tag(session_id), job_id
            )
            return
        try:
            self.client().jobs.record(session_id, job_id, holding=State.PREPARED)
        except Exception as exc:  # a later job or the reconciler records it
            self.reports.trouble(
                USAGE_DB, exc, f"[{tag(session_id)}] could not record job {job_id}: {exc}"
            )
        self.reports.tell(
            session_id,
            job_id,
            "completed",
            record.get("chars_before"),
            record.get("chars_after"),
        )

    def whole(self, session_id: str, messages: list[BaseMessage]) -> list[BaseMessage] | None:
        """The thread ``messages`` with every compaction of session ``session_id`` in it
        undone from the archive (:func:`~offpath.compaction.revert.reverted`, the newest
        summary first, until none is left but one the run was given: a summary of no job of
        this session, its caller's) and every result it shortened in place put back as archived:
        the messages as they would be had offpath never compacted the run. A fanned run (a
        ``Send`` fan-out) hands its caller these. None, logged, when the archive cannot give
        them (a row missing, the database down): the caller then receives the thread as it
        is."""
        try:
            engine = self.client().engine
            out = list(messages)
            for _ in range(WHOLE_MAX_UNDONE):
                summary = next((m for m in out if is_summary(m)), None)
                if summary is None:
                    break
                job_id = str(summary_meta(summary).get("job_id") or "")
                row = job_row(engine, job_id) if job_id else None
                if row is None or row["session_id"] != session_id:
                    break  # the run was given it (its caller's summary): not the run's to undo
                record = (row["result"] or {}).get("record") or {}
                removed, shortened = archive.originals_of(
                    archive.job_rows(engine, session_id, job_id)
                )
                out = reverted(
                    out,
                    str(record.get("summary_id") or summary.id),
                    removed,
                    shortened,
                    request_copy=record.get("request_copy"),
                )
            else:
                raise RevertConflict(f"more than {WHOLE_MAX_UNDONE} compactions to undo")
            firsts = originals_of(out, partial(archive.originals, engine, session_id))
            # one not archived: the run was given it shortened
            return [firsts.get(str(m.id), m) for m in out]
        except Exception as exc:  # the caller gets the thread as it is
            self.reports.trouble(
                USAGE_DB,
                exc,
                f"[{tag(session_id)}] could not put the run's originals back: {exc}",
            )
            return None


def made_by_offpath(message: BaseMessage) -> bool:
    """A version offpath wrote in a thread: a summary, a request's copy, a result shortened in
    place (its original archived)."""
    return is_summary(message) or any(k in message.additional_kwargs for k in OWN_MARKS)
