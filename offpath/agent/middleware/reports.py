"""What the middleware tells: a store it could not use (one line, then counted, as an outage:
:data:`~offpath.coordination.outages.OUTAGES`), a warning said once per process, and a
compaction's progress told to the app (``on_compaction``) and to the run's stream
(:func:`stream_update`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from offpath.agent.middleware.counting import ThreadSettings
from offpath.coordination.logs import tag
from offpath.coordination.outages import OUTAGES, is_outage, where
from offpath.events import CompactionUpdate

log = logging.getLogger("offpath.middleware")
#: Most keys a process remembers as said once (a thread's masking warning is not said again
#: past it; the others always are once).
MAX_SAID = 10_000


class Reports:
    """The middleware's outage lines, once-only warnings and compaction updates.

    Requires: the settings in force (:class:`~offpath.agent.middleware.counting.ThreadSettings`:
    where each store is) and the app's ``on_compaction`` callback (or None). Provides:
    :meth:`trouble`, :meth:`answered`, :meth:`warn_once`, :meth:`first`, :meth:`tell`."""

    def __init__(
        self,
        settings: ThreadSettings,
        on_compaction: Callable[[CompactionUpdate], Any] | None,
    ) -> None:
        self.settings = settings
        self.on_compaction = on_compaction
        self._said: set[str] = set()
        self._stores_at: dict[str, str] = {}  # store -> where it is (outage lines)

    def trouble(self, store: str, exc: BaseException, line: str, effect: str = "") -> None:
        """Something the middleware did with ``store`` failed: a store's own error (away,
        refusing, no tables) is one line the first time, then counted
        (:data:`~offpath.coordination.outages.OUTAGES`); any other error logs ``line``."""
        if is_outage(exc):
            OUTAGES.failed(store, self._where(store), exc, effect)
        else:
            log.warning(line)

    def answered(self, store: str) -> None:
        """``store`` answered: an outage of it, if one was said, ends with its count."""
        OUTAGES.recovered(store, self._where(store))

    def _where(self, store: str) -> str:
        """Where ``store`` is (a URL without its password, or a file), worked out once."""
        found = self._stores_at.get(store)
        if found is None:
            found = self._stores_at[store] = where(store, self.settings.current)
        return found

    def said(self, key: str) -> bool:
        """The warning ``key`` was said (or marked :meth:`first`) in this process."""
        return key in self._said

    def warn_once(self, key: str, message: str) -> None:
        """Log ``message`` as a warning, the first time ``key`` is given only."""
        if key not in self._said:
            self._said.add(key)
            log.warning(message)

    def first(self, key: str) -> bool:
        """True the first time ``key`` is given (while fewer than :data:`MAX_SAID` are
        remembered), False after: a warning said once, then lines at a lower level."""
        if key in self._said:
            return False
        if len(self._said) < MAX_SAID:
            self._said.add(key)
        return True

    def forget(self, key: str) -> None:
        """``key`` may be said again."""
        self._said.discard(key)

    def tell(
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
