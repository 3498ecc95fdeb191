"""One compaction end to end on a list of messages, without I/O: the product's prepare step
(:func:`prepare`, which the worker runs on the thread it read) and its one fit
(:func:`~offpath.compaction.patch.fit_now`).

The worker runs the same steps with the checkpoint and a lock around them
(:mod:`offpath.coordination.jobs`); the tests and the benchmarks use :func:`compact`
directly (fitted as an operator's "compact now" is: no landing bound).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from langchain_core.messages import BaseMessage, HumanMessage

from offpath.compaction.patch import Fitted, Prepared, Stale, fit_now
from offpath.compaction.planner import CompactionPlan, Skip, plan_compaction
from offpath.compaction.prompt import SummaryPrompt, build_prompt
from offpath.compaction.settings import Settings
from offpath.compaction.summarizers.base import Summarizer, SummaryResult


@dataclass(frozen=True, slots=True)
class Summarized:
    """A plan summarized: the prompt, the summarizer's answer, the prepared compaction (kept
    in the job's row until it is applied) and how long the summarizer took (ms)."""

    prompt: SummaryPrompt
    result: SummaryResult
    prepared: Prepared
    latency_ms: int


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


def prepare(
    plan: CompactionPlan,
    settings: Settings,
    summarizer: Summarizer,
    *,
    job_id: str = "local",
    read: CompactionPlan | None = None,
) -> Summarized:
    """Prompt and summarize ``plan``, and prepare its compaction for job ``job_id``.
    ``read``: the plan as the summarizer reads it (the worker's, with the originals of
    results offpath shortened); None: ``plan`` itself.

    Raises :class:`~compaction.summarizers.base.SummarizerError` when the summary cannot be
    written (nothing is built then).
    """
    read = plan if read is None else read
    prompt = build_prompt(read, settings.summarization_max_prompt_chars)
    started = time.monotonic()
    result = summarizer.summarize(read, prompt)
    latency_ms = int((time.monotonic() - started) * 1000)
    prepared = Prepared.from_plan(
        plan,
        job_id=job_id,
        summary_text=result.text,
        summarizer=summarizer.name,
        model=result.model,
        meta=result.meta,
    )
    return Summarized(prompt, result, prepared, latency_ms)


def compact_plan(
    plan: CompactionPlan,
    messages: Sequence[BaseMessage],
    settings: Settings,
    summarizer: Summarizer,
    *,
    outside_chars: int = 0,
) -> Compaction:
    """Prepare ``plan`` (made on ``messages``) and fit it to them with the product's one fit,
    as an operator's "compact now" is (no landing bound: the plan was made on these very
    messages, nothing came since). ``outside_chars``: what each model call sends besides
    them.

    Raises :class:`~compaction.summarizers.base.SummarizerError` when the summary cannot be
    written (nothing is built then).
    """
    done = prepare(plan, settings, summarizer)
    fitted = fit_now(done.prepared, messages, settings, force=True, outside_chars=outside_chars)
    if isinstance(fitted, Stale):  # the plan was made on these very messages
        raise AssertionError(f"a fresh plan does not fit its own thread: {fitted.reason}")
    return Compaction(plan, done.prompt, done.result, done.prepared, fitted)


def compact(
    messages: Sequence[BaseMessage], settings: Settings, summarizer: Summarizer
) -> Compaction | Skip:
    """Plan and summarize one compaction of ``messages``, or say why not."""
    plan = plan_compaction(messages, settings)
    if isinstance(plan, Skip):
        return plan
    return compact_plan(plan, messages, settings, summarizer)
