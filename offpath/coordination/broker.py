"""Removing a Celery queue from a Redis broker without leaving kombu's bookkeeping behind.

kombu's Redis transport keeps, besides the queue's lists, binding tables: sets
``_kombu.binding.<exchange>`` (and ``_kombu.binding_permanent.<exchange>`` for queues
without ``x-expires``) whose members are ``routing_key\\x06\\x16pattern\\x06\\x16queue``,
plus a sorted set ``_kombu.binding_deadlines`` of exchanges whose tables expire. A
worker's remote-control queue (``<node name>.celery.pidbox`` in ``celery.pidbox``) and
an event receiver's queue (``celeryev.<uuid>`` in ``celeryev``) add members to shared
tables, and a worker that is killed, or a queue that is simply abandoned, leaves them
there for ever. So do the messages a killed worker had not acknowledged (hash
``unacked``, sorted set ``unacked_index``): kombu puts them back in their queue after
the visibility timeout, re-creating it. The demo and the tests use queues of their own
on the user's Redis; :func:`forget_queue` removes one and everything that names it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import redis

TABLE_PREFIX = "_kombu.binding."
PERMANENT_PREFIX = "_kombu.binding_permanent."
DEADLINES_KEY = "_kombu.binding_deadlines"
UNACKED_KEY, UNACKED_INDEX_KEY = "unacked", "unacked_index"  # kombu's defaults
SEP = "\x06\x16"  # kombu.transport.redis.Channel.sep

#: Drops the deadlines of exchanges whose binding table is gone (KEYS[1]: the deadline
#: set, ARGV[1]: the table key prefix). Atomic, so a consumer re-adding its table (the
#: table and its deadline are written together, by a script) is never undone.
_DROP_DEADLINES = """
local dropped = 0
for _, exchange in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    if redis.call('EXISTS', ARGV[1] .. exchange) == 0 then
        redis.call('ZREM', KEYS[1], exchange)
        dropped = dropped + 1
    end
end
return dropped
"""


@dataclass(frozen=True)
class Binding:
    """One member of a binding table."""

    key: str  # the table: _kombu.binding.<exchange> or _kombu.binding_permanent.<exchange>
    exchange: str
    queue: str
    member: bytes


def is_redis(url: str) -> bool:
    return url.startswith(("redis://", "rediss://"))


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)


def _raw(value: bytes | str) -> bytes:
    """A value as the client gives it (bytes: it does not decode responses), as bytes."""
    return value if isinstance(value, bytes) else value.encode()


def bindings(redis_url: str) -> Iterator[Binding]:
    """Every member of every kombu binding table in the Redis database at ``redis_url``."""
    client = _client(redis_url)
    try:
        for prefix in (TABLE_PREFIX, PERMANENT_PREFIX):
            for raw_key in client.scan_iter(match=prefix + "*", count=1000):
                key = _raw(raw_key).decode()
                for member in client.smembers(raw_key):
                    raw = _raw(member)
                    queue = raw.decode(errors="replace").split(SEP)[-1]
                    yield Binding(key, key[len(prefix) :], queue, raw)
    finally:
        client.close()


def unacked(redis_url: str) -> Iterator[tuple[bytes, str]]:
    """(delivery tag, queue) of each message delivered but not acknowledged (the queue is
    the routing key, or the exchange, of a Celery message)."""
    client = _client(redis_url)
    try:
        for tag, raw in client.hscan_iter(UNACKED_KEY, count=1000):
            try:
                _, exchange, routing_key = json.loads(raw)
            except (ValueError, TypeError):
                continue
            yield tag, routing_key or exchange
    finally:
        client.close()


def held_unacked(redis_url: str, task_ids: Iterable[str], before: float) -> dict[str, bytes]:
    """``{task id: delivery tag}`` of those of ``task_ids`` whose message a consumer took
    before ``before`` (unix time, kombu's ``unacked_index`` score) and has not acknowledged:
    the message is in no queue, and kombu gives it back only after the visibility timeout.
    Empty for other brokers."""
    wanted = set(task_ids)
    if not wanted or not is_redis(redis_url):
        return {}
    found: dict[str, bytes] = {}
    client = _client(redis_url)
    try:
        for tag, raw in client.hscan_iter(UNACKED_KEY, count=1000):
            try:
                payload = json.loads(raw)[0]
                task_id = payload["headers"]["id"]
            except (ValueError, TypeError, KeyError, IndexError):
                continue
            if task_id in wanted:
                found[task_id] = tag
        if found:
            with client.pipeline(transaction=False) as pipe:
                for tag in found.values():
                    pipe.zscore(UNACKED_INDEX_KEY, tag)
                taken = pipe.execute()
            found = {
                t: tag
                for (t, tag), at in zip(found.items(), taken, strict=True)
                if at and at < before
            }
    finally:
        client.close()
    return found


def _task_id(raw: bytes) -> str | None:
    """The Celery task id in a kombu message as the Redis transport stores it (in a queue's
    list: the message; in ``unacked``: ``[message, exchange, routing key]``)."""
    try:
        payload = json.loads(raw)
        if isinstance(payload, list):
            payload = payload[0]
        return str(payload["headers"]["id"])
    except (ValueError, TypeError, KeyError, IndexError):
        return None


def in_broker(redis_url: str, queue: str, task_ids: Iterable[str]) -> set[str]:
    """Those of ``task_ids`` whose message the broker still holds: waiting in ``queue`` (any
    of its priority lists) or delivered and not acknowledged. One transaction reads both, so
    a message moving from the queue to a consumer is seen in one of them. Raises the
    client's error if Redis does not answer."""
    wanted = set(task_ids)
    if not wanted or not is_redis(redis_url):
        return set()
    client = _client(redis_url)
    try:
        from kombu.transport.redis import PRIORITY_STEPS  # a list per step (0: the queue's name)

        lists = [queue, *(f"{queue}{SEP}{p}" for p in PRIORITY_STEPS if p)]
        with client.pipeline(transaction=True) as pipe:
            for key in lists:
                pipe.lrange(key, 0, -1)
            pipe.hvals(UNACKED_KEY)
            *queued, taken = pipe.execute()
    finally:
        client.close()
    held = (_task_id(_raw(raw)) for raws in [*queued, taken] for raw in raws)
    return wanted.intersection(held)


def drop_unacked(redis_url: str, tag: bytes) -> bool:
    """Remove the unacknowledged message ``tag`` (hash ``unacked`` and its index), so kombu
    never gives it back; True if this call removed it (False: acknowledged or given back
    meanwhile)."""
    client = _client(redis_url)
    try:
        pipe = client.pipeline()
        pipe.hdel(UNACKED_KEY, tag)
        pipe.zrem(UNACKED_INDEX_KEY, tag)
        removed, _ = pipe.execute()
    finally:
        client.close()
    return bool(removed)


def forget_queue(redis_url: str, queue: str, also_matching: Iterable[str] = ()) -> int:
    """Delete ``queue`` (a Celery queue: direct exchange and routing key of the same name)
    and its messages from the Redis broker at ``redis_url``, and every binding-table
    member that names it or whose queue name contains one of ``also_matching`` (e.g. a
    worker's node name, for its ``<node>.celery.pidbox`` queue). Sets left empty go
    (Redis drops them), and so do deadlines of tables no longer there, and the queue's
    unacknowledged messages.

    Returns how many members were removed besides the queue's own. Does nothing for
    other brokers. Raises the client's error if Redis does not answer.
    """
    if not is_redis(redis_url):
        return 0
    from kombu import Connection, Exchange, Queue

    tags = [tag for tag, name in unacked(redis_url) if name == queue]
    if tags:  # before the queue goes: kombu would put them back in it
        client = _client(redis_url)
        try:
            pipe = client.pipeline()
            pipe.hdel(UNACKED_KEY, *tags)
            pipe.zrem(UNACKED_INDEX_KEY, *tags)
            pipe.execute()
        finally:
            client.close()
    # through kombu: it unbinds what it declares and drops the priority lists
    with Connection(redis_url, connect_timeout=2) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.2)
        bound = Queue(queue, Exchange(queue, type="direct"), routing_key=queue)(
            conn.default_channel
        )
        bound.declare()
        bound.delete()
    needles = [n for n in also_matching if n]
    doomed: dict[str, list[bytes]] = {}
    for b in bindings(redis_url):
        if b.exchange == queue or b.queue == queue or any(n in b.queue for n in needles):
            doomed.setdefault(b.key, []).append(b.member)
    client = _client(redis_url)
    try:
        for key, members in doomed.items():
            client.srem(key, *members)
        client.eval(_DROP_DEADLINES, 1, DEADLINES_KEY, TABLE_PREFIX)
    finally:
        client.close()
    return sum(len(m) for m in doomed.values())
