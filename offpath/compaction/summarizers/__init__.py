"""Summarizer backends behind one protocol; :func:`make_summarizer` picks one from settings."""

from __future__ import annotations

from offpath.compaction.settings import Settings
from offpath.compaction.summarizers.base import (
    EmptySummaryError,
    MalformedSummaryError,
    Summarizer,
    SummarizerError,
    SummaryResult,
    TransientSummarizerError,
    TruncatedSummaryError,
)
from offpath.compaction.summarizers.guarded import GuardedSummarizer
from offpath.compaction.summarizers.offline import OfflineSummarizer

__all__ = [
    "EmptySummaryError",
    "GuardedSummarizer",
    "MalformedSummaryError",
    "OfflineSummarizer",
    "Summarizer",
    "SummarizerError",
    "SummaryResult",
    "TransientSummarizerError",
    "TruncatedSummaryError",
    "make_summarizer",
]


def make_summarizer(settings: Settings) -> Summarizer:
    """The LLM summarizer when an LLM is configured (``OPENAI_API_KEY`` or ``OPENAI_BASE_URL``),
    else the offline one; either behind the fact guard (``SUMMARY_PINNED_MAX_CHARS``)."""
    inner: Summarizer
    if settings.llm_configured:
        from offpath.compaction.summarizers.llm import LLMSummarizer

        inner = LLMSummarizer.from_settings(settings)
    else:
        inner = OfflineSummarizer()
    return GuardedSummarizer(inner, settings.summary_pinned_max_chars)
