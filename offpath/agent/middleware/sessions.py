"""An own agent's threads recorded as sessions in offpath's ``sessions`` table
(:class:`Sessions`): at a thread's first model call in the process, then at most every
:data:`NOTE_EVERY_S` and at the run's end, in the background; and, as the agent is built, the
tables made or brought up to date and its checkpointer checked."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from offpath.agent.middleware.counting import ThreadSettings
from offpath.agent.middleware.pools import Background
from offpath.agent.middleware.reports import Reports
from offpath.coordination.logs import tag
from offpath.coordination.outages import CHECKPOINTER, USAGE_DB
from offpath.coordination.runtime import Client
from offpath.stores.tenants import note_own_thread

#: How often (s) at most a thread's size and last activity are recorded in offpath's
#: ``sessions`` table during a run (also at its first call and at the run's end).
NOTE_EVERY_S = 5.0
#: Most threads whose last note a process remembers (all are forgotten past it).
MAX_NOTED = 10_000


class Sessions:
    """The notes of an own agent's threads as sessions (kind ``own agent``).

    Requires: the settings in force, the client (opened on first use), the background
    threads, the reports, the ``tenant`` whose keys see the threads and ``checkpoints`` (the
    URL the worker reads them from; None: offpath's own). Provides: :meth:`note_soon`,
    :meth:`warm`."""

    def __init__(
        self,
        settings: ThreadSettings,
        client: Callable[[], Client],
        background: Background,
        reports: Reports,
        *,
        tenant: str,
        checkpoints: str | None,
    ) -> None:
        self.settings = settings
        self.client = client
        self.background = background
        self.reports = reports
        self.tenant = tenant
        self.checkpoints = checkpoints
        self._guard = threading.Lock()
        self._noted: dict[str, float] = {}  # thread -> when its session row was last written
        # thread -> size held back, and when it was seen
        self._note_later: dict[str, tuple[int, int, int | None, float]] = {}
        # thread -> when the size its row holds was seen: the writer threads run two notes of
        # one thread at once, and the one seen first may end last
        self._written: dict[str, float] = {}
        self._rows = [threading.Lock() for _ in range(16)]  # one thread's notes one at a time

    def warm(self) -> None:
        """As the agent is built, on the writer threads: offpath's tables made or brought up
        to date (:meth:`_warm_tables`), and the checkpointer the worker is to read checked."""
        self.background.write(self._warm_tables)
        if self.checkpoints:
            self.background.write(self._check_checkpointer, self.checkpoints)

    def _check_checkpointer(self, url: str) -> None:
        """Say once, as the agent is built, when the checkpointer the worker is to read this
        agent's threads from (``checkpointer_url``) cannot be reached from here."""
        from kombu.utils.url import sanitize_url

        from offpath.coordination.outages import OUTAGES, check_checkpointer

        try:
            check_checkpointer(url, self.settings.current.publish_timeout_s * 5)
        except Exception as exc:
            effect = "the worker reads this agent's threads there: no compaction until it can"
            OUTAGES.failed(CHECKPOINTER, sanitize_url(url), exc, effect)

    def _warm_tables(self) -> None:
        """Make offpath's tables in the usage database, or bring them up to date, if this
        process is the first to use them (an agent started before ``offpath migrate`` or
        any worker: :meth:`~offpath.coordination.runtime.Client.ensure_tables`)."""
        try:  # a new connection checks them first (Client.ensure_tables)
            self.client().engine.connect().close()
        except Exception as exc:
            effect = "no compaction is queued or recorded until it can be"
            self.reports.trouble(USAGE_DB, exc, f"offpath: {exc}", effect)

    def note_soon(
        self,
        session_id: str,
        messages: int,
        chars: int,
        every: float | None = None,
        fixed: int | None = None,
    ) -> None:
        """Record the thread as a session of kind ``own agent`` (its size, last activity, its
        ``fixed`` part if known, with the threshold) in the background, at most every
        ``every`` seconds (:data:`NOTE_EVERY_S`); a size held back by that is written when the
        period ends."""
        every = NOTE_EVERY_S if every is None else every
        now = time.monotonic()
        with self._guard:
            last = self._noted.get(session_id)
            if last is not None and now - last < every:
                # the latest size is written once the period ends: a run that raises (a
                # tool's error, the recursion limit) reaches no run's end to note it at
                waiting = session_id in self._note_later
                self._note_later[session_id] = (messages, chars, fixed, now)
                if waiting:
                    return
                delay = every - (now - last)
            else:
                delay = None
                self._note_later.pop(session_id, None)
                if len(self._noted) > MAX_NOTED:
                    self._noted.clear()
                self._noted[session_id] = now
        if delay is None:
            self.background.write(self._note, session_id, messages, chars, fixed, now)
            return
        timer = threading.Timer(delay, self._note_latest, (session_id,))
        timer.daemon = True
        timer.start()

    def _note_latest(self, session_id: str) -> None:
        """Write the thread's latest size held back by :meth:`note_soon`'s period, if no
        note has written it since."""
        with self._guard:
            later = self._note_later.pop(session_id, None)
            if later is None:
                return
            self._noted[session_id] = time.monotonic()
        self.background.write(self._note, session_id, *later)

    def _note(
        self,
        session_id: str,
        messages: int,
        chars: int,
        fixed: int | None = None,
        seen_at: float | None = None,
    ) -> None:
        """Write the thread's size seen at ``seen_at`` (monotonic s; None: now) on its
        session row, unless a size seen later is there already."""
        seen_at = time.monotonic() if seen_at is None else seen_at
        with self._rows[hash(session_id) % len(self._rows)]:
            if seen_at < self._written.get(session_id, float("-inf")):
                return
            if self._write_note(session_id, messages, chars, fixed):
                if len(self._written) > MAX_NOTED:
                    self._written.clear()
                self._written[session_id] = seen_at

    def _write_note(self, session_id: str, messages: int, chars: int, fixed: int | None) -> bool:
        """One note written (True), or its failure said (False)."""
        try:
            mine = note_own_thread(
                self.client().engine,
                session_id,
                self.tenant,
                self.checkpoints,
                messages,
                chars,
                fixed=fixed,
                threshold=self.settings.current.summarization_threshold_chars,
            )
        except Exception as exc:
            line = f"[{tag(session_id)}] could not record the thread as a session: {exc}"
            self.reports.trouble(USAGE_DB, exc, line)
            return False
        self.reports.answered(USAGE_DB)
        if not mine:
            self.reports.warn_once(
                f"taken:{session_id}",
                f"[{tag(session_id)}] offpath: thread id {session_id!r} is already another "
                f"tenant's session or an API session: it is not listed as tenant "
                f"{self.tenant!r}'s own agent thread",
            )
        return True
