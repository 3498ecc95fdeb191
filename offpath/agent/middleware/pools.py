"""The middleware's background threads (:class:`Background`), by kind of work (:data:`POOLS`):
claim and latency reads, facts read ahead (and stored for the worker's job), archive writes,
and on the writer threads a job's publishing, counters and session notes. Work goes there with the caller's context (the
thread's settings in force: :mod:`.counting`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import copy_context
from typing import Any

from langchain_core.messages import BaseMessage

from offpath.compaction.facts.extraction import warm as warm_facts

log = logging.getLogger("offpath.middleware")

#: The middleware's background threads, by name: how many each pool has, and what runs
#: there. Each kind of work has its own, so that none waits behind another (claim reads
#: starve behind publishes and counters otherwise).
POOLS = {
    "read": 1,  # claim and latency reads
    "write": 2,  # publishes, counters, loss reports
    "archive": 2,  # archive writes a model call's update waits for
    "facts": 1,  # facts of new messages, read ahead and stored
}
#: Most facts reads ahead queued or running on the facts thread (:meth:`Background.read_ahead`).
MAX_READ_AHEADS = 64


class Background:
    """The pools of :data:`POOLS`, each started on first use.

    Requires: nothing. Provides: :meth:`read`, :meth:`write`, :meth:`archive`,
    :meth:`read_ahead`, and :meth:`pool` (a pool by name)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._waiting = threading.BoundedSemaphore(MAX_READ_AHEADS)  # facts reads queued

    def pool(self, name: str) -> ThreadPoolExecutor:
        """The background pool ``name`` (:data:`POOLS`), started on first use."""
        with self._guard:
            pool = self._pools.get(name)
            if pool is None:
                pool = self._pools[name] = ThreadPoolExecutor(
                    POOLS[name], thread_name_prefix=f"offpath-{name}"
                )
        return pool

    def read(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``fn`` on the reader thread: claim and latency reads only, so that they are
        never starved by publishes and counters."""
        return self.pool("read").submit(copy_context().run, fn, *args)

    def archive(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``fn`` (an archive write a model call's update waits for) on the archive
        threads: never queued behind publishes and counters."""
        return self.pool("archive").submit(copy_context().run, fn, *args)

    def write(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` on the writer threads (publishes, counters, notes, loss reports)."""
        self.pool("write").submit(copy_context().run, fn, *args)

    def read_ahead(
        self, messages: list[BaseMessage], then: Callable[[], Any] | None = None
    ) -> None:
        """Find the facts of ``messages`` (those a model call is the first to see) on the facts
        thread, while the model answers (:func:`offpath.compaction.facts.warm`): a later
        shortening of them, and a compaction applied in the run, then find them ready instead
        of reading them in a model call's path; ``then`` runs after, on that thread (the
        facts stored for the job that removes the messages). At most
        :data:`MAX_READ_AHEADS` wait; one more is dropped (its facts are found when needed,
        in the path or by the job). Never raises, never waits."""
        if not messages:
            return

        def read() -> None:
            try:
                warm_facts(messages)
                if then is not None:
                    then()
            except Exception as exc:  # found again when needed, in the path or the job
                log.debug("offpath: facts not read ahead: %s", exc)
            finally:
                self._waiting.release()

        if not self._waiting.acquire(blocking=False):
            log.debug("offpath: facts not read ahead: %d reads wait already", MAX_READ_AHEADS)
            return
        try:
            self.pool("facts").submit(copy_context().run, read)
        except RuntimeError:  # the interpreter is shutting down: found when needed
            self._waiting.release()
