"""Benchmark 5, summary growth: one thread compacted 20 times in a row with the offline
summarizer; the prompt stays under its cap and the summary does not snowball."""

from __future__ import annotations

from bench.common import Context, Result

NAME = "growth"


def run(ctx: Context | None = None, steps: int = 20) -> Result:
    from langchain_core.messages import convert_to_messages
    from langgraph.graph.message import add_messages

    from bench.workloads import turn_messages
    from offpath.compaction.pipeline import Compaction, compact
    from offpath.compaction.settings import load_settings
    from offpath.compaction.summarizers.offline import OfflineSummarizer

    settings = load_settings()
    thread: list = []
    prompts, summaries = [], []
    i = 0
    while len(summaries) < steps:
        thread = add_messages(thread, convert_to_messages(turn_messages(i, 6_000, 3, "g")))
        i += 1
        outcome = compact(thread, settings, OfflineSummarizer())
        if isinstance(outcome, Compaction):
            prompts.append(outcome.prompt.chars)
            summaries.append(len(outcome.result.text))
            thread = add_messages(thread, outcome.patch)
    limit = settings.summarization_max_prompt_chars
    return Result(
        "5. Summary growth (offline summarizer)",
        f"prompt <= {limit:,} chars; summary <= 2x its first size",
        f"prompt max {max(prompts):,} chars; summary first {summaries[0]:,}, max {max(summaries):,} chars (x{max(summaries) / summaries[0]:.2f})",
        max(prompts) <= limit and max(summaries) <= 2 * summaries[0],
        [
            f"one thread compacted {steps} times in a row (turns of ~6,000 chars of logs added between compactions)",
            "prompt chars: " + ", ".join(f"{p:,}" for p in prompts),
            "summary chars: " + ", ".join(f"{s:,}" for s in summaries),
        ],
    )
