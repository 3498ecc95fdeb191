"""offpath's own Prometheus metrics (prometheus-client), defined in one place.

Counters and histograms live in the process that did the work; scrape every process
and ``sum()`` across them:

* the API (``GET /metrics``): what the post-turn hook and the chat runs' middleware did
  (jobs queued, compactions applied during a run), plus what :class:`QueueCollector`
  reads at scrape time: the queue depth and its consumers from the broker, the open jobs,
  and the compactions, chars saved and fallback maskings of every process from the
  usage tables (a team's own agent's middleware writes its rows there and serves no
  metrics of its own; issue 21, item 6). Every API replica reads the same tables:
  aggregate those with ``max()``, not ``sum()``;
* each worker (its own port, ``WORKER_METRICS_PORT``, default 9808; 0: off; see
  :func:`serve_worker_metrics`): jobs run, summarizer latency and tokens, compactions
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
``offpath_reconciler_actions_total``      counter    ``action``
``offpath_api_event_loop_lag_seconds``    histogram  the API's event loop waking late (sampled
                                                     every 50 ms): how long no request could be
                                                     served
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
import os
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

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
    counted from its usage event, at scrape (:class:`QueueCollector`)."""
    if lag_s is not None:
        LAG.observe(max(0.0, lag_s))


def summarized(summarizer: str, latency_ms: int, input_tokens: int, output_tokens: int) -> None:
    """Count one summarizer call: its latency (ms) and the tokens its LLM reported."""
    SUMMARIZER_LATENCY.labels(summarizer).observe(max(0, latency_ms) / 1000)
    SUMMARIZER_TOKENS.labels(summarizer, "input").inc(max(0, input_tokens or 0))
    SUMMARIZER_TOKENS.labels(summarizer, "output").inc(max(0, output_tokens or 0))


# --- gauges read at scrape time ---------------------------------------------------------------


#: The series :class:`QueueCollector` reads at scrape time (the API's ``/metrics`` only).
READ_AT_SCRAPE = (
    "offpath_queue_depth",
    "offpath_queue_consumers",
    "offpath_jobs_open",
    "offpath_compactions_total",
    "offpath_chars_saved_total",
    "offpath_fallback_maskings_total",
)


class QueueCollector(Collector):
    """``offpath_queue_depth`` and ``offpath_queue_consumers`` from the broker;
    ``offpath_jobs_open``, ``offpath_compactions_total``, ``offpath_chars_saved_total`` and
    ``offpath_fallback_maskings_total`` from the usage database; read when Prometheus
    scrapes (registered by the API only).

    Queue depth: the Redis list(s) kombu keeps the queue in (``LLEN``), or RabbitMQ's
    message count (a passive declare); another broker (the demo's SQLAlchemy transport):
    the jobs queued and published but not started, from the database. Consumers: the
    workers' answer to a broadcast, cached (:func:`offpath.coordination.consumers.watch_for`;
    left out for a broker that cannot broadcast). A store that does not answer leaves its
    metrics out of that scrape (logged at debug level).
    """

    def __init__(self, client: Any) -> None:
        self.client = client  # an offpath.coordination.runtime.Client

    def describe(self) -> list[Any]:
        return []  # read at scrape time only: no call to the stores at registration

    def collect(self) -> Iterator[Any]:
        settings = self.client.settings
        queue = settings.celery_queue
        depth = GaugeMetricFamily(
            "offpath_queue_depth", "Compaction jobs waiting in the broker", labels=["queue"]
        )
        try:
            depth.add_metric([queue], float(self._depth(queue)))
            yield depth
        except Exception as exc:
            log.debug("queue depth unavailable: %s", exc)
        yield from self._consumers(settings)
        try:
            from offpath.stores.usage import open_job_counts, recorded_totals

            counts = open_job_counts(self.client.engine)
            totals = recorded_totals(self.client.engine)
        except Exception as exc:
            log.debug("open jobs unavailable: %s", exc)
            return
        gauge = GaugeMetricFamily(
            "offpath_jobs_open", "Job rows not ended yet, by status", labels=["status"]
        )
        for status in ("queued", "running", "prepared"):
            gauge.add_metric([status], float(counts.get(status, 0)))
        yield gauge
        for name, key, doc in (
            (
                "offpath_compactions",
                "compactions",
                "Compactions applied by any process (a team's own agent's middleware too), "
                "from the usage events",
            ),
            (
                "offpath_chars_saved",
                "chars_saved",
                "Real reduction of the applied compactions (thread size before - after, "
                "chars), from the usage events",
            ),
            (
                "offpath_fallback_maskings",
                "fallback_maskings",
                "Model calls over CONTEXT_HARD_LIMIT_CHARS with no summary ready (old tool "
                "results masked), by any process, from the usage tables",
            ),
        ):
            yield CounterMetricFamily(name, doc, value=float(totals[key]))

    def _consumers(self, settings: Any) -> Iterator[Any]:
        from offpath.coordination.consumers import watch_for

        try:
            found = watch_for(settings).get()
        except Exception as exc:
            log.debug("queue consumers unavailable: %s", exc)
            return
        if not found.supported or found.error is not None:
            return
        gauge = GaugeMetricFamily(
            "offpath_queue_consumers", "Workers consuming the queue", labels=["queue"]
        )
        for queue in sorted({settings.celery_queue, *found.queues}):
            gauge.add_metric([queue], float(found.count(queue)))
        yield gauge

    def _depth(self, queue: str) -> int:
        settings = self.client.settings
        url = settings.broker_url
        if settings.broker_is_redis:
            from offpath.coordination.broker import SEP
            from offpath.coordination.runtime import redis_client

            client = redis_client(url, settings)
            try:
                # kombu keeps priorities 0 (the queue's own name) and 3, 6, 9 apart
                names = [queue] + [f"{queue}{SEP}{p}" for p in (3, 6, 9)]
                pipe = client.pipeline()
                for name in names:
                    pipe.llen(name)
                return int(sum(pipe.execute()))
            finally:
                client.close()
        if url.startswith(("amqp://", "amqps://", "pyamqp://")):
            from kombu import Connection

            with Connection(url, connect_timeout=settings.publish_timeout_s) as conn:
                ok = conn.default_channel.queue_declare(queue=queue, passive=True)
                return int(ok.message_count)
        from offpath.stores.usage import open_job_counts

        return int(open_job_counts(self.client.engine, published_only=True).get("queued", 0))


_registered: set[int] = set()
_guard = threading.Lock()


def register_queue_collector(client: Any, registry: CollectorRegistry = REGISTRY) -> None:
    """Register a :class:`QueueCollector` for ``client`` (once per registry: the API's
    lifespan may run more than once in one process, as in tests)."""
    with _guard:
        for collector in list(getattr(registry, "_collector_to_names", {})):
            if isinstance(collector, QueueCollector):
                collector.client = client  # the newest runtime: the old one is closed
                return
        registry.register(QueueCollector(client))


def serve_worker_metrics(host: str, port: int) -> bool:
    """Serve this worker's metrics on ``host:port`` (``WORKER_METRICS_HOST`` /
    ``WORKER_METRICS_PORT``; 0: off). With ``PROMETHEUS_MULTIPROC_DIR`` set (a prefork
    pool: one process per job slot), the children's metrics are merged
    (prometheus-client's multiprocess mode). Returns whether it serves; a port in use
    (another worker on this machine) is logged, never fatal."""
    if port <= 0:
        return False
    registry: CollectorRegistry = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    with _guard:
        if port in _registered:
            return True
        try:
            start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            log.warning(
                "worker metrics not served on %s:%d (%s): set WORKER_METRICS_PORT to a free "
                "port per worker on this machine, or 0",
                host,
                port,
                exc,
            )
            return False
        _registered.add(port)
    log.info("worker metrics on http://%s:%d/metrics", host, port)
    return True
