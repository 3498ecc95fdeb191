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
)
from offpath.compaction.summarizers.offline import OfflineSummarizer

__all__ = [
    "EmptySummaryError",
    "MalformedSummaryError",
    "OfflineSummarizer",
    "Summarizer",
    "SummarizerError",
    "SummaryResult",
    "TransientSummarizerError",
    "make_summarizer",
]


def make_summarizer(settings: Settings) -> Summarizer:
    """The LLM summarizer when an LLM is configured (``OPENAI_API_KEY`` or ``OPENAI_BASE_URL``),
    else the offline one."""
    if settings.llm_configured:
        from offpath.compaction.summarizers.llm import LLMSummarizer

        return LLMSummarizer.from_settings(settings)
    return OfflineSummarizer()
