"""The fact guard around any summarizer (issue 11, item 2).

Whatever wrote the summary (an LLM, the offline extractor), the facts of the removed
messages that it missed are appended as a bounded **Pinned facts** section
(:func:`offpath.compaction.facts.pin`), and a last line tells the model that the
originals can be searched with the ``recall`` tool.
"""

from __future__ import annotations

import logging

from offpath.compaction.facts import pin
from offpath.compaction.planner import CompactionPlan
from offpath.compaction.prompt import SummaryPrompt
from offpath.compaction.summarizers.base import Summarizer, SummaryResult
from offpath.compaction.summary import RECALL_NOTE

__all__ = ["RECALL_NOTE", "GuardedSummarizer"]

log = logging.getLogger("offpath.summarizer")


class GuardedSummarizer:
    """``inner`` with the fact guard: same ``name`` (the summarizer recorded is ``inner``'s),
    same errors; the text gains the Pinned facts section (at most ``pinned_max_chars``
    chars, and no more than the plan's summary budget leaves; 0: none) and
    :data:`RECALL_NOTE`."""

    def __init__(self, inner: Summarizer, pinned_max_chars: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.pinned_max_chars = pinned_max_chars

    def summarize(self, plan: CompactionPlan, prompt: SummaryPrompt) -> SummaryResult:
        """The inner summary, with the facts it missed pinned (see the module doc)."""
        result = self.inner.summarize(plan, prompt)
        room = self.pinned_max_chars
        if plan.summary_chars:  # the summary's budget bounds the section too (issue 18)
            room = min(room, max(0, plan.summary_chars - len(result.text) - 4))
        text, pinned = pin(result.text, plan.removed, room, plan.kept)
        if pinned.facts:
            log.info(
                "fact guard: pinned %d fact(s) the summary missed (%d entries)",
                pinned.facts,
                len(pinned.entries),
            )
        return SummaryResult(
            text=f"{text.rstrip()}\n\n{RECALL_NOTE}",
            model=result.model,
            input_tokens=result.input_tokens,
            output_tokens=result.output_tokens,
        )
