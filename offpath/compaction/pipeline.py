"""One compaction end to end on a list of messages, without I/O.

The worker runs the same steps with the checkpoint and a lock around them; the
tests, the benchmarks and the demo's dry runs use :func:`compact` directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from langchain_core.messages import BaseMessage, HumanMessage

from offpath.compaction.patch import Fitted, Prepared, Stale, fit
from offpath.compaction.planner import CompactionPlan, Skip, plan_compaction
from offpath.compaction.prompt import SummaryPrompt, build_prompt
from offpath.compaction.settings import Settings
from offpath.compaction.summarizers.base import Summarizer, SummaryResult


@dataclass(frozen=True, slots=True)
class Compaction:
    """A planned and summarized compaction: apply ``patch`` with ``add_messages``."""

    plan: CompactionPlan
    prompt: SummaryPrompt
    result: SummaryResult
    prepared: Prepared
    fitted: Fitted

    @property
    def summary(self) -> HumanMessage:
        return self.fitted.summary

    @property
    def patch(self) -> list[BaseMessage]:
        return self.fitted.patch


def summarize_plan(
    plan: CompactionPlan,
    messages: Sequence[BaseMessage],
    settings: Settings,
    summarizer: Summarizer,
    job_id: str = "local",
) -> Compaction:
    """Prompt, summarize and fit ``plan`` (made on ``messages``) into a patch.

    Raises :class:`~compaction.summarizers.base.SummarizerError` when the summary
    cannot be written (nothing is built then).
    """
    prompt = build_prompt(plan, settings.summarization_max_prompt_chars)
    result = summarizer.summarize(plan, prompt)
    prepared = Prepared.from_plan(
        plan,
        job_id=job_id,
        summary_text=result.text,
        summarizer=summarizer.name,
        model=result.model,
        meta=result.meta,
    )
    fitted = fit(prepared, messages)
    if isinstance(fitted, Stale):  # the plan was made on these very messages
        raise AssertionError(f"a fresh plan does not fit its own thread: {fitted.reason}")
    return Compaction(plan, prompt, result, prepared, fitted)


def compact(
    messages: Sequence[BaseMessage], settings: Settings, summarizer: Summarizer
) -> Compaction | Skip:
    """Plan and summarize one compaction of ``messages``, or say why not."""
    plan = plan_compaction(messages, settings)
    if isinstance(plan, Skip):
        return plan
    return summarize_plan(plan, messages, settings, summarizer)
