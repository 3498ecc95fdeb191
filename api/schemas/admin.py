"""Answers of the session admin routes (:mod:`api.admin`: the sessions list, compact now,
revert, the archive) and of ``/healthz`` and ``/readyz``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from .answers import KIND, Kind, ToolCallOut
from .messages import Content


class SessionRow(BaseModel):
    session_id: str
    tenant: str
    kind: Kind = KIND
    messages: int | None = Field(
        description="Messages after offpath's last write (null: not known)"
    )
    chars: int | None = Field(description="Size in chars after offpath's last write")
    compactions: int = Field(description="Applied compactions")
    last_activity: str | None = Field(description="The last turn, ISO 8601")
    jobs_in_flight: int = Field(description="Jobs queued or running")


class SessionsOut(BaseModel):
    sessions: list[SessionRow]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null: last")


class CompactOut(BaseModel):
    """``queued``: a new job (follow it at ``/sessions/{id}/compactions``); ``applied``: a
    compaction prepared ahead was applied at once; ``prepared`` (a team's own agent's
    thread): a compaction is prepared and its agent's middleware applies it at the thread's
    next model call. ``detail`` says what happens next."""

    job_id: str
    status: Literal["queued", "applied", "prepared"]
    kind: Kind = KIND
    detail: str = Field(description="What happens next, in words")


class RevertOut(BaseModel):
    """A reverted compaction: its originals are back in the thread in place of its summary."""

    job_id: str
    status: Literal["reverted"]
    messages_restored: int = Field(description="Removed messages put back")
    results_restored: int = Field(description="Kept tool results it had shortened, restored")
    messages: int = Field(description="Messages in the thread now")
    chars: int = Field(description="The thread's size now, in chars")


class ArchivedOut(BaseModel):
    """One original message a compaction removed (transcript format, plus where it was)."""

    message_id: str
    summary_id: str = Field(description="The id of the summary message that replaced it")
    job_id: str | None = Field(
        description="The compaction job that removed it; null: a tool result shortened as it "
        "arrived, before any job"
    )
    position: int = Field(description="Its index in the thread when it was removed")
    created_at: str | None = Field(description="When it was archived, ISO 8601")
    type: str
    content: Content
    tool_calls: list[ToolCallOut] = Field(default_factory=list, description="AI messages")
    tool_call_id: str | None = Field(default=None, description="Tool messages")
    name: str | None = None


class ArchiveOut(BaseModel):
    session_id: str
    messages: list[ArchivedOut] = Field(description="Oldest compaction first")
    total: int = Field(description="Archived originals matching, in all")
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null: last")


class HealthOut(BaseModel):
    """``ok`` when the broker, the database and the checkpointer answer; each says ``ok`` or
    ``error: ...``; ``reconciler`` says when it last ran (reported, not required)."""

    ok: bool
    broker: str
    database: str
    checkpointer: str
    reconciler: str


class QueueConsumersOut(BaseModel):
    consumers: int = Field(description="Workers consuming the queue")
    workers: list[str] = Field(description="Their Celery node names")


class ReadyOut(HealthOut):
    """``/healthz``'s checks and the workers consuming each queue offpath publishes to:
    ``ok`` only when every check answers and every queue has a worker; ``workers`` says
    why in one line (naming the queue and the broker)."""

    workers: str = Field(description="`ok: ...`, `unknown: ...` or why not ready")
    queues: dict[str, QueueConsumersOut] = Field(description="By queue; empty when unknown")
    checked_s_ago: float | None = Field(
        description="Age of the workers' answer (cached a few seconds), in seconds"
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="What works but needs the operator (they leave `ok` as it is): sessions "
        "whose fixed part (system prompt) alone is over their threshold, with the sizes and "
        "the setting to change",
    )
