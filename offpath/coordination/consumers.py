"""Which workers consume each queue: ``GET /readyz`` and
``offpath_queue_consumers`` on the API's ``/metrics``.

The workers are asked through the broker with Celery's remote control
(``app.control.inspect().active_queues()``: a broadcast each live worker answers with the
queues it consumes), waiting :data:`ASK_TIMEOUT_S` for the answers. An answer is kept
:data:`CACHE_S` (:class:`ConsumerWatch`), so a probe or a scrape costs a dictionary read
most of the time and at most one broadcast per :data:`CACHE_S` per API process, whatever
the number of callers. A broker that cannot broadcast (the embedded demo's SQLAlchemy
transport has no fanout exchange) gives ``unknown``: nothing to report, nothing failed.

The rule (:func:`readiness`) is pure: a queue offpath publishes to with no worker
consuming it, or a broker that could not be asked, is not ready, and the message says
which queue, on which broker, and what to do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from offpath.compaction.settings import Settings

log = logging.getLogger("offpath.consumers")

#: How long (s) the API waits for the workers' answers to one broadcast: a live worker
#: answers in milliseconds (its consumer thread does, whatever its jobs are doing).
ASK_TIMEOUT_S = 1.0
#: How long (s) an answer is reused before the workers are asked again.
CACHE_S = 10.0


@dataclass(frozen=True, slots=True)
class Consumers:
    """What the workers answered: ``queues`` maps each queue to the workers consuming it
    (their Celery node names). ``error``: the broker could not be asked (``queues`` is then
    empty). ``supported``: False when the broker cannot broadcast (nothing is known).
    ``at``: when they were asked (``time.time()``)."""

    queues: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    error: str | None = None
    supported: bool = True
    at: float = 0.0

    def count(self, queue: str) -> int:
        """Workers consuming ``queue``."""
        return len(self.queues.get(queue, ()))


def from_active_queues(answer: Mapping[str, Sequence[Mapping[str, Any]]] | None) -> dict:
    """``{queue: (worker, ...)}`` from ``inspect().active_queues()``'s answer
    (``{worker: [{"name": queue, ...}, ...]}``; None when no worker answered)."""
    queues: dict[str, list[str]] = {}
    for worker, entries in sorted((answer or {}).items()):
        for entry in entries or ():
            name = entry.get("name") if isinstance(entry, Mapping) else None
            if name:
                queues.setdefault(str(name), []).append(str(worker))
    return {q: tuple(sorted(set(ws))) for q, ws in queues.items()}


def readiness(
    consumers: Consumers, queues: Sequence[str], broker: str
) -> tuple[bool, dict[str, Any], str]:
    """Whether the workers are ready to run the jobs offpath publishes to ``queues``:
    ``(ok, {queue: {"consumers": n, "workers": [...]}}, message)``. Not ready when the
    broker (``broker``, shown without its password) could not be asked, or when a queue has
    no consumer; ready, with an ``unknown`` message, when the broker cannot broadcast."""
    from kombu.utils.url import sanitize_url

    where = sanitize_url(broker)
    if not consumers.supported:
        return True, {}, f"unknown: the broker at {where} cannot ask workers (no broadcast)"
    if consumers.error is not None:
        message = f"could not ask the workers through the broker at {where}: {consumers.error}"
        return False, {}, message
    found = {
        q: {"consumers": consumers.count(q), "workers": list(consumers.queues.get(q, ()))}
        for q in queues
    }
    idle = [q for q in queues if not consumers.count(q)]
    if idle:
        names = ", ".join(repr(q) for q in idle)
        message = (
            f"no worker consumes queue {names} on the broker at {where}: compaction jobs "
            "wait there until one does (start `offpath worker` with the same CELERY_QUEUE "
            "and broker)"
        )
        return False, found, message
    workers = sorted({w for q in queues for w in consumers.queues.get(q, ())})
    return True, found, f"ok: {len(workers)} worker(s) consume {', '.join(queues)}"


Asker = Callable[[], Consumers]


def celery_asker(settings: Settings, timeout_s: float = ASK_TIMEOUT_S) -> Asker:
    """Ask the workers on ``settings``' broker (one Celery app, made once)."""
    from kombu import Connection

    url = settings.broker_url
    if "fanout" not in Connection(url).transport.implements.exchange_type:
        return lambda: Consumers(supported=False, at=time.time())
    from offpath.coordination.queue import make_celery

    app = make_celery(settings)

    def ask() -> Consumers:
        at = time.time()
        try:
            with app.connection_for_write() as conn:
                answer = app.control.inspect(timeout=timeout_s, connection=conn).active_queues()
        except Exception as exc:
            return Consumers(error=f"{type(exc).__name__}: {exc}"[:300], at=at)
        return Consumers(queues=from_active_queues(answer), at=at)

    return ask


def holding(
    settings: Settings, task_ids: Sequence[str], timeout_s: float = ASK_TIMEOUT_S
) -> set[str] | None:
    """Which of ``task_ids`` a live worker on ``settings``' broker holds (reserved, waiting
    for its countdown, or running), asked with ``inspect().query_task`` (each worker answers
    for its own); None if the broker could not be asked. A worker that does not answer
    within ``timeout_s`` counts as holding nothing."""
    from offpath.coordination.queue import app_for

    app = app_for(settings)
    try:
        with app.connection_for_write() as conn:
            answer = app.control.inspect(timeout=timeout_s, connection=conn).query_task(*task_ids)
    except Exception as exc:
        log.warning("workers could not be asked which jobs they hold: %s", exc)
        return None
    return {task_id for tasks in (answer or {}).values() for task_id in (tasks or {})}


class ConsumerWatch:
    """The latest :class:`Consumers`, asked again once older than ``cache_s``. One ask at a
    time: a caller that finds one in flight gets the previous answer (or, before the first,
    waits for it)."""

    def __init__(self, ask: Asker, cache_s: float = CACHE_S) -> None:
        self.ask = ask
        self.cache_s = cache_s
        self._last: Consumers | None = None
        self._asking = threading.Lock()

    def get(self) -> Consumers:
        last = self._last
        if last is not None and time.time() - last.at < self.cache_s:
            return last
        if not self._asking.acquire(blocking=last is None):
            return last  # type: ignore[return-value]  # another caller is asking now
        try:
            last = self._last
            if last is None or time.time() - last.at >= self.cache_s:
                last = self._last = self.ask()
                if last.error:
                    log.warning(
                        "workers could not be asked which queues they consume: %s", last.error
                    )
            return last
        finally:
            self._asking.release()


_watches: dict[tuple[str, str], ConsumerWatch] = {}
_guard = threading.Lock()


def watch_for(settings: Settings) -> ConsumerWatch:
    """The process's :class:`ConsumerWatch` of ``settings``' broker and queue."""
    key = (settings.broker_url, settings.celery_queue)
    with _guard:
        if key not in _watches:
            _watches[key] = ConsumerWatch(celery_asker(settings))
        return _watches[key]
