"""What the tests (and the demo they run) may leave in their Redis database (issue 8,
item 12): members of kombu's ``_kombu.binding*`` tables naming a test queue
(``test-<hex>``, ``demo-<hex>``), a test worker (``w-<hex>-N@host.celery.pidbox``,
``demo-<hex>@host...``) or Flower's receivers (``celeryev.<uuid>``,
``<uuid>.reply.celery.pidbox``), and unacknowledged messages of a test queue, once
nothing that uses them runs any more.

Another test session may share the database: a name still found in a running process's
command line or environment (its workers, its API), or any Flower still running, keeps
its bindings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import psutil

from offpath.coordination.broker import UNACKED_KEY, Binding, bindings, forget_queue, unacked

TOKEN = re.compile(r"^(?:test|demo|w)-([0-9a-f]{6,})")
FLOWER_QUEUE = re.compile(r"celeryev\.[0-9a-f-]{36}|[0-9a-f-]{36}\.reply\.celery\.pidbox")
#: A remote-control reply queue: Flower's, or any process's that asked the workers (the
#: reconciler, the API's readiness); one killed during its ask leaves it bound.
REPLY_QUEUE = re.compile(r"[0-9a-f-]{36}\.reply\.celery\.pidbox")


def _running() -> tuple[str, bool]:
    """Command lines and environments of the processes we may read, as one text; and
    whether a Flower runs (``celery ... flower`` or ``offpath flower``)."""
    parts, flower = [], False
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or []
            flower = flower or "flower" in cmdline
            parts.append(" ".join(cmdline))
            parts.extend(f"{k}={v}" for k, v in proc.environ().items())
        except (psutil.Error, OSError):
            continue
    return "\n".join(parts), flower


def everything(redis_url: str) -> list[Binding]:
    """Every binding-table member, and every unacknowledged message (as a member of
    ``unacked`` whose queue is its routing key)."""
    found = list(bindings(redis_url))
    found += [Binding(UNACKED_KEY, "", queue, tag) for tag, queue in unacked(redis_url)]
    return found


def abandoned(redis_url: str) -> list[Binding]:
    """Test bindings (and messages) in ``redis_url``'s database no running process uses."""
    running, flower_runs = _running()
    found = []
    for b in everything(redis_url):
        token = TOKEN.match(b.queue) or TOKEN.match(b.exchange)
        if token:
            if token.group(1) not in running:
                found.append(b)
        elif FLOWER_QUEUE.fullmatch(b.queue) and not flower_runs:
            found.append(b)
    return found


def forget(redis_url: str, found: Iterable[Binding]) -> None:
    for queue in sorted({b.queue for b in found}):
        forget_queue(redis_url, queue)
