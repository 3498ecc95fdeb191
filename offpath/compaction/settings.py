"""All settings, in one place: their names, defaults and rules, as a plain pydantic model.

Loading them is not done here (the core does no I/O): :mod:`offpath.config` reads them from
the environment, ``.env`` and ``/run/secrets`` into this model.

The seed's names stay as they are (``SUMMARIZATION_ENABLED``,
``SUMMARIZATION_THRESHOLD_CHARS``, ``SUMMARIZATION_KEEP_CHARS``); where the
ecosystem has a name we use it (``OPENAI_API_KEY``, ``OPENAI_BASE_URL``,
``REDIS_URL``, ``DATABASE_URL``). Every setting is listed in ``.env.example``.

A bad combination fails at start-up with :class:`SettingsError`, whose message
names the setting.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from offpath.compaction.tokens import DEFAULT_CHARS_PER_TOKEN, threshold_chars

#: The smallest prompt budget that still fits the instructions and a few messages.
MIN_PROMPT_CHARS = 4_000

#: The fewest chars a shortened tool result keeps (head, tail, facts, the recall line).
MIN_SHORTENED_CHARS = 1_000


class SettingsError(ValueError):
    """A setting is missing, malformed or inconsistent; the message names it."""


#: A tenant's name (``OWN_AGENT_TENANT``, ``keys create --tenant``, the middleware's
#: ``tenant``): 1-64 letters, digits or ``. _ -`` (an API key can be made for it).
TENANT_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
#: :data:`TENANT_PATTERN` in words (what an error says).
TENANT_RULE = "1-64 letters, digits or . _ -"
#: How a PostgreSQL URL starts (``DATABASE_URL``, a checkpointer's).
POSTGRES_SCHEMES = ("postgresql://", "postgres://", "postgresql+psycopg://")
#: The checkpointer URLs a worker can open (a user's own agent's): PostgreSQL or SQLite.
CHECKPOINTER_SCHEMES = (*POSTGRES_SCHEMES, "sqlite:///")


LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
#: ``API_URL``'s default and the form it must have (the server's settings and a client's).
DEFAULT_API_URL = "http://127.0.0.1:8000"
API_URL_PATTERN = r"^https?://\S+$"


class Settings(BaseModel):
    """Service settings. Units are in the names: ``_chars``, ``_s`` (seconds), ``_ms``.

    Every field is validated by its type (bounds, ``Literal`` choices, URL schemes);
    settings that contradict each other fail together, naming both.
    """

    model_config = ConfigDict(extra="ignore", arbitrary_types_allowed=True, validate_default=True)

    # --- compaction (the seed) -------------------------------------------------------
    summarization_enabled: bool = True
    summarization_threshold_chars: int = Field(default=60_000, ge=0)
    summarization_keep_chars: int = Field(default=20_000, ge=0)
    #: The threshold in tokens instead (0: unset): SUMMARIZATION_THRESHOLD_CHARS becomes
    #: round(tokens x CHARS_PER_TOKEN) at start-up, so no model call waits for a tokenizer.
    #: Setting both fails. (chars / 4 is 2-21% off exact o200k_base counts on the
    #: shared transcripts, 3.2 chars per token on JSON-heavy ones.)
    summarization_threshold_tokens: int = Field(default=0, ge=0)
    #: Chars per input token of the deployment's model, for SUMMARIZATION_THRESHOLD_TOKENS.
    #: The middleware measures it from the provider's ``usage_metadata`` and logs the ratio
    #: to set (:mod:`offpath.compaction.tokens`).
    chars_per_token: float = Field(default=DEFAULT_CHARS_PER_TOKEN, ge=1.0, le=20.0)
    summarization_max_prompt_chars: int = Field(default=60_000, ge=MIN_PROMPT_CHARS)
    #: A job may start when the thread reaches this share of the threshold, so that its
    #: summary is ready by the time the thread crosses it (applied only over the threshold).
    summarization_prepare_at: float = Field(default=0.8, gt=0, le=1)
    #: A compaction prepared for a thread still under its threshold is applied at the thread's
    #: next turn (the post-turn hook; the middleware, before that turn's first model call) once
    #: the thread has been idle this many seconds and is still over its prepare floor: about
    #: the life of a provider's prompt cache (5 minutes), after which the thread's prefix is
    #: sent uncached anyway, so rewriting it costs no cached tokens. 0: never (a prepared
    #: compaction waits for the crossing, or for ``PREPARED_JOB_TTL_S``).
    summarization_idle_apply_s: float = Field(default=300.0, ge=0, le=86_400)
    #: No model call goes over this many chars: if one would and no summary is prepared,
    #: the oldest tool results are masked for that call only. 0: 3x the threshold.
    context_hard_limit_chars: int = Field(default=0, ge=0)
    #: Most chars of the fact guard's **Pinned facts** section, appended to every summary
    #: with the facts of the removed messages that the summary missed. 0: no fact guard.
    #: The summary's budget bounds it first (``SUMMARY_MAX_SHARE`` x the threshold, of which
    #: the section takes up to 70% of the text's room): the default lets the facts keep that
    #: share up to a threshold of about 85,000 chars.
    summary_pinned_max_chars: int = Field(default=8_000, ge=0, le=20_000)
    #: The whole summary message (template, quoted request, pinned facts, recall line) stays
    #: under this share of the threshold (a summary of a fixed 8.6-12.6k chars eats a
    #: 30,000-char thread's room). The planner counts it as the summary's size.
    summary_max_share: float = Field(default=0.15, ge=0.05, le=0.5)
    #: A tool result over this many chars is shortened as it arrives (head, tail, the facts of
    #: the part cut out, how to read the rest) and kept whole in the archive. 0: a fifth of
    #: the threshold, at most three quarters of the keep window (10,000 chars at the defaults).
    tool_result_max_chars: int = Field(default=0, ge=0)
    #: Days the archive keeps the originals that compactions removed. 0: keep them.
    archive_retention_days: int = Field(default=0, ge=0)

    # --- summarizer LLM ----------------------------------------------------------------
    summarization_model: str = Field(default="gpt-4o-mini", min_length=1)
    openai_api_key: SecretStr | None = None
    openai_base_url: str | None = Field(default=None, pattern=r"^(https?://\S+)?$")
    summarization_timeout_s: float = Field(default=60.0, gt=0, le=3_600)
    summarization_max_retries: int = Field(default=2, ge=0, le=10)
    summarization_max_output_tokens: int = Field(default=1_024, gt=0)
    #: Model of the chat agent behind ``POST /sessions/{id}/messages``; ``scripted``: the
    #: demo's scripted model (no LLM; its answers say so).
    chat_model: str = Field(default="gpt-4o-mini", min_length=1)
    #: The chat agent's tools: ``package.module:attribute``, a list of LangChain tools.
    agent_tools: str = Field(
        default="offpath.agent.sre_tools:SRE_TOOLS", pattern=r"^$|^[\w.]+:[\w.]+$"
    )
    #: ``CHAT_MODEL=scripted`` only: each scripted answer first waits, at most this many
    #: seconds, until no compaction job is being queued or is in flight on its thread (as an
    #: LLM slower than the summarizer would). ``offpath demo`` sets 60: every run of the demo
    #: then takes the same steps, whatever the machine's load. 0: no wait.
    scripted_job_wait_s: float = Field(default=0.0, ge=0, le=600)

    # --- infrastructure ----------------------------------------------------------------
    redis_url: str = Field(default="redis://localhost:6379/0", pattern=r"^(rediss?|unix)://")
    #: Empty: SQLite files under ``data_dir``. ``postgresql://...``: PostgreSQL.
    database_url: str = ""
    #: ``database_url``'s password if it has none, kept out of it: e.g. a Compose secret file.
    database_password: SecretStr | None = None
    #: PostgreSQL's connect_timeout, tcp_user_timeout, statement_timeout (0: none; README)
    database_connect_timeout_s: int = Field(default=5, ge=0, le=3_600)
    database_tcp_user_timeout_s: int = Field(default=10, ge=0, le=3_600)
    database_statement_timeout_s: int = Field(default=60, ge=0, le=86_400)
    data_dir: str = Field(default="./data", min_length=1)
    #: Broker URL for Celery; empty means ``redis_url``. ``amqp://`` for RabbitMQ.
    celery_broker_url: str = Field(
        default="", pattern=r"^$|^(rediss?|amqps?|pyamqp|sqla\+[a-z]+)://"
    )
    #: Thread locks and job leases in "redis" (REDIS_URL) or "database" (one machine only).
    lock_backend: Literal["redis", "database"] = "redis"
    #: A Redis that may evict keys (not ``noeviction``) can drop a job's lease mid-job (a
    #: second job runs): "warn" logs it at start-up, "refuse" stops the API and the worker.
    redis_eviction_check: Literal["warn", "refuse"] = "warn"
    publish_timeout_s: float = Field(default=1.0, gt=0, le=60)
    lock_timeout_s: float = Field(default=30.0, gt=0)
    lock_wait_s: float = Field(default=10.0, ge=0)
    job_soft_time_limit_s: int = Field(default=240, gt=0)
    job_time_limit_s: int = Field(default=300, gt=0)
    job_max_retries: int = Field(default=3, ge=0, le=20)
    job_retry_backoff_s: int = Field(default=2, ge=0)
    job_retry_backoff_max_s: int = Field(default=60, gt=0)
    #: A running job renews its lease on the thread every third of this; a dead job's
    #: lease lapses within it (DESIGN.md invariant 11).
    job_lease_s: int = Field(default=30, ge=3, le=3_600)
    #: Period of the reconciler (``offpath beat``): ends or re-publishes lapsed jobs and
    #: queues jobs for threads left over the threshold.
    reconcile_interval_s: int = Field(default=15, ge=1, le=3_600)
    #: A prepared compaction not applied within this many seconds (its thread did not run
    #: again over its threshold) is ended ``skipped`` (``expired``) by the reconciler, its
    #: claim freed, the thread left as it is. At most a day: a prepared claim lasts a day.
    prepared_job_ttl_s: int = Field(default=3_600, ge=1, le=86_400)
    #: After a job fails, its thread gets no new job for this long, doubling with each
    #: further failure in a row, up to ``failure_backoff_max_s``.
    failure_backoff_s: int = Field(default=60, ge=0)
    failure_backoff_max_s: int = Field(default=3_600, gt=0)
    celery_visibility_timeout_s: int = Field(default=3_600, gt=0)
    celery_queue: str = Field(default="compaction", pattern=r"^[A-Za-z0-9._:-]{1,100}$")
    redis_key_prefix: str = Field(default="offpath", pattern=r"^[A-Za-z0-9._:-]{1,100}$")
    worker_pool: Literal["threads", "prefork", "solo"] = "threads"
    worker_concurrency: int = Field(default=128, gt=0, le=4_096)
    #: Worker processes ``offpath worker`` starts (0: one per core): one process's jobs
    #: share its GIL, so a host's cores are used by one process each.
    worker_processes: int = Field(default=0, ge=0, le=256)
    max_turn_messages: int = Field(default=10_000, gt=0)
    #: Largest message accepted, every field counted (content with media at their real
    #: size, tool calls, additional_kwargs, name, id, artifact...), in chars.
    max_message_chars: int = Field(default=2_000_000, gt=0)
    #: Largest ``state`` of ``/turns`` (as JSON), in chars.
    max_state_chars: int = Field(default=200_000, gt=0)
    #: Largest request body, in bytes, refused (413) before it is parsed.
    max_request_bytes: int = Field(default=32 * 2**20, gt=0)
    #: Deepest nesting of JSON arrays and objects in a request (422 beyond).
    max_json_depth: int = Field(default=32, ge=4, le=200)
    #: Most JSON values (array items and object members, at any depth) in a request body:
    #: 422 beyond, counted as the body streams in, before it is parsed.
    max_json_values: int = Field(default=200_000, ge=1_000, le=10_000_000)
    #: Checkpoints kept per thread: once a thread has more, the older ones are pruned
    #: (the originals a compaction removes are in the archive, not in old checkpoints).
    #: 0: never prune.
    checkpoint_history: int = Field(default=5, ge=0)
    #: ``Host`` headers the API answers (comma-separated; ``*``: any; DNS rebinding).
    allowed_hosts: str = Field(default="localhost,127.0.0.1,[::1]", min_length=1)
    #: No API keys: every caller is the admin of tenant "default". For the embedded demo
    #: only; the API warns at start-up, loudly when `offpath api` binds beyond 127.0.0.1.
    auth_disabled: bool = False
    #: The tenant that owns the threads of a team's own agent (``OffPathCompaction`` in the
    #: team's process): its API keys list, read and compact them.
    own_agent_tenant: str = Field(default="default", pattern=TENANT_PATTERN)
    #: The key the CLI (``replay``, ``stats``...) sends to the API.
    offpath_api_key: SecretStr | None = None
    #: ``GET /metrics`` of the API answers without a key (a scraper that cannot send one, on
    #: a private network); false: it needs an admin key.
    metrics_public: bool = False
    #: Port of a worker's own ``/metrics`` (0: none); one per worker on a machine.
    worker_metrics_port: int = Field(default=9808, ge=0, le=65_535)
    #: Interface a worker's ``/metrics`` listens on (0.0.0.0 in a container).
    worker_metrics_host: str = Field(default="127.0.0.1", min_length=1)
    flower_basic_auth: str = ""
    flower_port: int = Field(default=5555, ge=1, le=65_535)
    api_url: str = Field(default=DEFAULT_API_URL, pattern=API_URL_PATTERN)
    log_level: LogLevel = "INFO"

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("redis_url", "celery_broker_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        """A ``redis://`` URL with its port in range and its database a number (redis-py
        takes ``/abc`` for database 0 in silence, and a port over 65535 fails at start-up)."""
        if not value.startswith(("redis://", "rediss://")):
            return value
        parts = urlsplit(value)
        try:
            parts.port  # noqa: B018 (it checks the port)
        except ValueError:  # neither the URL nor part of it is echoed: it may hold a password
            raise ValueError(
                "the port after the host is not a number from 0 to 65535 (a password holding "
                "/, # or @ is written %2F, %23, %40)"
            ) from None
        path = parts.path.strip("/")
        if path and not path.isdigit():
            raise ValueError("the database after the host is a number (redis://host:6379/0)")
        return value

    @property
    def broker_url(self) -> str:
        """The Celery broker: ``CELERY_BROKER_URL``, else ``REDIS_URL``."""
        return self.celery_broker_url or self.redis_url

    @property
    def broker_is_redis(self) -> bool:
        return self.broker_url.startswith(("redis://", "rediss://", "unix://"))

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.summarization_threshold_tokens:
            if "summarization_threshold_chars" in self.model_fields_set:
                raise ValueError(
                    f"SUMMARIZATION_THRESHOLD_TOKENS ({self.summarization_threshold_tokens}) and "
                    f"SUMMARIZATION_THRESHOLD_CHARS ({self.summarization_threshold_chars}) are both "
                    "set: keep one, and delete the other's line from .env and the environment "
                    "(0 is a value: SUMMARIZATION_THRESHOLD_CHARS=0 disables compaction)"
                )
            self.summarization_threshold_chars = threshold_chars(
                self.summarization_threshold_tokens, self.chars_per_token
            )
        threshold = self.summarization_threshold_chars
        keep = self.summarization_keep_chars
        if threshold and keep >= threshold:
            which = (
                f"the threshold, {threshold} chars (SUMMARIZATION_THRESHOLD_TOKENS="
                f"{self.summarization_threshold_tokens} at CHARS_PER_TOKEN {self.chars_per_token})"
                if self.summarization_threshold_tokens
                else f"SUMMARIZATION_THRESHOLD_CHARS ({threshold})"
            )
            default = "" if "summarization_keep_chars" in self.model_fields_set else ", its default"
            raise ValueError(
                f"SUMMARIZATION_KEEP_CHARS ({keep}{default}) must be smaller than {which}: "
                "set SUMMARIZATION_KEEP_CHARS lower"
            )
        url = self.database_url.strip()
        if url and not url.startswith(POSTGRES_SCHEMES):
            raise ValueError(
                f"DATABASE_URL must be empty (SQLite files under DATA_DIR) or a PostgreSQL URL "
                f"(postgresql://user@host:5432/db), got {url.split('://')[0]}://..."
            )
        db_password = self.database_password.get_secret_value() if self.database_password else ""
        if url and db_password:
            self.database_url = with_password(url, db_password)
        for pair in filter(None, self.flower_basic_auth.split(",")):
            user, sep, password = pair.partition(":")
            if not (user and sep and password):
                raise ValueError(
                    "FLOWER_BASIC_AUTH must be user:password (several: a,b separated by commas)"
                )
        if self.job_soft_time_limit_s >= self.job_time_limit_s:
            raise ValueError(
                f"JOB_SOFT_TIME_LIMIT_S ({self.job_soft_time_limit_s}) must be smaller than "
                f"JOB_TIME_LIMIT_S ({self.job_time_limit_s})"
            )
        llm_s = self.summarization_timeout_s * (self.summarization_max_retries + 1)
        if llm_s >= self.job_soft_time_limit_s:
            raise ValueError(
                f"SUMMARIZATION_TIMEOUT_S ({self.summarization_timeout_s:g}) x "
                f"(SUMMARIZATION_MAX_RETRIES ({self.summarization_max_retries}) + 1) = {llm_s:g} s "
                f"must be under JOB_SOFT_TIME_LIMIT_S ({self.job_soft_time_limit_s}): one job "
                "attempt would outlive its time limit"
            )
        if self.broker_is_redis:
            # a retry is a message with an ETA, held unacknowledged until it is due: if it is
            # held past the visibility timeout, Redis hands it to a second worker as well
            held = self.job_retry_backoff_max_s + self.job_time_limit_s
            if held >= self.celery_visibility_timeout_s:
                raise ValueError(
                    f"JOB_RETRY_BACKOFF_MAX_S ({self.job_retry_backoff_max_s}) + JOB_TIME_LIMIT_S "
                    f"({self.job_time_limit_s}) must be under CELERY_VISIBILITY_TIMEOUT_S "
                    f"({self.celery_visibility_timeout_s}), or Redis redelivers a job still "
                    "waiting for its retry and it runs twice"
                )
        if self.context_hard_limit_chars and self.context_hard_limit_chars <= threshold:
            raise ValueError(
                f"CONTEXT_HARD_LIMIT_CHARS ({self.context_hard_limit_chars}) must be above "
                f"SUMMARIZATION_THRESHOLD_CHARS ({threshold}) (0: three times it)"
            )
        if self.tool_result_max_chars and self.tool_result_max_chars < MIN_SHORTENED_CHARS:
            raise ValueError(
                f"TOOL_RESULT_MAX_CHARS ({self.tool_result_max_chars}) must be 0 (a fifth of "
                f"the threshold) or at least {MIN_SHORTENED_CHARS}: a shortened result keeps its head, "
                "tail and facts"
            )
        if self.failure_backoff_s > self.failure_backoff_max_s:
            raise ValueError(
                f"FAILURE_BACKOFF_S ({self.failure_backoff_s}) must not exceed "
                f"FAILURE_BACKOFF_MAX_S ({self.failure_backoff_max_s})"
            )
        return self

    @property
    def hard_limit_chars(self) -> int:
        """``CONTEXT_HARD_LIMIT_CHARS``, or 3x the threshold when it is 0 (0 when disabled)."""
        return self.context_hard_limit_chars or 3 * self.summarization_threshold_chars

    @property
    def prepare_floor_chars(self) -> int:
        """The size at which a job may start preparing (``SUMMARIZATION_PREPARE_AT`` x threshold)."""
        return int(self.summarization_threshold_chars * self.summarization_prepare_at)

    def idle_apply(self, idle_s: float | None) -> bool:
        """A thread idle ``idle_s`` seconds before its turn (None: unknown) has its prepared
        compaction applied at that turn under its threshold: ``SUMMARIZATION_IDLE_APPLY_S``
        or longer (0: never). The caller checks the thread is over its prepare floor."""
        limit = self.summarization_idle_apply_s
        return bool(limit) and idle_s is not None and idle_s >= limit

    @property
    def summary_budget_chars(self) -> int:
        """Most chars of a whole summary message: ``SUMMARY_MAX_SHARE`` x the threshold."""
        return int(self.summarization_threshold_chars * self.summary_max_share)

    @property
    def tool_result_limit_chars(self) -> int:
        """``TOOL_RESULT_MAX_CHARS``, or when 0: a fifth of the threshold (one result cannot
        carry a thread from under its prepare floor past its threshold on its own), at most
        three quarters of the keep window (the newest result fits the keep window beside its
        call), at least :data:`MIN_SHORTENED_CHARS`. In chars. Not lower: results of a few
        thousand chars at a 30,000-char threshold are the session itself, compacted whole
        later (the ``parallel-batch`` case expects its batch summarized, not cut on arrival)."""
        if self.tool_result_max_chars:
            return self.tool_result_max_chars
        keep, threshold = self.summarization_keep_chars, self.summarization_threshold_chars
        return max(MIN_SHORTENED_CHARS, min(keep * 3 // 4, threshold // 5))

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


def with_password(url: str, password: str) -> str:
    """``url`` (``postgresql://user@host/db``) with ``password`` for its user; a URL that has a
    password already keeps its own. Raises ``ValueError`` for a URL with no user."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at or not userinfo:
        raise ValueError(
            "DATABASE_PASSWORD is set but DATABASE_URL names no user "
            "(postgresql://user@host:5432/db)"
        )
    if ":" in userinfo:
        return url
    netloc = f"{userinfo}:{quote(password, safe='')}@{hostport}"
    return urlunsplit(parts._replace(netloc=netloc))
