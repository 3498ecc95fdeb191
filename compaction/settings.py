"""All settings, in one place (pydantic-settings, read from the environment and ``.env``).

The seed's names stay as they are (``SUMMARIZATION_ENABLED``,
``SUMMARIZATION_THRESHOLD_CHARS``, ``SUMMARIZATION_KEEP_CHARS``); where the
ecosystem has a name we use it (``OPENAI_API_KEY``, ``OPENAI_BASE_URL``,
``REDIS_URL``, ``DATABASE_URL``). Every setting is listed in ``.env.example``.

A bad combination fails at start-up with :class:`SettingsError`, whose message
names the setting (issue 2, item 1).
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Literal

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: The smallest prompt budget that still fits the instructions and a few messages.
MIN_PROMPT_CHARS = 4_000


class SettingsError(ValueError):
    """A setting is missing, malformed or inconsistent; the message names it."""


class Settings(BaseSettings):
    """Service settings. Units are in the names: ``_chars``, ``_s`` (seconds), ``_ms``."""

    model_config = SettingsConfigDict(
        env_file=".env", env_file_encoding="utf-8", extra="ignore", case_sensitive=False
    )

    # --- compaction (the seed) -------------------------------------------------------
    summarization_enabled: bool = True
    summarization_threshold_chars: int = 60_000
    summarization_keep_chars: int = 20_000
    summarization_max_prompt_chars: int = 60_000

    # --- summarizer LLM ----------------------------------------------------------------
    summarization_model: str = "gpt-4o-mini"
    openai_api_key: SecretStr | None = None
    openai_base_url: str | None = None
    summarization_timeout_s: float = Field(default=60.0, gt=0)
    summarization_max_retries: int = Field(default=2, ge=0)
    summarization_max_output_tokens: int = Field(default=1_024, gt=0)
    #: Model of the chat agent behind ``POST /sessions/{id}/messages``.
    chat_model: str = "gpt-4o-mini"

    # --- infrastructure ----------------------------------------------------------------
    redis_url: str = "redis://localhost:6379/0"
    #: Empty: SQLite files under ``data_dir``. ``postgresql://...``: PostgreSQL.
    database_url: str = ""
    data_dir: str = "./data"
    #: Broker URL for Celery; empty means ``redis_url``.
    celery_broker_url: str = ""
    #: Where thread locks and job claims live: "redis" (REDIS_URL) or "database" (the usage DB;
    #: for the embedded demo, one machine only).
    lock_backend: Literal["redis", "database"] = "redis"
    publish_timeout_s: float = Field(default=1.0, gt=0)
    lock_timeout_s: float = Field(default=120.0, gt=0)
    lock_wait_s: float = Field(default=10.0, ge=0)
    job_soft_time_limit_s: int = Field(default=240, gt=0)
    job_time_limit_s: int = Field(default=300, gt=0)
    job_max_retries: int = Field(default=3, ge=0)
    job_retry_backoff_s: int = Field(default=2, ge=0)
    job_retry_backoff_max_s: int = Field(default=60, gt=0)
    celery_visibility_timeout_s: int = Field(default=3_600, gt=0)
    celery_queue: str = "compaction"
    redis_key_prefix: str = "offpath"
    worker_pool: Literal["threads", "prefork", "solo"] = "threads"
    worker_concurrency: int = Field(default=64, gt=0)
    max_turn_messages: int = Field(default=10_000, gt=0)
    max_message_chars: int = Field(default=2_000_000, gt=0)
    flower_basic_auth: str = ""
    flower_port: int = 5555
    api_url: str = "http://127.0.0.1:8000"
    log_level: str = "INFO"

    @model_validator(mode="after")
    def _check(self) -> Settings:
        for name in (
            "summarization_threshold_chars",
            "summarization_keep_chars",
            "summarization_max_prompt_chars",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name.upper()} must be 0 or more, got {getattr(self, name)}")
        threshold = self.summarization_threshold_chars
        keep = self.summarization_keep_chars
        if threshold and keep >= threshold:
            raise ValueError(
                f"SUMMARIZATION_KEEP_CHARS ({keep}) must be smaller than "
                f"SUMMARIZATION_THRESHOLD_CHARS ({threshold})"
            )
        if self.summarization_max_prompt_chars < MIN_PROMPT_CHARS:
            raise ValueError(
                f"SUMMARIZATION_MAX_PROMPT_CHARS ({self.summarization_max_prompt_chars}) "
                f"must be at least {MIN_PROMPT_CHARS}"
            )
        url = self.database_url.strip()
        if url and not url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
            raise ValueError(
                f"DATABASE_URL must be empty (SQLite files under DATA_DIR) or a PostgreSQL URL "
                f"(postgresql://user@host:5432/db), got {url.split('://')[0]}://..."
            )
        for pair in filter(None, self.flower_basic_auth.split(",")):
            user, sep, password = pair.partition(":")
            if not (user and sep and password):
                raise ValueError(
                    "FLOWER_BASIC_AUTH must be user:password (several: a,b separated by commas)"
                )
        if self.celery_visibility_timeout_s <= self.job_time_limit_s:
            raise ValueError(
                f"CELERY_VISIBILITY_TIMEOUT_S ({self.celery_visibility_timeout_s}) must be longer "
                f"than JOB_TIME_LIMIT_S ({self.job_time_limit_s}), or running jobs are redelivered"
            )
        if self.job_soft_time_limit_s >= self.job_time_limit_s:
            raise ValueError(
                f"JOB_SOFT_TIME_LIMIT_S ({self.job_soft_time_limit_s}) must be smaller than "
                f"JOB_TIME_LIMIT_S ({self.job_time_limit_s})"
            )
        return self

    @property
    def active(self) -> bool:
        """Compaction is on: enabled and a non-zero threshold (the seed: 0 disables)."""
        return self.summarization_enabled and self.summarization_threshold_chars > 0

    @property
    def llm_configured(self) -> bool:
        """An LLM endpoint is configured: an API key or a base URL is set."""
        return bool(self.openai_base_url) or bool(
            self.openai_api_key and self.openai_api_key.get_secret_value()
        )


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment and ``.env``; ``overrides`` win.

    ``OFFPATH_ENV_FILE`` names another file to read instead of ``.env`` (empty: none;
    the tests use that so a developer's ``.env`` cannot leak into them). Raises
    :class:`SettingsError` with one line per bad setting, naming it.
    """
    env_file = os.environ.get("OFFPATH_ENV_FILE", ".env") or None
    try:
        return Settings(_env_file=env_file, **overrides)  # type: ignore[arg-type,call-arg]
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err.get("loc", ())).upper()
            msg = str(err.get("msg", "")).removeprefix("Value error, ")
            lines.append(f"{loc}: {msg}" if loc else msg)
        raise SettingsError("invalid settings: " + "; ".join(lines)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return load_settings()
