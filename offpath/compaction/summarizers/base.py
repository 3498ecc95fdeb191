"""The summarizer protocol and its errors.

A summarizer turns a plan (the messages to replace) and its prompt into summary
text. Two backends: :mod:`offpath.llm` (``ChatOpenAI``; outside the core, as it calls the
network) and :mod:`compaction.summarizers.offline` (no model; used when no LLM is configured).
An error never becomes a summary: it raises one of the exceptions below.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from offpath.compaction.planner import CompactionPlan
from offpath.compaction.prompt import SummaryPrompt


class SummarizerError(Exception):
    """The summary could not be written; the thread must stay as it is."""

    #: Worth retrying later (timeouts, 429, 5xx, connection errors).
    transient: bool = False
    #: Names the failure in job rows and metrics (``compaction_jobs.reason_code``).
    code: str = "llm_error"
    #: Seconds the server asked us to wait (HTTP ``Retry-After``), if it did.
    retry_after_s: float | None = None


class TransientSummarizerError(SummarizerError):
    """A failure that may pass: timeout, rate limit (429), server error (5xx), lost connection."""

    transient = True

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EmptySummaryError(SummarizerError):
    """The model answered with no text (or only whitespace)."""

    code = "empty_summary"


class MalformedSummaryError(SummarizerError):
    """The model's answer is not the seed's template (its four headings, in order), or is a
    refusal written inside it: it never becomes a summary."""

    code = "malformed_summary"


class TruncatedSummaryError(SummarizerError):
    """The model's answer was cut at its output limit (``finish_reason: length``): a summary
    missing its end never becomes one."""

    code = "truncated_summary"


@dataclass(frozen=True, slots=True)
class SummaryResult:
    """Summary ``text`` and what it cost: tokens as reported by the model (0 offline).
    ``meta``: what the summary message carries besides its text (the frontier)."""

    text: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    meta: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Summarizer(Protocol):
    """Writes the summary text for a plan. ``name`` is recorded on the summary message."""

    name: str

    def summarize(self, plan: CompactionPlan, prompt: SummaryPrompt) -> SummaryResult:
        """Return the summary of ``plan.removed``; raise :class:`SummarizerError` on failure."""
        ...
