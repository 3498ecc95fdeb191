"""The checkpoint patch: a prepared compaction, checked against the thread, as an update. Pure.

The update goes to the thread's ``messages`` channel through LangGraph's
``add_messages`` reducer, which replaces a message whose id it knows in place and
appends one with a new id at the END. So the summary takes the id of the first
removed message and lands where the removed part began; every other removed
message gets a ``RemoveMessage``. Afterwards the thread reads: system prompt
(untouched), summary, kept messages in their original order, then whatever was
appended since the plan was made (DESIGN.md invariants 1-2).

The summary is written with no lock held, while the thread may move on: a tool
result lands, a turn is appended, an agent run holds the thread. So the work is
split as in a double buffer (DESIGN.md, "Compaction during a run"): the worker
*prepares* (plans and summarizes), and the compaction is *applied* later, by
whoever holds the thread when it is over its threshold (the worker itself, the
post-turn hook, or the middleware at the next model call of a run).

:class:`Prepared` is what is kept in between (as JSON in the job's row): the
summary text, the plan's message ids in thread order, and a digest of every
message the plan saw. :func:`fit` checks it against the thread as it is now and
returns the patch, or :class:`Stale` (``RemoveMessage`` of a missing id raises
``ValueError`` in ``add_messages``, so a re-run must fit against the current
thread; DESIGN.md invariant 4):

* removed messages already gone are dropped from the compaction;
* none left (it was applied already): stale;
* a removed or kept message changed (its digest) or is gone, or a message was
  inserted or moved among them: stale;
* messages appended after the kept ones (turns and tool results that came while
  the summary was written) are fine: they stay after the kept messages.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from langchain_core.messages import BaseMessage, HumanMessage, RemoveMessage

from offpath.compaction.planner import CompactionPlan
from offpath.compaction.summary import (
    build_summary_message,
    compactions_of,
    fingerprint,
    summary_meta,
)


@dataclass(frozen=True, slots=True)
class Stale:
    """The compaction no longer fits the thread; ``reason`` says how. Re-plan or drop it."""

    reason: str


def digest(message: BaseMessage) -> str:
    """A short digest of what a message says (type, content, tool calls, tool-call id, name):
    two processes compute the same for the same message. 16 hex chars."""
    parts = [
        message.type,
        message.content,
        getattr(message, "tool_calls", None) or None,
        getattr(message, "tool_call_id", None),
        message.name,
    ]
    raw = orjson.dumps(parts, default=str, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


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

    @classmethod
    def from_plan(
        cls, plan: CompactionPlan, *, job_id: str, summary_text: str, summarizer: str, model: str
    ) -> Prepared:
        """The prepared form of ``plan`` with its summary text."""
        from offpath.compaction.accounting import message_chars

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
        )


@dataclass(frozen=True, slots=True)
class Fitted:
    """A prepared compaction fitted to the thread as it is: apply ``patch`` with
    ``add_messages``. ``record`` is offpath's own record of it (the usage event's source)."""

    summary: HumanMessage
    patch: list[BaseMessage]
    record: dict[str, Any]
    removed: tuple[str, ...] = ()  # ids of the messages it removes (archived with the patch)


def fit(prepared: Prepared, messages: Sequence[BaseMessage]) -> Fitted | Stale:
    """``prepared`` checked against the thread's ``messages`` now (see the module doc)."""
    by_id = {m.id: m for m in messages}
    present = [i for i in prepared.removed if i in by_id]
    if not present:
        return Stale("every message of the compaction is gone (applied already?)")
    removed = set(prepared.removed)
    for i in prepared.order:
        now = by_id.get(i)
        if now is None:
            if i in removed:
                continue
            return Stale(f"kept message {i} is gone")
        if digest(now) != prepared.digests.get(i):
            return Stale(f"message {i} changed since the summary was prepared")
    expected = [i for i in prepared.order if i in by_id]
    actual = [m.id for m in messages if m.type != "system"][: len(expected)]
    if actual != expected:
        return Stale("messages were inserted or reordered before the end of the kept part")
    removed_chars = sum(prepared.chars[i] for i in present)
    summary = build_summary_message(
        message_id=present[0],
        summary_text=prepared.summary_text,
        replaced_ids=present,
        replaced_chars=removed_chars,
        summarizer=prepared.summarizer,
        compactions=prepared.compactions,
        request=prepared.request,
        extra={"job_id": prepared.job_id, "model": prepared.model},
    )
    patch: list[BaseMessage] = [summary, *(RemoveMessage(id=i) for i in present[1:])]
    record = {
        "summary_id": summary.id,
        "summary_sha": fingerprint(summary),
        "messages_removed": len(present),
        "chars_removed": removed_chars,
        "tool_calls_removed": sum(prepared.tool_calls.get(i, 0) for i in present),
        "summarizer": prepared.summarizer,
        "model": prepared.model,
    }
    return Fitted(summary, patch, record, tuple(present))


def landed(messages: Sequence[BaseMessage], job_id: str, record: Mapping[str, Any] | None) -> bool:
    """The summary that ``record`` (a job's own record, from :func:`fit`) describes is in the
    thread ``messages``: offpath recognises its own compactions by it, never by a message's
    metadata alone (DESIGN.md invariant 10)."""
    if not record or "summary_id" not in record:
        return False
    for m in messages:
        if m.id == record["summary_id"]:
            return (
                summary_meta(m).get("job_id") == job_id
                and m.additional_kwargs.get("lc_source") == "summarization"
                and fingerprint(m) == record.get("summary_sha")
            )
    return False
