"""Redis must keep every key offpath writes.

A job's lease on its thread, the thread locks and the broker's queued jobs are Redis
keys. A Redis under ``maxmemory`` with an evicting ``maxmemory-policy`` (``allkeys-lru``,
``volatile-ttl``...: anything but ``noeviction``; the ``volatile-*`` ones evict exactly
the keys with a TTL, which leases are) drops them silently when memory runs short: a
lease evicted mid-job let a second summarizer call for the same thread start while the
first was in flight (the shape of bullmq#2215), and an evicted queue loses jobs.

:func:`check_eviction` runs at the start of the API and of each worker: it logs a
WARNING for every Redis offpath uses whose policy evicts (``REDIS_EVICTION_CHECK=warn``,
the default) or raises :class:`EvictingRedis` (``refuse``). A Redis it cannot ask
(unreachable, or ``CONFIG`` disabled, as on some managed services) is logged and passed.
"""

from __future__ import annotations

import logging

import redis
from kombu.utils.url import sanitize_url

from offpath.compaction.settings import Settings

log = logging.getLogger("offpath.redis")

#: The only policy under which Redis never drops a key.
SAFE_POLICY = "noeviction"


class EvictingRedis(RuntimeError):
    """A Redis offpath uses may evict keys and ``REDIS_EVICTION_CHECK=refuse``."""


def redis_urls(settings: Settings) -> dict[str, list[str]]:
    """The Redis URLs offpath uses, with what each holds (locks and leases, broker)."""
    urls: dict[str, list[str]] = {}
    if settings.lock_backend == "redis":
        urls.setdefault(settings.redis_url, []).append("locks and leases")
    if settings.broker_is_redis:
        urls.setdefault(settings.broker_url, []).append("broker")
    return urls


def policy_of(url: str) -> tuple[str, int] | None:
    """``(maxmemory-policy, maxmemory)`` of the Redis at ``url``; None if it cannot be
    asked (unreachable, or ``CONFIG GET`` refused)."""
    client = redis.Redis.from_url(url, socket_timeout=3, socket_connect_timeout=3)
    try:
        found = client.config_get("maxmemory*")
    except redis.RedisError as exc:
        log.info("could not read maxmemory-policy of %s: %s", sanitize_url(url), exc)
        return None
    finally:
        client.close()
    return str(found.get("maxmemory-policy", "")), int(found.get("maxmemory", 0) or 0)


def check_eviction(settings: Settings, process: str) -> list[str]:
    """Warn about (or, with ``REDIS_EVICTION_CHECK=refuse``, raise :class:`EvictingRedis`
    for) each Redis of ``settings`` whose ``maxmemory-policy`` is not ``noeviction``;
    returns the problems found (one line each). ``process`` names the caller in the log."""
    problems = []
    for url, roles in redis_urls(settings).items():
        found = policy_of(url)
        if found is None or found[0] == SAFE_POLICY:
            continue
        policy, maxmemory = found
        problems.append(
            f"Redis at {sanitize_url(url)} ({' and '.join(roles)}) has maxmemory-policy "
            f"{policy} (maxmemory {maxmemory} bytes): it may evict a running job's lease or a "
            f"queued job; set maxmemory-policy {SAFE_POLICY} (CONFIG SET maxmemory-policy "
            f"{SAFE_POLICY}, or in redis.conf)"
        )
    for problem in problems:
        if settings.redis_eviction_check == "refuse":
            raise EvictingRedis(f"{process} not started: {problem} (REDIS_EVICTION_CHECK=refuse)")
        log.warning(
            "%s: %s (REDIS_EVICTION_CHECK=refuse stops %s instead)", process, problem, process
        )
    return problems
