"""The checkpoint patch: check a plan against the thread as it is now, then build the update.

The update goes to the thread's ``messages`` channel through LangGraph's
``add_messages`` reducer. ``add_messages`` replaces a message whose id it knows
in place and appends one with a new id at the END, so the summary takes the id
of the first removed message and lands where the removed part began; every
other removed message gets a ``RemoveMessage``. Afterwards the thread reads:
system prompt (untouched), summary, kept messages in their original order,
then whatever was appended since the plan was made (DESIGN.md invariants 1-2).

``RemoveMessage`` of a missing id raises ``ValueError`` in ``add_messages``, so
:func:`reconcile` drops ids that are already gone and reports a plan that no
longer fits as :class:`Stale` (DESIGN.md invariant 4).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, RemoveMessage

from compaction.accounting import message_chars
from compaction.planner import CompactionPlan
from compaction.summary import build_summary_message, summary_meta


@dataclass(frozen=True, slots=True)
class Stale:
    """The plan no longer fits the thread; ``reason`` says how. Re-plan or skip."""

    reason: str


def reconcile(plan: CompactionPlan, current: Sequence[BaseMessage]) -> CompactionPlan | Stale:
    """``plan`` adjusted to the thread's ``current`` messages, or :class:`Stale`.

    * removed messages already gone are dropped from the plan;
    * none left (a re-run after the patch): stale;
    * a removed or kept message changed, a kept one gone, or a message inserted
      or moved among them: stale;
    * messages appended after the kept ones (turns taken while the job ran) are
      fine: they stay after the kept messages.
    """
    by_id = {m.id: m for m in current}
    present = [m for m in plan.removed if m.id in by_id]
    if not present:
        return Stale("every message of the plan is gone (already compacted?)")
    for m in (*present, *plan.kept):
        now = by_id.get(m.id)
        if now is None:
            return Stale(f"kept message {m.id} is gone")
        if now != m:
            return Stale(f"message {m.id} changed since the plan was made")
    expected = [i for i in plan.order if i in by_id]
    actual = [str(m.id) for m in current if m.type != "system"][: len(expected)]
    if actual != expected:
        return Stale("messages were inserted or reordered before the end of the kept part")
    if len(present) == len(plan.removed):
        return plan
    removed_chars = sum(message_chars(m) for m in present)
    return replace(
        plan,
        removed=tuple(present),
        removed_chars=removed_chars,
        estimated_chars_after=plan.estimated_chars_after - (plan.removed_chars - removed_chars),
    )


def summary_message(
    plan: CompactionPlan, summary_text: str, summarizer: str, extra: Mapping[str, Any] | None = None
) -> HumanMessage:
    """The summary message for ``plan``: it takes the first removed message's id.

    ``extra`` is merged into its metadata (the worker adds the job id and the usage).
    """
    earlier = [summary_meta(m) for m in plan.earlier_summaries]
    compactions = 1 + max((int(e.get("compactions", 1) or 1) for e in earlier), default=0)
    return build_summary_message(
        message_id=plan.summary_id,
        summary_text=summary_text,
        replaced_ids=[str(m.id) for m in plan.removed],
        replaced_chars=plan.removed_chars,
        summarizer=summarizer,
        compactions=compactions,
        request=plan.request,
        extra=extra,
    )


def build_patch(plan: CompactionPlan, summary: HumanMessage) -> list[BaseMessage]:
    """The update for the ``messages`` channel: the summary (replacing the first removed
    message in place), then a ``RemoveMessage`` for each other removed message."""
    if summary.id != plan.summary_id:
        raise ValueError("the summary must take the id of the first removed message")
    return [summary, *(RemoveMessage(id=str(m.id)) for m in plan.removed[1:])]


__all__ = ["Stale", "build_patch", "reconcile", "summary_message"]
