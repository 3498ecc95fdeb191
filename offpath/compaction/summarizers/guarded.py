"""The guards around any summarizer.

Whatever wrote the summary (an LLM, the offline extractor):

* the agent's place is written into the template (:mod:`offpath.compaction.frontier`: the
  task, the latest request, what is open, done and next; DESIGN.md invariant 15), read from
  the messages themselves and from the text of the earlier summary (never its metadata,
  which a client can forge); it is also kept in the new summary's metadata, for display;
* the facts of the removed messages that it missed are appended as a bounded **Pinned
  facts** section (:func:`offpath.compaction.facts.pin`); on a small budget they come
  before the summarizer's prose, which is clipped to make room for them (up to half the
  budget: at a 4,000-char threshold an LLM's 400 chars of prose left them none; past
  :data:`OWN_FACTS_SHARE`, the summarizer's lines quoting tool output give way to what the
  agent said and the user named, the rest of its text stays);
* a last line tells the model that the originals can be searched with the ``recall`` tool;
* the archive's index, which the summary gets when it is applied
  (:func:`offpath.compaction.index.archive_index`), takes its room from the plan's budget
  first: the inner summarizer and the pins are given what it leaves.
"""

from __future__ import annotations

import dataclasses
import logging

from offpath.compaction.facts.pinning import pin
from offpath.compaction.facts.reading import QUOTED_OUTPUT
from offpath.compaction.facts.sections import ASKED_LABEL, SAID_LABEL
from offpath.compaction.frontier import Frontier, into_summary, read_frontier
from offpath.compaction.index import archive_index, index_room
from offpath.compaction.planner import CompactionPlan
from offpath.compaction.prompt import SummaryPrompt
from offpath.compaction.summarizers.base import Summarizer, SummaryResult
from offpath.compaction.summary import (
    RECALL_NOTE,
    archived_as,
    fit_text,
    summary_body,
    summary_request,
)

__all__ = ["RECALL_NOTE", "GuardedSummarizer"]

log = logging.getLogger("offpath.summarizer")

#: The least chars the text and pins keep when the archive's index takes its room.
MIN_TEXT_CHARS = 300
#: Most of the text's budget the Pinned facts may take from the summarizer's prose: what
#: the agent said and the user named come first in it, over many compactions the facts of
#: every span the summaries carry.
FACTS_SHARE = 0.7
#: Most of it they may take while what the agent said in its own words and the user named
#: (the lines of values marked so) do not fit in :data:`FACTS_SHARE`: their values outrank a
#: summarizer's prose that left them out.
OWN_FACTS_SHARE = 0.85


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
        """The inner summary with the agent's place written in and the facts it missed pinned
        (see the module doc)."""
        # the archive's index the summary ends with (added when it is applied) takes its room
        # from the start: the text and the pins fit beside it (DESIGN.md invariant 20)
        index = archive_index(plan.removed, index_room(plan.summary_budget))
        if plan.summary_chars and index:
            plan = dataclasses.replace(
                plan, summary_chars=max(MIN_TEXT_CHARS, plan.summary_chars - len(index) - 2)
            )
        result = self.inner.summarize(plan, prompt)
        earlier = next(
            (
                f
                for m in reversed(plan.earlier_summaries)
                if (f := Frontier.from_text(summary_body(m), summary_request(m))) is not None
            ),
            None,
        )
        frontier = read_frontier(plan.removed, plan.kept, earlier)
        share = (plan.summary_chars or 3_000) // 5
        # a request in view (quoted at the summary's end, or kept after it) is pointed at,
        # not repeated
        kept = {
            archived_as(m) for m in plan.kept if m.type == "human"
        }  # as the frontier names them
        if plan.request_copy is not None:
            kept.add(plan.request_copy)
        text = into_summary(result.text, frontier, share, plan.request, kept)
        room = self.pinned_max_chars
        if plan.summary_chars:  # the summary's budget bounds the section too
            room = min(room, max(0, plan.summary_chars - len(text) - 4))
            # facts before prose: the missing facts may take up to :data:`FACTS_SHARE` of
            # the budget; what they need beyond the room the text left is taken from the
            # summarizer's prose (its last findings first, then its longest lines; the
            # headings and the agent's place stay)
            # the lines quoting tool output give way too, past the share: the pins may take
            # all the room but the rest of the text's
            own_most = int(plan.summary_chars * OWN_FACTS_SHARE)
            rest = len(text) - _output_chars(result.text)
            beyond = max(0, plan.summary_chars - rest - 4 - own_most)
            most = min(self.pinned_max_chars, own_most + beyond)
            want, pinned_text = (
                _facts_room(text, plan, self.pinned_max_chars, beyond)
                if room < most
                else (room, "")
            )
            if room < want:
                need = len(pinned_text) - len(text.rstrip())
                short = need - (plan.summary_chars - len(text) - 4)  # the text may be over
                if short > 0:
                    inner = fit_text(
                        _without_output(result.text, short),
                        max(0, len(result.text) - short),
                    )
                    text = into_summary(inner, frontier, share, plan.request, kept)
                    room = min(self.pinned_max_chars, max(0, plan.summary_chars - len(text) - 4))
        text, pinned = pin(text, plan.removed, room, plan.kept, lost=plan.lost)
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
            meta={**result.meta, "frontier": frontier.to_json()},
        )


def _facts_room(text: str, plan: CompactionPlan, cap: int, beyond: int = 0) -> tuple[int, str]:
    """Chars the Pinned facts may take of ``plan``'s text budget beside ``text`` (at most
    ``cap``), and ``text`` with the section :func:`pin` makes in them:
    :data:`FACTS_SHARE` of the budget, or up to :data:`OWN_FACTS_SHARE` and ``beyond`` it
    (what the summarizer's lines quoting tool output hold, :func:`_output_chars`) as far as
    the lines of what the agent said and the user named need (listed first, they fill the
    share when they do not fit in it)."""
    share = min(cap, int(plan.summary_chars * FACTS_SHARE))
    most = min(cap, int(plan.summary_chars * OWN_FACTS_SHARE) + beyond)
    at_share, pinned = pin(text, plan.removed, share, plan.kept, lost=plan.lost)
    own = sum(len(e) for e in pinned.entries if _own_line(e))
    if own < share * 9 // 10 or most <= share:  # they fit, with room to spare: the share holds
        return share, at_share
    at_most, wider = pin(text, plan.removed, most, plan.kept, lost=plan.lost)
    own = sum(len(e) for e in wider.entries if _own_line(e))
    rest = sum(len(e) for e in pinned.entries if not _own_line(e))
    want = max(share, min(most, own + rest + 64))
    if want == most:
        return want, at_most
    return want, pin(text, plan.removed, want, plan.kept, lost=plan.lost)[0]


def _own_line(entry: str) -> bool:
    """A pinned entry lists values the agent said or the user named."""
    head = entry.strip().split(": ", 1)[0]
    return head.startswith("- ") and head.endswith((SAID_LABEL, ASKED_LABEL))


def _output_chars(text: str) -> int:
    """Chars of the lines of a summarizer's ``text`` that quote tool output (the offline
    summarizer's ``- `...` (kubectl_describe output)``): identifiers only a tool held, which
    give way to what the agent said and the user named beyond :data:`OWN_FACTS_SHARE`."""
    return sum(len(line) + 1 for line in text.splitlines() if QUOTED_OUTPUT.search(line))


def _without_output(text: str, short: int) -> str:
    """``text`` less its lines quoting tool output, the last first, until ``short`` chars went
    (or none is left): what gives way first when the pins need room from the prose."""
    lines = text.splitlines()
    quoted = [i for i, line in enumerate(lines) if QUOTED_OUTPUT.search(line)]
    gone = 0
    while quoted and gone < short:
        gone += len(lines[quoted[-1]]) + 1
        del lines[quoted.pop()]
    return "\n".join(lines)
