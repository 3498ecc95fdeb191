"""One compaction end to end on a list of messages, without I/O.

The worker runs the same steps with the checkpoint and a lock around them; the
tests, the benchmarks and the demo's dry runs use :func:`compact` directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from langchain_core.messages import BaseMessage, HumanMessage

from compaction.patch import build_patch, summary_message
from compaction.planner import CompactionPlan, Skip, plan_compaction
from compaction.prompt import SummaryPrompt, build_prompt
from compaction.settings import Settings
from compaction.summarizers.base import Summarizer, SummaryResult


@dataclass(frozen=True, slots=True)
class Compaction:
    """A planned and summarized compaction: apply ``patch`` with ``add_messages``."""

    plan: CompactionPlan
    prompt: SummaryPrompt
    result: SummaryResult
    summary: HumanMessage
    patch: list[BaseMessage]


def summarize_plan(plan: CompactionPlan, settings: Settings, summarizer: Summarizer) -> Compaction:
    """Prompt, summarize and build the patch for ``plan``.

    Raises :class:`~compaction.summarizers.base.SummarizerError` when the summary
    cannot be written (nothing is built then).
    """
    prompt = build_prompt(plan, settings.summarization_max_prompt_chars)
    result = summarizer.summarize(plan, prompt)
    summary = summary_message(plan, result.text, summarizer.name)
    return Compaction(plan, prompt, result, summary, build_patch(plan, summary))


def compact(
    messages: Sequence[BaseMessage], settings: Settings, summarizer: Summarizer
) -> Compaction | Skip:
    """Plan and summarize one compaction of ``messages``, or say why not."""
    plan = plan_compaction(messages, settings)
    if isinstance(plan, Skip):
        return plan
    return summarize_plan(plan, settings, summarizer)
