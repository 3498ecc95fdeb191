"""What offpath exports to Prometheus beyond its counters (:mod:`offpath.metrics` defines
every series and documents them): the gauges and totals the API's ``GET /metrics`` reads
at scrape time from the broker and the usage tables (:class:`QueueCollector`), and each
worker's own metrics server (:func:`serve_worker_metrics`)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("offpath.metrics")

#: The series :class:`QueueCollector` reads at scrape time (the API's ``/metrics`` only).
READ_AT_SCRAPE = (
    "offpath_queue_depth",
    "offpath_queue_consumers",
    "offpath_jobs_open",
    "offpath_compactions_total",
    "offpath_chars_saved_total",
    "offpath_compactions_reverted_total",
    "offpath_chars_restored_total",
    "offpath_fallback_maskings_total",
    "offpath_summaries_paid_total",
    "offpath_summaries_dropped_total",
)


class QueueCollector(Collector):
    """``offpath_queue_depth`` and ``offpath_queue_consumers`` from the broker;
    ``offpath_jobs_open``, ``offpath_compactions_total``, ``offpath_chars_saved_total``,
    ``offpath_compactions_reverted_total``, ``offpath_chars_restored_total``,
    ``offpath_fallback_maskings_total``, ``offpath_summaries_paid_total`` and
    ``offpath_summaries_dropped_total`` from the usage database; read when Prometheus
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
            from offpath.stores.usage.totals import open_job_counts, recorded_totals

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
                "offpath_compactions_reverted",
                "compactions_reverted",
                "Applied compactions reverted since (offpath_compactions - this: the compactions "
                "in force, /stats' applied jobs)",
            ),
            (
                "offpath_chars_restored",
                "chars_restored",
                "Real reduction of the reverted compactions, given back to their threads "
                "(offpath_chars_saved - this: /stats' total_chars_compacted)",
            ),
            (
                "offpath_fallback_maskings",
                "fallback_maskings",
                "Model calls over CONTEXT_HARD_LIMIT_CHARS with no summary ready (old tool "
                "results masked), by any process, from the usage tables",
            ),
            (
                "offpath_summaries_paid",
                "summaries_paid",
                "Summaries prepared (paid for): applied, waiting for their thread "
                '(offpath_jobs_open{status="prepared"}) or dropped, from the job rows',
            ),
            (
                "offpath_summaries_dropped",
                "summaries_dropped",
                "Summaries prepared and ended without being applied (stale, expired, "
                "superseded), from the job rows: paid for and never used",
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
        from offpath.stores.usage.totals import open_job_counts

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
