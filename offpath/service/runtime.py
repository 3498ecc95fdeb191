"""The process-wide runtime: settings, checkpointer, compiled graph, usage DB, Redis, locks.

The API opens one at start-up; each worker process opens one on its first job.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis
from langchain_core.language_models import BaseChatModel
from langgraph.graph.state import CompiledStateGraph
from sqlalchemy.engine import Engine

from offpath.compaction.settings import Settings
from offpath.service.agent import build_graph
from offpath.service.checkpoints import Checkpoints, open_checkpoints
from offpath.service.db import make_engine, migrate
from offpath.service.leases import Leases, RedisKeyStore, SqlKeyStore
from offpath.service.locks import DatabaseLocks, Locks, ThreadLocks

log = logging.getLogger("offpath.runtime")


def redis_client(url: str, settings: Settings) -> redis.Redis:
    """A redis-py client whose calls fail within ``PUBLISH_TIMEOUT_S`` when Redis is away."""
    timeout = settings.publish_timeout_s
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=timeout,
        socket_timeout=max(timeout, 5.0),
        health_check_interval=30,
    )


def chat_model(settings: Settings) -> BaseChatModel | None:
    """The chat agent's model, or None when no LLM is configured."""
    if not settings.llm_configured:
        return None
    from langchain_openai import ChatOpenAI

    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    return ChatOpenAI(
        model=settings.chat_model,
        api_key=key or "not-needed",
        base_url=settings.openai_base_url or None,
        timeout=settings.summarization_timeout_s,
        max_retries=1,
    )


@dataclass
class Runtime:
    settings: Settings
    checkpoints: Checkpoints
    graph: CompiledStateGraph
    engine: Engine
    locks: Locks
    leases: Leases

    @classmethod
    def open(cls, settings: Settings, *, run_migrations: bool = True) -> Runtime:
        if run_migrations:
            migrate(settings)
        checkpoints = open_checkpoints(settings)
        engine = make_engine(settings)
        locks: Locks
        if settings.lock_backend == "database":
            locks = DatabaseLocks(
                engine, timeout_s=settings.lock_timeout_s, wait_s=settings.lock_wait_s
            )
            store: RedisKeyStore | SqlKeyStore = SqlKeyStore(engine)
        else:
            client = redis_client(settings.redis_url, settings)
            locks = ThreadLocks(
                client,
                timeout_s=settings.lock_timeout_s,
                wait_s=settings.lock_wait_s,
                prefix=settings.redis_key_prefix,
            )
            store = RedisKeyStore(client)
        leases = Leases(
            store,
            prefix=settings.redis_key_prefix,
            lease_s=settings.job_lease_s,
            # a queued job's claim lasts as long as the broker may take to hand it out
            queued_ttl_s=settings.celery_visibility_timeout_s,
        )
        return cls(
            settings=settings,
            checkpoints=checkpoints,
            graph=build_graph(checkpoints.saver, chat_model(settings)),
            engine=engine,
            locks=locks,
            leases=leases,
        )

    def ping_broker(self) -> None:
        """Raise if the Celery broker does not answer within ``PUBLISH_TIMEOUT_S``."""
        url = self.settings.celery_broker_url or self.settings.redis_url
        if url.startswith(("redis://", "rediss://")):
            client = redis_client(url, self.settings)
            try:
                client.ping()
            finally:
                client.close()
            return
        from kombu import Connection

        with Connection(url, connect_timeout=self.settings.publish_timeout_s) as conn:
            conn.ensure_connection(max_retries=1)

    def close(self) -> None:
        redis_conn = getattr(self.locks, "redis", None)
        closers = [self.checkpoints.close, self.engine.dispose] + (
            [redis_conn.close] if redis_conn else []
        )
        for closer in closers:
            try:
                closer()
            except Exception as exc:  # closing is best effort
                log.debug("close failed: %s", exc)
