"""offpath's own Prometheus metrics (prometheus-client), defined in one place.

Counters and histograms live in the process that did the work; scrape every process
and ``sum()`` across them:

* the API (``GET /metrics``): what the post-turn hook and the chat runs' middleware did
  (jobs queued, compactions applied during a run), plus what :class:`~offpath.coordination.exporter.QueueCollector`
  reads at scrape time: the queue depth and its consumers from the broker, the open jobs,
  and the compactions, chars saved and fallback maskings of every process from the
  usage tables (a team's own agent's middleware writes its rows there and serves no
  metrics of its own). Every API replica reads the same tables:
  aggregate those with ``max()``, not ``sum()``;
* each worker (its own port, ``WORKER_METRICS_PORT``, default 9808; 0: off; see
  :func:`~offpath.coordination.exporter.serve_worker_metrics`): jobs run, summarizer latency and tokens, compactions
  applied, reconciler actions.

========================================  =========  ==========================================
metric                                    type       labels, unit
========================================  =========  ==========================================
``offpath_jobs_total``                    counter    ``status`` (queued, prepared, applied,
                                                     skipped, failed), ``reason`` (the job's
                                                     ``reason_code``, "" when none): jobs that
                                                     reached that status in this process
``offpath_compaction_lag_seconds``        histogram  threshold crossed -> compaction applied
``offpath_summarizer_latency_seconds``    histogram  ``summarizer`` (llm, offline): one call
``offpath_summarizer_tokens_total``       counter    ``summarizer``, ``kind`` (input, output):
                                                     as the LLM reported them (0 offline)
``offpath_compactions_total``             counter    compactions applied, by any process (the
                                                     middleware of a team's own agent too):
                                                     usage events, read at scrape; API only
``offpath_chars_saved_total``             counter    the real reduction of those compactions
                                                     (size before - size after, chars; a
                                                     re-folded summary is not saved twice),
                                                     read at scrape; API only
``offpath_fallback_maskings_total``       counter    model calls whose old tool results were
                                                     masked (over the hard limit), by any
                                                     process: read at scrape; API only
``offpath_summaries_paid_total``          counter    summaries prepared (an LLM call paid
                                                     for): applied, waiting or dropped; from
                                                     the job rows at scrape; API only
``offpath_summaries_dropped_total``       counter    of those, ended without being applied
                                                     (stale, expired, superseded): paid for
                                                     and never used; the share never applied
                                                     is (this + ``offpath_jobs_open``
                                                     prepared) / paid; API only
``offpath_reconciler_actions_total``      counter    ``action``
``offpath_api_event_loop_lag_seconds``    histogram  the API's event loop waking late (sampled
                                                     every 50 ms): how long no request could be
                                                     served
``offpath_api_event_streams``             gauge      open ``GET /sessions/{id}/events`` streams
``offpath_api_event_stream_polls_total``  counter    the streams' one poller's reads of the
                                                     job rows (one a tick, for every stream)
``offpath_queue_depth``                   gauge      ``queue``: messages waiting in the broker
``offpath_jobs_open``                     gauge      ``status`` (queued, running, prepared):
                                                     job rows not ended, from the database
``offpath_queue_consumers``               gauge      ``queue``: workers consuming it, asked
                                                     through the broker (cached 10 s;
                                                     :mod:`offpath.coordination.consumers`)
========================================  =========  ==========================================

Every status change of a job row goes through :mod:`offpath.stores.db`, which counts
it here (one place, whichever process made the change: ``offpath_jobs_total`` of the jobs
a team's own agent applies is counted in that agent's process, which exports nothing; the
compactions themselves are in ``offpath_compactions_total``). The counters read from the
tables fall when rows are deleted (a forgotten session, a purge): Prometheus's ``rate()``
and ``increase()`` take that as a counter reset. This module imports no server (the
middleware imports it, inside a team's own agent).
"""

from __future__ import annotations

import logging

from prometheus_client import (
    Counter,
    Gauge,
    Histogram,
)

log = logging.getLogger("offpath.metrics")

#: Lag buckets, seconds: a compaction applied at the crossing turn takes milliseconds; one
#: that waited for a summary, seconds to a minute; a lost worker, the lease and reconciler.
LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600)
#: Summarizer latency buckets, seconds (an LLM call: a second to a minute).
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120)

JOBS = Counter(
    "offpath_jobs",
    "Compaction jobs that reached a status in this process, by status and reason code",
    ["status", "reason"],
)
LAG = Histogram(
    "offpath_compaction_lag_seconds",
    "From the thread crossing its threshold (or the job being queued, if later) to the "
    "compaction being applied",
    buckets=LAG_BUCKETS,
)
#: The API's event loop waking this late (s): over 0.1 s, no request was served meanwhile.
LOOP_LAG = Histogram(
    "offpath_api_event_loop_lag_seconds",
    "How late the API's event loop woke from a 50 ms sleep (no request is served meanwhile)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
#: Open ``GET /sessions/{id}/events`` streams of the API process, and its poller's reads of
#: the job rows (one per tick for every stream open).
EVENT_STREAMS = Gauge(
    "offpath_api_event_streams", "Open GET /sessions/{id}/events streams of the API process"
)
EVENT_STREAM_POLLS = Counter(
    "offpath_api_event_stream_polls_total",
    "Reads of the job rows by the API's one event-stream poller (one a tick, for every stream)",
)
SUMMARIZER_LATENCY = Histogram(
    "offpath_summarizer_latency_seconds",
    "One summarizer call (the LLM, or the offline summarizer)",
    ["summarizer"],
    buckets=LATENCY_BUCKETS,
)
SUMMARIZER_TOKENS = Counter(
    "offpath_summarizer_tokens",
    "Tokens the summarizer's LLM reported (input: the prompt, which holds the removed "
    "messages; output: the summary)",
    ["summarizer", "kind"],
)
RECONCILER_ACTIONS = Counter(
    "offpath_reconciler_actions", "What the reconciler did, by action", ["action"]
)


def job_reached(status: str, reason: str | None = None, n: int = 1) -> None:
    """Count ``n`` jobs that reached ``status`` (``reason``: their reason code)."""
    if n > 0:
        JOBS.labels(str(status), reason or "").inc(n)


def compaction_applied(lag_s: float | None) -> None:
    """Observe one applied compaction's lag (seconds; None: unknown). Its chars saved are
    counted from its usage event, at scrape (:class:`~offpath.coordination.exporter.QueueCollector`)."""
    if lag_s is not None:
        LAG.observe(max(0.0, lag_s))


def summarized(summarizer: str, latency_ms: int, input_tokens: int, output_tokens: int) -> None:
    """Count one summarizer call: its latency (ms) and the tokens its LLM reported."""
    SUMMARIZER_LATENCY.labels(summarizer).observe(max(0, latency_ms) / 1000)
    SUMMARIZER_TOKENS.labels(summarizer, "input").inc(max(0, input_tokens or 0))
    SUMMARIZER_TOKENS.labels(summarizer, "output").inc(max(0, output_tokens or 0))
