"""Answers of the session routes (:mod:`api.sessions`) and of ``/stats``: one model per
route (``*Out``); :data:`Kind`, a session's kind.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from .messages import Content, OpenModel


class ToolCallOut(BaseModel):
    id: str | None
    name: str
    args: dict[str, Any]


class MessageOut(OpenModel):
    """A message in the transcript format (``/turns`` reads it back unchanged)."""

    type: str
    id: str | None
    content: Content
    tool_calls: list[ToolCallOut] = Field(default_factory=list, description="AI messages")
    tool_call_id: str = Field(default="", description="Tool messages")
    name: str = ""
    additional_kwargs: dict[str, Any] = Field(default_factory=dict)


class SerializedOut(BaseModel):
    """A message as langchain_core's ``messages_to_dict`` writes it (lossless)."""

    type: str
    data: dict[str, Any]


class RunOut(BaseModel):
    """What a chat turn's run added to the thread."""

    messages: int
    chars: int
    tool_calls: int
    compacted: bool = Field(description="A compaction was applied during the run")


class ChatOut(BaseModel):
    session_id: str
    reply: MessageOut
    messages: int = Field(description="Messages in the thread now")
    chars: int = Field(description="The thread's size now, in chars")
    run: RunOut


class WarningOut(BaseModel):
    code: str = Field(description="orphan_tool_result")
    message: str


class TurnOut(BaseModel):
    session_id: str
    appended: int
    messages: int = Field(description="Messages in the thread now")
    chars: int = Field(description="The thread's size now, in chars")
    warnings: list[WarningOut]


#: A session's kind: ``api`` (a thread of offpath's API, in offpath's checkpointer) or
#: ``own agent`` (a thread of a team's own ``create_agent`` app with ``OffPathCompaction``,
#: in the agent's checkpointer, which offpath reads and never writes).
Kind = Literal["api", "own agent"]
KIND = Field(
    description="api: a thread of offpath's API; own agent: a thread of a team's own agent "
    "(OffPathCompaction), read from the agent's checkpointer, never written by offpath"
)


class SessionOut(BaseModel):
    session_id: str
    kind: Kind = KIND
    messages: list[MessageOut] | list[SerializedOut]
    chars: int
    state: dict[str, Any] = Field(description="The thread's other state keys")


class LostFactOut(BaseModel):
    value: str
    kind: str = Field(description="The fact guard's kind: path, sha, identifier, quantity...")
    message_id: str = Field(description="The message it was first seen in (recall reads it)")
    stated: bool | None = Field(
        None, description="The agent or the user stated it (false: only a tool output held it)"
    )
    said: bool | None = Field(None, description="The agent said it in its own words")
    asked: bool | None = Field(None, description="The user named it in a request")
    recallable: bool | None = Field(
        None, description="An original the archive keeps holds it word for word"
    )


class LossPartOut(BaseModel):
    facts: int = Field(description="Facts of this rank in what left the model's view")
    lost: int = Field(description="Of them, in neither the summary nor the kept part")
    recallable: int = Field(description="Of the lost ones, those an archived original holds")


class GroundTruthOut(BaseModel):
    facts: int = Field(description="Ground-truth facts in what left the model's view")
    lost: list[str] = Field(description="Those neither the summary nor the kept part holds")


class LossOut(BaseModel):
    """What an applied compaction took out of the model's view (issue 19): the messages it
    removed, kept tool results it shortened, and the facts of both (the fact guard's
    extractor) that neither its summary nor the kept messages hold."""

    messages_removed: int
    chars_removed: int
    results_shortened: int = Field(description="Kept tool results it shortened in place")
    chars_shortened: int = Field(description="Chars cut from them")
    facts: int = Field(description="Distinct facts in what left the model's view")
    facts_lost: int = Field(description="Of them, in neither the summary nor the kept part")
    lost: list[LostFactOut] = Field(
        description="The lost facts, the stated ones first, most important first (50 at most)"
    )
    stated: LossPartOut | None = Field(
        None, description="The facts the agent or the user stated (by the fact guard's ranking)"
    )
    tool_only: LossPartOut | None = Field(
        None, description="The identifiers only a tool output held, counted apart"
    )
    ground_truth: GroundTruthOut | None = Field(
        description="Facts chosen independently of the extractor (benchmarks), if given"
    )


class LossErrorOut(BaseModel):
    error: str = Field(description="Why the loss report could not be made")


class JobOut(BaseModel):
    job_id: str
    status: Literal["queued", "running", "prepared", "applied", "skipped", "failed", "reverted"]
    reason: str | None
    reason_code: str | None
    attempts: int
    published: bool
    chars_when_queued: int | None
    chars_at_apply: int | None = Field(
        default=None, description="The thread's size just before its compaction was applied"
    )
    messages_removed: int | None
    chars_removed: int | None
    chars_saved: int | None = Field(
        default=None, description="Its real reduction: the size before less the size after"
    )
    summarizer: str | None
    latency_ms: int | None
    loss: LossOut | LossErrorOut | None = Field(
        default=None, description="Applied (or reverted) compactions: what left the model's view"
    )
    created_at: str
    updated_at: str


class LeaseOut(BaseModel):
    job_id: str
    state: Literal["queued", "running", "prepared", "done", "skipped", "backoff"]


class BackoffOut(BaseModel):
    failures_in_a_row: int
    seconds: float
    until: str


class CompactionsOut(BaseModel):
    session_id: str
    jobs: list[JobOut] = Field(description="Oldest first")
    lease: LeaseOut | None = Field(description="Who holds the thread now")
    backoff: BackoffOut | None = Field(description="The failure backoff, while it runs")


class JobCounts(BaseModel):
    queued: int
    running: int
    prepared: int
    applied: int
    skipped: int
    failed: int
    reverted: int = Field(description="Applied compactions undone (POST .../revert)")


class Spread(BaseModel):
    """Percentiles (nearest rank) over the latest values, in ms; null when there are none."""

    count: int
    p50: float | None
    p99: float | None


class ReasonCounts(BaseModel):
    skipped: dict[str, int] = Field(description="reason code -> jobs")
    failed: dict[str, int] = Field(description="reason code -> jobs")


class LlmTokens(BaseModel):
    """Tokens the summarizer's LLM reported (its prompt holds the removed messages: ``input``
    is the real count beside the chars/4 estimate); ``events``: compactions that reported any
    (the offline summarizer reports none)."""

    input: int
    output: int
    events: int


class FailureOut(BaseModel):
    session_id: str
    job_id: str
    reason_code: str | None
    reason: str | None
    at: str | None = Field(description="When it failed, ISO 8601")


class NotApplied(BaseModel):
    """Summaries paid for and never applied: prepared and waiting for their thread (to cross
    its threshold, or to come back after SUMMARIZATION_IDLE_APPLY_S), or ended without being
    applied (stale, expired, superseded, failed)."""

    paid: int = Field(description="Summaries paid for: applied (reverted too), waiting or dropped")
    waiting: int = Field(description="Prepared, waiting for their thread")
    dropped: int = Field(description="Ended without being applied")
    share: float | None = Field(description="(waiting + dropped) / paid; null: none paid for")


class StatsSummary(OpenModel):
    total_summarizations: int
    total_chars_compacted: int = Field(
        description="The real reduction: each compaction's thread size before less its size "
        "after (a summary folded into a later one is not saved twice), reverted ones left out"
    )
    sessions_compacted: int
    approx_tokens_saved: int = Field(description="total_chars_compacted / 4")
    total_tokens_compacted: int = Field(
        description="The same reduction in tokens as each thread's model counts them: a "
        "compaction's chars saved over its thread's chars per token (counted offline for an "
        "OpenAI model, reported by the provider for another), chars / 4 where none was measured"
    )
    tokens_counted_compactions: int = Field(
        description="Compactions in total_tokens_compacted counted so (the others: chars / 4)"
    )
    jobs: JobCounts = Field(description="Jobs by status (queued since `since`)")
    fallback_maskings: int
    jobs_by_reason: ReasonCounts
    lag_ms: Spread = Field(description="Threshold crossed (or job queued, if later) -> applied")
    summarizer_latency_ms: Spread = Field(description="One summarizer call")
    llm_tokens: LlmTokens
    recent_failures: list[FailureOut] = Field(description="The latest failed jobs, newest first")
    summaries_not_applied: NotApplied = Field(
        description="Summaries paid for (the summarizer called) and never applied"
    )
    since: str | None = Field(description="The window's start (ISO 8601); null: all time")


class StatsOut(BaseModel):
    summary: StatsSummary


class SessionStatsOut(BaseModel):
    """One session's figures: its thread now, and ``/stats`` for it alone."""

    session_id: str
    messages: int = Field(description="Messages in the thread now")
    chars: int = Field(description="The thread's size now, in chars")
    tokens: int | None = Field(
        default=None,
        description="The thread's size now in tokens (o200k_base, counted offline; null: no "
        "tokenizer installed)",
    )
    summary: StatsSummary
