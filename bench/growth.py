"""Benchmark 5, summary growth: one thread compacted 20 times in a row by a stub LLM that makes
every summary grow whenever the prompt lets it: it echoes the earlier summary it is given
and adds a new finding of ~1,500 chars (an LLM that never lets go of anything). Whatever
bounds the summary and the prompt then comes from the design (the summary cap, the fact
guard's budget, the prompt cap), not from a summarizer that caps itself."""

from __future__ import annotations

import re
from typing import Any

from bench.common import Context, Result

NAME = "growth"

#: What the stub adds to each summary, in chars.
ADDED_CHARS = 1_500


def echo_model() -> Any:
    """A chat model that answers with the earlier summary found in the prompt (all of it),
    plus one new finding of :data:`ADDED_CHARS` chars; the template's headings first when
    there is no earlier summary."""
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class EchoModel(BaseChatModel):
        calls: int = 0

        @property
        def _llm_type(self) -> str:
            return "echo"

        def _generate(self, messages: Any, stop: Any = None, **_: Any) -> ChatResult:
            self.calls += 1
            user = str(messages[-1].content)
            token = re.search(r"<<<DATA ([0-9a-f]+)>>>", user)
            earlier = ""
            if token:
                marker = f"[{token.group(1)} earlier summary]\n"
                at = user.find(marker)
                if at >= 0:
                    rest = user[at + len(marker) :]
                    end = min(
                        (
                            i
                            for i in (rest.find(f"[{token.group(1)} "), rest.find("<<<END DATA"))
                            if i >= 0
                        ),
                        default=len(rest),
                    )
                    earlier = rest[:end].strip()
            if not earlier.startswith("**Investigating:**"):
                earlier = (
                    "**Investigating:** checkout latency\n**Key findings:**\n- none yet\n"
                    "**Ruled out:**\n- nothing\n**Current state:**\n- looking"
                )
            filler = f"- finding {self.calls}: " + "p99 latency 2.4s on payments-api pod-7 " * 60
            text = f"{earlier}\n{filler[:ADDED_CHARS]}"
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])

    return EchoModel()


def run(ctx: Context | None = None, steps: int = 20) -> Result:
    from langchain_core.messages import convert_to_messages
    from langgraph.graph.message import add_messages

    from bench.workloads import turn_messages
    from offpath.compaction.pipeline import Compaction, compact
    from offpath.compaction.summarizers.guarded import GuardedSummarizer
    from offpath.config import load_settings
    from offpath.llm import MAX_SUMMARY_CHARS, LLMSummarizer

    settings = load_settings()
    summarizer = GuardedSummarizer(
        LLMSummarizer(echo_model(), "echo"), settings.summary_pinned_max_chars
    )
    thread: list = []
    prompts, summaries = [], []
    i = 0
    while len(summaries) < steps:
        thread = add_messages(thread, convert_to_messages(turn_messages(i, 6_000, 3, "g")))
        i += 1
        outcome = compact(thread, settings, summarizer)
        if isinstance(outcome, Compaction):
            prompts.append(outcome.prompt.chars)
            summaries.append(len(outcome.result.text))
            thread = add_messages(thread, outcome.patch)
    limit = settings.summarization_max_prompt_chars
    # the design's bound: the summary cap, the fact guard's budget and its fixed lines
    bound = MAX_SUMMARY_CHARS + settings.summary_pinned_max_chars + 1_000
    return Result(
        "5. Summary growth (a summarizer that never lets go)",
        f"prompt <= {limit:,} chars; summary <= {bound:,} chars (the summary cap "
        f"{MAX_SUMMARY_CHARS:,} + pinned facts {settings.summary_pinned_max_chars:,} + 1,000)",
        f"prompt max {max(prompts):,} chars; summary first {summaries[0]:,}, max {max(summaries):,}, "
        f"last {summaries[-1]:,} chars",
        max(prompts) <= limit and max(summaries) <= bound,
        [
            f"one thread compacted {steps} times in a row (turns of ~6,000 chars of logs added between "
            f"compactions); the stub LLM echoes the whole earlier summary and adds {ADDED_CHARS:,} chars each time, "
            "through the LLM summarizer and the fact guard, as the worker runs them",
            "prompt chars: " + ", ".join(f"{p:,}" for p in prompts),
            "summary chars: " + ", ".join(f"{s:,}" for s in summaries),
        ],
        "the summary grows until the LLM summarizer's cap cuts it (MAX_SUMMARY_CHARS), then stays there: the cap "
        "bounds it, plus the fact guard's bounded Pinned facts; the prompt shortens long items to its cap",
    )
