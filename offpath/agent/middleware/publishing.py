"""Queuing a thread's compaction job from a model call (:class:`Publisher`), in the
background: the call never waits, not even for a broker that is down."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from langchain_core.messages import BaseMessage

from offpath.agent.middleware.claims import Claims
from offpath.agent.middleware.counting import ThreadSettings
from offpath.agent.middleware.pacing import Pacing
from offpath.agent.middleware.place import Place
from offpath.agent.middleware.pools import Background
from offpath.agent.middleware.reports import Reports
from offpath.agent.middleware.state import outside_of
from offpath.compaction.planner.budgets import min_gain_chars
from offpath.coordination.jobs import JobOptions, head_mark
from offpath.coordination.logs import tag
from offpath.coordination.outages import USAGE_DB
from offpath.coordination.runtime import Client


class Publisher:
    """The jobs a middleware queues, one at a time per thread.

    Requires: the settings in force, the client (opened on first use: its
    :class:`~offpath.coordination.jobs.Jobs` queues), the background threads, the reports,
    the claims (read again once a job is queued, and its pickup watched), the pacing (the
    prepare point a job may plan from) and the agent's
    :class:`~offpath.coordination.jobs.JobOptions`. Provides: :meth:`publish_soon`, :meth:`publishing`."""

    def __init__(
        self,
        settings: ThreadSettings,
        client: Callable[[], Client],
        background: Background,
        reports: Reports,
        claims: Claims,
        pacing: Pacing,
        options: JobOptions,
    ) -> None:
        self.settings = settings
        self.client = client
        self.background = background
        self.reports = reports
        self.claims = claims
        self.pacing = pacing
        self.options = options
        self._guard = threading.Lock()
        self._publishing: set[str] = set()

    def publishing(self, session_id: str) -> bool:
        """A job for the thread is being queued by this process."""
        with self._guard:
            return session_id in self._publishing

    def publish_soon(
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
            floor=min(chars if planned is None else planned, self.pacing.point(private)),
            outside=outside_of(private),
            chars_per_token=self.settings.ratio(session_id),
        )
        self.background.write(self._publish, session_id, chars, options)

    def _publish(self, session_id: str, chars: int, options: JobOptions) -> None:
        s = self.settings.current
        try:
            result = self.client().jobs.queue(
                session_id,
                chars,
                options=options,
                min_gain=min_gain_chars(s),
                threshold=s.summarization_threshold_chars,
                say_outages=True,
            )
            if result.action != "error":
                self.reports.answered(USAGE_DB)
            if result.action == "queued" and result.job_id:
                self.claims.note_queued(result.job_id)
                self.claims.watch_pickup(session_id, result.job_id)
                self.reports.tell(session_id, result.job_id, "in_progress", chars)
        except Exception as exc:
            line = f"[{tag(session_id)}] compaction not queued: {exc}"
            self.reports.trouble(USAGE_DB, exc, line, "compaction not queued")
        finally:
            self.claims.read_claim(session_id)  # the claim it took (or found), before the next try
            with self._guard:
                self._publishing.discard(session_id)
