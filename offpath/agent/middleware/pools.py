"""The middleware's background pools (:data:`POOLS`): claim and latency reads, facts read
ahead, archive writes, and on the writer threads a job's publishing, masking counters and
telling the app's ``on_compaction`` callback."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import copy_context
from dataclasses import replace
from typing import Any

from langchain_core.messages import BaseMessage

from offpath.agent.middleware.helpers import _outside, log
from offpath.agent.middleware.place import Place
from offpath.compaction.facts.extraction import warm as warm_facts
from offpath.coordination.job_values import JobOptions, head_mark
from offpath.coordination.logs import tag
from offpath.coordination.outages import OUTAGES, USAGE_DB, is_outage, where
from offpath.events import CompactionUpdate
from offpath.stores.db.usage_events import record_masking

#: The middleware's background threads, by name: how many each pool has, and what runs
#: there. Each kind of work has its own, so that none waits behind another (issue 18,
#: item 4: claim reads starved behind publishes and counters).
POOLS = {
    "read": 1,  # claim and latency reads
    "write": 2,  # publishes, counters, loss reports
    "archive": 2,  # archive writes a model call's update waits for
    "facts": 1,  # facts of new messages, read ahead
}


class PoolsMixin:
    """:class:`~offpath.agent.middleware.OffPathCompaction`'s background work: its pools and
    what runs there (reads, archive writes, a job's publishing, masking counters, the app's
    callback). Its methods use the attributes set in ``OffPathCompaction.__init__``."""

    def _pool(self, name: str) -> ThreadPoolExecutor:
        """The background pool ``name`` (:data:`POOLS`), started on first use. Work goes there
        with the caller's context (the thread's settings in force: :mod:`.counting`)."""
        with self._guard:
            pool = self._pools.get(name)
            if pool is None:
                pool = self._pools[name] = ThreadPoolExecutor(
                    POOLS[name], thread_name_prefix=f"offpath-{name}"
                )
        return pool

    def _read(self, fn: Any, *args: Any) -> Future[Any]:
        """Run ``fn`` on the reader thread: claim and latency reads only, so that they are
        never starved by publishes and counters (issue 18, item 4)."""
        return self._pool("read").submit(copy_context().run, fn, *args)

    def _read_ahead(self, messages: list[BaseMessage]) -> None:
        """Find the facts of ``messages`` (those a model call is the first to see) on the facts
        thread, while the model answers (:func:`offpath.compaction.facts.warm`): a later
        shortening of them, and a compaction applied in the run, then find them ready instead
        of reading them in a model call's path."""

        def read() -> None:
            try:
                warm_facts(messages)
            except Exception as exc:  # found again when needed, in the path
                log.debug("offpath: facts not read ahead: %s", exc)

        try:
            self._pool("facts").submit(copy_context().run, read)
        except RuntimeError:  # the interpreter is shutting down: found when needed
            pass

    def _archive(self, fn: Any, *args: Any) -> Future[Any]:
        """Run ``fn`` (an archive write a model call's update waits for) on the archive
        threads: never queued behind publishes and counters."""
        return self._pool("archive").submit(copy_context().run, fn, *args)

    def _write(self, fn: Any, *args: Any) -> None:
        self._pool("write").submit(copy_context().run, fn, *args)

    def _publish_soon(
        self,
        session_id: str,
        chars: int,
        messages: Sequence[BaseMessage],
        private: dict[str, Any],
        place: Place,
        planned: int | None = None,
    ) -> None:
        """Queue a job for the thread in a background thread (the model call does not wait).
        The job names the run's newest message (``seen``: the worker waits for the checkpoint
        to hold it, as LangGraph writes it in the background), where the run's messages are
        (its ``thread_id`` and checkpoint namespace: a subgraph's, a callee's), and the size it
        may plan from (the prepare point, or ``planned``)."""
        with self._guard:
            if session_id in self._publishing:
                return
            self._publishing.add(session_id)
        options = replace(
            self.options,
            seen=messages[-1].id if messages else None,
            head=head_mark(messages),
            checkpoint_ns=place.ns or None,
            thread_id=place.thread_id if place.thread_id != session_id else None,
            floor=min(chars if planned is None else planned, self._prepare_point(private)),
            outside=_outside(private),
            chars_per_token=self._thread_ratio(session_id),
        )
        self._write(self._publish, session_id, chars, options)

    def _publish(self, session_id: str, chars: int, options: JobOptions) -> None:
        try:
            result = self.client.jobs.queue(
                session_id,
                chars,
                options=options,
                min_gain=self._min_gain,
                threshold=self._threshold,
                say_outages=True,
            )
            if result.action != "error":
                self._answered(USAGE_DB)
            if result.action == "queued":
                with self._guard:
                    self._published[session_id] = (result.job_id, time.monotonic())
                if result.job_id:
                    self._note_queued(result.job_id)
                    self._watch_pickup(session_id, result.job_id)
                    self._tell(session_id, result.job_id, "in_progress", chars)
        except Exception as exc:
            line = f"[{tag(session_id)}] compaction not queued: {exc}"
            self._trouble(USAGE_DB, exc, line, "compaction not queued")
        finally:
            self._read_claim(session_id)  # the claim it took (or found), before the next try
            with self._guard:
                self._publishing.discard(session_id)

    def _count_masking(self, session_id: str, results: int, chars: int) -> None:
        try:
            record_masking(self.client.engine, session_id, results, chars)
        except Exception as exc:
            self._trouble(USAGE_DB, exc, f"[{tag(session_id)}] could not count a masking: {exc}")
            return
        self._answered(USAGE_DB)

    def _trouble(self, store: str, exc: BaseException, line: str, effect: str = "") -> None:
        """Something the middleware did with ``store`` failed: a store's own error (away,
        refusing, no tables) is one line the first time, then counted
        (:data:`~offpath.coordination.outages.OUTAGES`); any other error logs ``line``."""
        if is_outage(exc):
            OUTAGES.failed(store, self._where(store), exc, effect)
        else:
            log.warning(line)

    def _answered(self, store: str) -> None:
        """``store`` answered: an outage of it, if one was said, ends with its count."""
        OUTAGES.recovered(store, self._where(store))

    def _where(self, store: str) -> str:
        """Where ``store`` is (a URL without its password, or a file), worked out once."""
        found = self._stores_at.get(store)
        if found is None:
            found = self._stores_at[store] = where(store, self.settings)
        return found

    def _tell(
        self,
        session_id: str,
        job_id: str,
        status: Any,
        chars_before: int | None = None,
        chars_after: int | None = None,
        reason: str | None = None,
    ) -> None:
        """Call ``on_compaction`` with the update, if the app gave one, and, told on the run's
        own thread, write it to the run's stream (:func:`stream_update`); never raise."""
        update = CompactionUpdate(session_id, job_id, status, chars_before, chars_after, reason)
        stream_update(update)
        if self.on_compaction is None:
            return
        try:
            self.on_compaction(update)
        except Exception:
            log.exception("[%s] on_compaction raised (ignored)", tag(session_id))

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)


def stream_update(update: CompactionUpdate) -> bool:
    """Write ``update`` to the stream of the run it happens in, as a LangGraph custom stream
    event (``langgraph.config.get_stream_writer``): ``update.to_acp()`` with its
    ``sessionId``. A UI that streams the agent with ``stream_mode=["messages", "custom"]``
    (or ``"custom"``) gets it as ``("custom", {"sessionUpdate": "compaction_update", ...})``
    beside the model's tokens. False when it is told outside a run (the middleware's
    background threads: ``in_progress``), where no stream is at hand; a stream that is not in
    ``custom`` mode drops it."""
    from langgraph.config import get_stream_writer

    try:
        writer = get_stream_writer()
    except RuntimeError:  # not inside a run
        return False
    try:
        writer({**update.to_acp(), "sessionId": update.session_id})
    except Exception as exc:  # the app's stream is gone: the run's state has it anyway
        log.debug("[%s] compaction update not streamed: %s", tag(update.session_id), exc)
        return False
    return True
