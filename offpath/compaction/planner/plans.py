"""What planning a compaction returns: a :class:`CompactionPlan` (what is removed, what is
kept, the request quoted or kept, the results to shorten, the sizes), or a :class:`Skip` with
its :class:`SkipReason`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from langchain_core.messages import BaseMessage

from offpath.compaction.summary.message import is_summary


class SkipReason(StrEnum):
    """Why a thread is not compacted now."""

    DISABLED = "disabled"
    UNDER_THRESHOLD = "under_threshold"
    NO_CUT_POINT = "no_cut_point"
    TOO_FEW_MESSAGES = "too_few_messages"
    NO_PROGRESS = "no_progress"
    #: a message has no id (``None`` or ``""``): nothing could remove it, nor fit a summary
    #: around it (offpath's API refuses such a message; a user's own agent may hold one)
    MISSING_IDS = "missing_ids"


@dataclass(frozen=True, slots=True)
class Skip:
    """No compaction: ``reason`` names why, ``detail`` says it for a log line.
    ``total_chars``: the thread's size as planned (its fixed part counted); ``worth_at``: the
    size from which a compaction could be worth it (0: not known)."""

    reason: SkipReason
    detail: str
    total_chars: int = 0
    worth_at: int = 0


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """One planned compaction of a thread.

    ``removed`` are replaced by the summary (earlier summaries included, in
    thread order); ``kept`` are the non-system messages that stay, in order;
    system messages are in neither and are never touched. ``order`` is the ids of
    every non-system message the plan saw, in thread order (used to check the
    plan against the thread before it is applied). Sizes are in chars.
    """

    cut: int
    boundary: Literal["turn", "tool_group"]
    removed: tuple[BaseMessage, ...]
    kept: tuple[BaseMessage, ...]
    order: tuple[str, ...]
    request: str | None
    total_chars: int
    removed_chars: int
    estimated_chars_after: int
    threshold_chars: int
    #: the request of the turn cut into, kept as its own message: the id of the removed
    #: request message (the first removed, whose place the summary takes) that a copy of it
    #: re-enters the thread for, in the second removed message's place; None: no copy
    request_copy: str | None = None
    #: kept tool results to shorten, by message id: their cap in chars; and the request kept
    #: as its own message (``request_copy``'s id for a copy, else its own), when it is over
    #: :func:`request_cap_chars`
    shorten: tuple[tuple[str, int], ...] = ()
    #: chars the summary text and its pinned facts may use (the summary budget less the
    #: summary's prefix line, its recall line and a quoted request)
    summary_chars: int = 0
    #: most chars of the whole summary message (the thread's budget,
    #: :func:`~offpath.compaction.planner.thread_budget`; 0: no bound)
    summary_budget: int = 0

    @property
    def fits(self) -> bool:
        """The thread is expected to be under the threshold after this compaction."""
        return self.estimated_chars_after <= self.threshold_chars

    @property
    def earlier_summaries(self) -> tuple[BaseMessage, ...]:
        """The summaries of earlier compactions that this one folds in."""
        return tuple(m for m in self.removed if is_summary(m))

    @property
    def kept_chars(self) -> int:
        """Chars that stay: everything but what is removed."""
        return self.total_chars - self.removed_chars

    @property
    def summary_id(self) -> str:
        """The id the summary takes: the first removed message's (DESIGN.md invariant 2)."""
        return str(self.removed[0].id)
