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

log = logging.getLogger("offpath.summarizer")

#: The summary's last line (issue 11, item 4: the summary tells the model the tool exists).
RECALL_NOTE = (
    "_The messages summarized here are archived unchanged: call the `recall` tool with words "
    "or a message id to read them again._"
)


class GuardedSummarizer:
    """``inner`` with the fact guard: same ``name`` (the summarizer recorded is ``inner``'s),
    same errors; the text gains the Pinned facts section (at most ``pinned_max_chars``
    chars; 0: none) and :data:`RECALL_NOTE`."""

    def __init__(self, inner: Summarizer, pinned_max_chars: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.pinned_max_chars = pinned_max_chars

    def summarize(self, plan: CompactionPlan, prompt: SummaryPrompt) -> SummaryResult:
        """The inner summary, with the facts it missed pinned (see the module doc)."""
        result = self.inner.summarize(plan, prompt)
        text, pinned = pin(result.text, plan.removed, self.pinned_max_chars, plan.kept)
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
