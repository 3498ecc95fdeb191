"""When a thread's job is queued (:class:`Pacing`): the *prepare point*, from the run's growth
(chars per second) and the summarizer's measured latency (p90 of the deployment's recent
compactions), early enough for the summary to be ready when the thread crosses its
threshold; and the crossing that frees a thread a skip holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from offpath.agent.middleware.counting import ThreadSettings
from offpath.agent.middleware.pools import Background
from offpath.agent.middleware.state import outside_of
from offpath.compaction.planner.budgets import earliest_worth, min_gain_chars, prepare_from_chars
from offpath.coordination.runtime import Client
from offpath.stores.leases.claims import Claim
from offpath.stores.usage.totals import summarizer_latency_p90_s

#: How often (s) the summarizer's latency p90 is read again, and what it is assumed to be
#: before any compaction of the deployment measured it.
LATENCY_REFRESH_S = 60.0
DEFAULT_LATENCY_S = 5.0
#: Seconds a job takes beyond its summarizer: publish, a worker taking it, the checkpoint
#: catching up with the run (LangGraph writes it in the background), storing the result.
JOB_OVERHEAD_S = 1.5
#: Weight of the newest sample in the run's growth rate (exponential moving average).
RATE_WEIGHT = 0.5


class Pacing:
    """The prepare point of a thread, from what its private key holds (its fixed part, its
    growth rate) and the summarizer's latency.

    Requires: the settings in force, the client (opened on first use: the latency's read)
    and the background threads (where it is read). Provides: :meth:`track_rate`,
    :meth:`point`, :meth:`frees`, :meth:`crossing_frees`, :attr:`latency`."""

    def __init__(
        self, settings: ThreadSettings, client: Callable[[], Client], background: Background
    ) -> None:
        self.settings = settings
        self.client = client
        self.background = background
        #: the summarizer's p90 latency (s), and when it was read (monotonic)
        self.latency: tuple[float, float] = (DEFAULT_LATENCY_S, 0.0)

    def frees(self, holder: Claim | None, chars: int, threshold: bool = False) -> bool:
        """A job may be queued for a thread of ``chars`` whose claim is ``holder`` (none, or a
        skip that a thread this size no longer respects; ``threshold``: weighed against the
        threshold as well)."""
        s = self.settings.current
        if holder is None:
            return True
        if threshold:
            return holder.frees_for(chars, min_gain_chars(s), s.summarization_threshold_chars)
        return holder.frees_for(chars, min_gain_chars(s))

    def crossing_frees(self, holder: Claim | None, reached: int, private: dict[str, Any]) -> bool:
        """A skip decided under the threshold frees a thread that crossed it (``reached``:
        its size before this call shortened older results), once until the next compaction
        is applied: the thread's counted size is held near the prepare floor by that
        shortening, so the skip's gain rule alone would hold it while every call goes over
        the threshold. A job queued so, which then finds nothing worth compacting, leaves a
        skip decided under the threshold again: the ``crossed`` flag stops a job per call."""
        if holder is None or private.get("crossed"):
            return False
        if not self.frees(holder, reached, threshold=True):
            return False
        private["crossed"] = True
        return True

    def track_rate(self, private: dict[str, Any], chars: int) -> None:
        """Keep the run's growth in chars per second (a moving average over its model calls)
        in the private key."""
        now = time.time()
        rate = dict(private.get("rate") or {})
        last_t, last_chars = rate.get("t"), rate.get("chars")
        if isinstance(last_t, float | int) and isinstance(last_chars, int):
            dt = now - float(last_t)
            if 0 < dt < 600 and chars > last_chars:
                sample = (chars - last_chars) / dt
                g = rate.get("g")
                rate["g"] = sample if not g else RATE_WEIGHT * sample + (1 - RATE_WEIGHT) * g
        rate["t"], rate["chars"] = now, chars
        private["rate"] = rate

    def point(self, private: dict[str, Any]) -> int:
        """The size (chars) from which a job is queued: early enough that its summary is ready
        when the thread crosses its threshold (the run's growth rate x the summarizer's p90
        latency and a job's overhead), never later than the prepare floor
        (``SUMMARIZATION_PREPARE_AT``; for a thread whose fixed part is over it, where a
        compaction lands it and a least gain: :func:`~offpath.compaction.planner.
        prepare_from_chars`), and not before a compaction could be worth it (the keep window, a
        summary's budget and the no-progress gain of the thread, whose fixed part no compaction
        removes: :func:`~offpath.compaction.planner.earliest_worth`). Sizes as a call sends
        them."""
        s = self.settings.current
        fixed = int(private.get("fixed") or outside_of(private))
        floor = prepare_from_chars(s, fixed)  # the prepare floor, unless the fixed part is over
        growth = float((private.get("rate") or {}).get("g") or 0.0)
        if growth <= 0:
            return floor
        lead = growth * (self._latency_p90() + JOB_OVERHEAD_S) * 1.25
        ahead = int(s.summarization_threshold_chars - lead)
        # sizes as a call sends them: a system prompt given to the agent is in every one
        return min(floor, max(earliest_worth(s, fixed), ahead))

    def _latency_p90(self) -> float:
        """The summarizer's p90 latency in seconds over the deployment's recent compactions,
        read in the background at most every :data:`LATENCY_REFRESH_S`."""
        p90, at = self.latency
        if time.monotonic() - at >= LATENCY_REFRESH_S:
            self.latency = (p90, time.monotonic())

            def read() -> None:
                try:
                    value = summarizer_latency_p90_s(self.client().engine)
                except Exception:  # the usage database is away: keep the last figure
                    return
                if value is not None:
                    self.latency = (value, time.monotonic())

            self.background.read(read)
        return p90
