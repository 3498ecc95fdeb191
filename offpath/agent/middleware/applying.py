"""Applying a compaction the worker prepared in the run: fitted to the thread, its record and
the originals it removes archived while the model answers (or the call's update kept as it
was if that fails), its loss report made after the swap, and recorded once in the state."""

from __future__ import annotations

from concurrent.futures import Future
from functools import partial
from typing import Any

from langchain_core.messages import BaseMessage
from langgraph.graph.message import add_messages

from offpath.agent.middleware.helpers import log
from offpath.agent.middleware.state import _Call, _Write
from offpath.compaction.pairing import new_unpaired
from offpath.compaction.patch import Fitted, Prepared, Stale, fit, landed
from offpath.compaction.planner import landing_chars
from offpath.compaction.tracking import KEY
from offpath.coordination.compactions import end_stale, with_loss
from offpath.coordination.logs import tag
from offpath.coordination.outages import USAGE_DB
from offpath.stores import archive
from offpath.stores.db import JobStatus, finalize, job_row, set_job
from offpath.stores.leases import Claim, Leases, State

#: The longest (s) a model call's answer waits, once the model has answered, for the archive
#: writes of that call's shortenings and apply (they overlap the model call; the state update
#: that shortens or compacts the thread is returned only once its originals are archived).
ARCHIVE_WAIT_S = 30.0
#: The loss report of a compaction applied in a run, until it is made: it is made after the
#: swap, on the writer thread (the removed part's facts: tens of ms of CPU that the model
#: call no longer waits for), and replaces this in the job's stored record.
LOSS_PENDING = {
    "error": "made after the swap, off the model call's path: not there yet, or the agent's "
    "process ended before it was made"
}


class ApplyingMixin:
    """:class:`~offpath.agent.middleware.OffPathCompaction`'s in-run apply of a prepared
    compaction: the archive writes a call's update waits for, storing and recording the
    compaction, its loss report. Its methods use the attributes set in
    ``OffPathCompaction.__init__``."""

    def _apply_now(
        self,
        session_id: str,
        holder: Claim,
        messages: list[BaseMessage],
        private: dict[str, Any],
        chars: int,
        out: int = 0,
        writes: list[_Write] | None = None,
    ) -> tuple[list[BaseMessage], int]:
        """Apply the prepared compaction of ``holder`` to this call's ``messages`` (``out``:
        chars the call sends besides them): the messages and their size after it (unchanged
        if it did not apply). ``writes``: see :meth:`_apply`."""
        applied = self._apply(session_id, holder.job_id, messages, out, writes)
        self._forget_claim(session_id)
        if applied is None:
            return messages, chars
        fitted, pending = applied
        private["pending"] = pending
        private["removed"] = True
        private["crossed"] = False  # a new crossing may queue a job again
        return add_messages(messages, fitted.patch), int(fitted.record["chars_after"])

    def _store(self, writes: list[_Write]) -> Future[Any]:
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

        return self._archive(run)

    def _settle(self, call: _Call) -> None:
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
        self._trouble(
            USAGE_DB,
            failed,
            f"[{tag(call.session_id)}] could not archive what this call shortened or removed: "
            f"{failed or 'timed out'}; the thread keeps its messages as they were",
            "what model calls shorten or remove is not archived, so threads keep it whole",
        )
        call.update.pop("messages", None)
        private.update(size=call.size_before, pending=None, removed=False)
        self._sizes.forget(call.session_id)  # sized and counted as the call left them
        self.tokens.forget(call.session_id)
        if pending:
            job_id = pending["job_id"]
            reason = f"not applied in this call (its archive write: {failed or 'timed out'})"
            self._tell(call.session_id, job_id, "cancelled", reason=reason)

    def _apply(
        self,
        session_id: str,
        job_id: str,
        messages: list[BaseMessage],
        out: int = 0,
        writes: list[_Write] | None = None,
    ) -> tuple[Fitted, dict[str, Any]] | None:
        """The fitted compaction of job ``job_id`` (its patch lands the thread under its
        prepare floor) and what to record once it is in the state; None if there is nothing
        to apply. Its record and the originals it removes are stored (invariant 12) first,
        or, given ``writes``, while the model answers (see :meth:`_shorten`); its loss report
        (issue 19) after that, on the writer thread (:data:`LOSS_PENDING` until then)."""
        client = self.client
        with self._guard:
            if job_id in self._storing:  # an earlier call's write of it is still running
                return None
        try:
            row = job_row(client.engine, job_id)
            if row is None or row["status"] != JobStatus.PREPARED or not row["result"]:
                return None
            result = row["result"]
            if landed(messages, job_id, result.get("record")):  # a crashed run had applied it
                self._record(session_id, {"job_id": job_id, "record": result["record"]}, messages)
                return None
            forced = bool((row.get("options") or {}).get("force"))
            fitted = fit(
                Prepared.from_json(result["prepared"]),
                messages,
                # compact now: no bound, as for offpath's own threads (apply_locked)
                target=None if forced else landing_chars(self.settings),
                recall=self.recall,
                settings=self.settings,
                outside_chars=out,
            )
            if isinstance(fitted, Stale):
                end_stale(client.engine, client.leases, session_id, job_id, fitted)
                self._tell(session_id, job_id, "cancelled", reason=f"stale: {fitted.reason}")
                return None
            if broken := new_unpaired(messages, add_messages(messages, fitted.patch)):
                reason = f"patch would orphan tool calls {sorted(broken)}"
                set_job(client.engine, job_id, session_id, JobStatus.FAILED, reason, "orphan_guard")
                client.leases.settle(session_id, job_id, None)
                self._tell(session_id, job_id, "failed", reason=reason)
                return None
            write = partial(self._store_applied, session_id, job_id, result, fitted, messages)
            if writes is None:
                write()
            else:
                writes.append((job_id, write))
        except Exception as exc:  # the run goes on uncompacted; the reconciler tidies up
            self._trouble(USAGE_DB, exc, f"[{tag(session_id)}] could not apply job {job_id}: {exc}")
            self._tell(session_id, job_id, "failed", reason=f"not applied: {exc}")
            return None
        log.info(
            "[%s] applying job %s in the run: %d -> %d chars",
            tag(session_id),
            job_id,
            fitted.record["chars_before"],
            fitted.record["chars_after"],
        )
        return fitted, {"job_id": job_id, "record": fitted.record}

    def _store_applied(
        self,
        session_id: str,
        job_id: str,
        result: dict[str, Any],
        fitted: Fitted,
        messages: list[BaseMessage],
    ) -> None:
        """Store the record of job ``job_id``'s compaction fitted to ``messages`` and the
        originals it removes (before its patch is in the state), then have its loss report
        made on the writer thread."""
        rows = archive.rows_for(
            session_id, job_id, str(fitted.summary.id), messages, fitted.removed, fitted.shortened
        )
        record = {**fitted.record, "loss": LOSS_PENDING}
        archive.store_record(self.client.engine, job_id, {**result, "record": record}, rows)
        self._write(self._report_loss, session_id, job_id, fitted, messages)

    def _report_loss(
        self, session_id: str, job_id: str, fitted: Fitted, messages: list[BaseMessage]
    ) -> None:
        """Make job ``job_id``'s loss report (:func:`with_loss`, which never raises) and put it
        in its stored record."""
        loss = with_loss(fitted, messages)["loss"]
        try:
            archive.store_loss(self.client.engine, job_id, str(fitted.summary.id), loss)
        except Exception as exc:  # the record keeps LOSS_PENDING, which says so
            line = f"[{tag(session_id)}] could not store the loss report of job {job_id}: {exc}"
            self._trouble(USAGE_DB, exc, line)

    def _record(
        self, session_id: str, pending: dict[str, Any], messages: list[BaseMessage]
    ) -> None:
        """Record a compaction this run applied, once its summary is in the state (exactly
        once: the usage event is unique by job id)."""
        job_id, record = pending["job_id"], pending["record"]
        if not landed(messages, job_id, record):
            log.warning(
                "[%s] the update of job %s did not land; not recorded", tag(session_id), job_id
            )
            return
        client = self.client
        try:
            finalize(client.engine, job_id, session_id)
            client.leases.settle(session_id, job_id, Leases.after(job_id, State.DONE))
        except Exception as exc:  # a later job or the reconciler records it
            self._trouble(
                USAGE_DB, exc, f"[{tag(session_id)}] could not record job {job_id}: {exc}"
            )
        self._tell(
            session_id,
            job_id,
            "completed",
            record.get("chars_before"),
            record.get("chars_after"),
        )
