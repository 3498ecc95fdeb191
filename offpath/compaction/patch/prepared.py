"""What a compaction is between its preparing and its applying: :class:`Prepared` (the
summary text and what the plan saw, kept as JSON in the job's row), and the two outcomes of
fitting it to the thread, :class:`Fitted` (the patch) or :class:`Stale`. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage

from offpath.compaction.accounting import message_chars
from offpath.compaction.digest import digest
from offpath.compaction.planner.plans import CompactionPlan
from offpath.compaction.summary.message import compactions_of


@dataclass(frozen=True, slots=True)
class Stale:
    """The compaction no longer fits the thread; ``reason`` says how. Re-plan or drop it."""

    reason: str


@dataclass(frozen=True, slots=True)
class Prepared:
    """A compaction ready to apply: ``summary_text`` replaces the messages ``removed``.

    ``order`` is every non-system message id the plan saw, in thread order;
    ``chars`` and ``digests`` are keyed by id (removed and kept messages);
    ``tool_calls`` counts the calls each removed message made.
    """

    job_id: str
    summary_text: str
    summarizer: str
    model: str
    request: str | None
    compactions: int
    removed: tuple[str, ...]
    order: tuple[str, ...]
    chars: Mapping[str, int]
    digests: Mapping[str, str]
    tool_calls: Mapping[str, int]
    total_chars: int
    threshold_chars: int
    #: the removed request message a copy of which follows the summary (None: no copy)
    request_copy: str | None = None
    #: kept tool results to shorten when applied: message id -> cap (chars)
    shorten: Mapping[str, int] = field(default_factory=dict)
    #: what the summary message carries in its metadata beside offpath's own keys (the
    #: frontier)
    meta: Mapping[str, Any] = field(default_factory=dict)
    #: most chars of the whole summary message, from the plan (0: no bound)
    summary_budget: int = 0

    @classmethod
    def from_plan(
        cls,
        plan: CompactionPlan,
        *,
        job_id: str,
        summary_text: str,
        summarizer: str,
        model: str,
        meta: Mapping[str, Any] | None = None,
    ) -> Prepared:
        """The prepared form of ``plan`` with its summary text."""
        seen = (*plan.removed, *plan.kept)
        return cls(
            job_id=job_id,
            summary_text=summary_text,
            summarizer=summarizer,
            model=model,
            request=plan.request,
            compactions=1 + max(map(compactions_of, plan.earlier_summaries), default=0),
            removed=tuple(str(m.id) for m in plan.removed),
            order=plan.order,
            chars={str(m.id): message_chars(m) for m in plan.removed},
            digests={str(m.id): digest(m) for m in seen},
            tool_calls={str(m.id): len(getattr(m, "tool_calls", None) or []) for m in plan.removed},
            total_chars=plan.total_chars,
            threshold_chars=plan.threshold_chars,
            request_copy=plan.request_copy,
            shorten=dict(plan.shorten),
            meta=dict(meta or {}),
            summary_budget=plan.summary_budget,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "summary_text": self.summary_text,
            "summarizer": self.summarizer,
            "model": self.model,
            "request": self.request,
            "compactions": self.compactions,
            "removed": list(self.removed),
            "order": list(self.order),
            "chars": dict(self.chars),
            "digests": dict(self.digests),
            "tool_calls": dict(self.tool_calls),
            "total_chars": self.total_chars,
            "threshold_chars": self.threshold_chars,
            "request_copy": self.request_copy,
            "shorten": dict(self.shorten),
            "meta": dict(self.meta),
            "summary_budget": self.summary_budget,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Prepared:
        """Raises ``KeyError``/``TypeError`` for a record that is not a prepared compaction."""
        return cls(
            job_id=str(data["job_id"]),
            summary_text=str(data["summary_text"]),
            summarizer=str(data["summarizer"]),
            model=str(data["model"]),
            request=data.get("request"),
            compactions=int(data["compactions"]),
            removed=tuple(data["removed"]),
            order=tuple(data["order"]),
            chars=dict(data["chars"]),
            digests=dict(data["digests"]),
            tool_calls=dict(data["tool_calls"]),
            total_chars=int(data["total_chars"]),
            threshold_chars=int(data["threshold_chars"]),
            request_copy=data.get("request_copy"),
            shorten={str(k): int(v) for k, v in (data.get("shorten") or {}).items()},
            meta=dict(data.get("meta") or {}),
            summary_budget=int(data.get("summary_budget") or 0),
        )


@dataclass(frozen=True, slots=True)
class Fitted:
    """A prepared compaction fitted to the thread as it is: apply ``patch`` with
    ``add_messages``. ``record`` is offpath's own record of it (the usage event's source):
    what it removed, and the thread's size before and after it (``chars_before``,
    ``chars_after``)."""

    summary: HumanMessage
    patch: list[BaseMessage]
    record: dict[str, Any]
    removed: tuple[str, ...] = ()  # ids of the messages it removes (archived with the patch)
    shortened: tuple[str, ...] = ()  # ids of kept results it shortens (archived likewise)
