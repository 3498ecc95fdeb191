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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, RemoveMessage, ToolMessage

from offpath.compaction.accounting import message_chars
from offpath.compaction.digest import digest
from offpath.compaction.facts import SINCE_HEADING, pin, swap_check
from offpath.compaction.planner import (
    CompactionPlan,
    _least_landing,
    extension,
    landing_bound,
    landing_chars,
    step_chars,
    summary_budget_chars,
)
from offpath.compaction.settings import Settings
from offpath.compaction.shorten import caps_for, shorten
from offpath.compaction.summary import (
    build_summary_message,
    compactions_of,
    fingerprint,
    summary_meta,
)

__all__ = ["Fitted", "Prepared", "Stale", "digest", "fit", "landed"]

#: ``additional_kwargs`` key of the copy of a long request kept as its own message: the id of
#: the request message it copies (issue 18, item 2).
REQUEST_COPY = "offpath_request_of"


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
    #: frontier: issue 19)
    meta: Mapping[str, Any] = field(default_factory=dict)

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


def fit(
    prepared: Prepared,
    messages: Sequence[BaseMessage],
    *,
    target: int | None = None,
    recall: bool = True,
    settings: Settings | None = None,
    outside_chars: int = 0,
) -> Fitted | Stale:
    """``prepared`` checked against the thread's ``messages`` now (see the module doc).
    ``outside_chars``: what each model call sends besides the thread (a system prompt given
    to ``create_agent``), counted with it against ``target`` and the floor.

    ``target``: where the thread should land once the compaction is in
    (:func:`~compaction.planner.landing_chars`: under its prepare floor with headroom; with
    ``settings``, lowered further for a run with large steps, :func:`~compaction.planner.
    step_chars`). To get there, the messages that came since the plan (a fast run grew while
    the summary was written) are removed as well, up to the keep window (``settings``' keep
    chars), their facts listed under :data:`~compaction.facts.SINCE_HEADING` in the summary
    (LLM-free, each naming its message for ``recall``; human messages and open calls stay);
    then kept tool results are shortened, largest first. A compaction that cannot get under
    the prepare floor (:func:`~compaction.planner.landing_bound`, DESIGN.md invariant 13; the
    target itself without ``settings``) is :class:`Stale` (re-plan it). None: no bound (an
    operator's "compact now").
    ``recall``: shortened results name the ``recall`` tool (the agent has it).
    """
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
    copy_of = prepared.request_copy
    if copy_of is not None and (present[0] != copy_of or len(present) < 2):
        return Stale(f"the request {copy_of} to keep is no longer where the summary goes")
    sizes = {m.id: message_chars(m) for m in messages}
    before = sum(sizes.values())
    bound = target
    if target is not None and settings is not None:  # what no compaction can remove
        fixed = sum(sizes[m.id] for m in messages if m.type == "system")
        if copy_of is not None:
            fixed += min(sizes[copy_of], prepared.shorten.get(copy_of, sizes[copy_of]))
        # aims for the headroom (the run's step size counted), lands under the floor at most
        outside = max(0, outside_chars)
        fixed += outside
        bound = max(target, landing_bound(settings, fixed))
        aim = landing_chars(settings, fixed, step_chars(messages))
        target = max(min(target, aim), _least_landing(settings, fixed))
        # the attempts below count the thread alone
        bound, target = bound - outside, target - outside
    since = ""
    extra: list[str] = []

    def deeper(newest_only: bool = False) -> tuple[list[str], str]:
        """The messages after the plan's removed part that may go too (up to the keep
        window, or with ``newest_only`` up to the newest model step; human messages and open
        calls stay, and so every call/result pair stays whole:
        :func:`~compaction.planner.extension`), and the since-section of their facts."""
        if settings is None:
            return [], ""
        last = max(i for i, m in enumerate(messages) if m.id in removed)
        grown = extension(messages, last + 1, settings, newest_only=newest_only)
        if not grown:
            return [], ""
        ids = [str(messages[i].id) for i in grown]
        moved = [messages[i] for i in grown]
        stay = [m for m in messages if m.id not in removed and m.id not in set(ids)]
        room = max(400, summary_budget_chars(settings) // 3)
        header = (
            f"{SINCE_HEADING} ({len(moved)} later messages, not summarized yet; their "
            "facts, by message; `recall` reads them):"
        )
        text, _ = pin("", moved, room, stay, header=header)
        return ids, text.strip() or f"{SINCE_HEADING} ({len(moved)} later messages archived)."

    # first as planned; over the target, first the messages that came after the plan go too
    # (the thread grew while the summary was written), then kept results are shortened
    attempt = _assemble(prepared, messages, by_id, present, since, recall, None, sizes)
    if target is not None and attempt.after > target and settings is not None:
        extra, since = deeper()
        if extra:
            attempt = _assemble(
                prepared, messages, by_id, present + extra, since, recall, None, sizes
            )
    if target is not None and attempt.after > target:
        gone = present + extra
        attempt = _assemble(prepared, messages, by_id, gone, since, recall, target, sizes)
    if bound is not None and attempt.after > bound and settings is not None:
        # what the keep window holds cannot be shortened enough (a model's long messages)
        more, more_since = deeper(newest_only=True)
        if len(more) > len(extra):
            extra, since = more, more_since
            gone = present + extra
            attempt = _assemble(prepared, messages, by_id, gone, since, recall, target, sizes)
    if bound is not None and attempt.after > bound:
        return Stale(
            f"it would leave the thread at {attempt.after} chars, over {bound} "
            "(its prepare floor) even with kept tool results shortened"
        )
    # the check before the swap (DESIGN.md invariant 16): what the messages written meanwhile
    # name that only the removed part held is pinned, or the compaction is prepared again.
    # Those messages count whether they stay or went to the since-section: naming an id is
    # not holding its context, and the since-section lists the naming message, not the line.
    # The pins are counted in the landing budget: they may take what the prepare floor leaves
    # free (at least a quarter of a summary's budget, at most a whole one; a thread that
    # needs them gives up some of its headroom rather than their identifiers). When they do not fit,
    # or their section would leave the thread over its target, the compaction goes deeper
    # first (the messages that came since its plan go too, as for an ordinary overflow:
    # issue 18, benchmark 17 saw a fast run's thread run away to 2.2x its threshold on
    # stale retries), and is stale only when no deeper cut exists.
    planned = set(prepared.order)
    later = [m for m in messages if m.id not in planned and m.type != "system"]
    checked = 0
    while later:
        gone = present + extra
        gone_set = set(gone)
        later_ids = {m.id for m in later}
        kept = [m for m in messages if m.id not in gone_set and m.id not in later_ids]
        room = max(400, summary_budget_chars(settings) // 4) if settings else 1_000
        if bound is not None and settings is not None:
            free = bound - attempt.after - 2  # the section's blank line
            room = max(room, min(summary_budget_chars(settings), free))
        removed_part = [by_id[i] for i in gone if i not in later_ids]
        section, unpinned = swap_check(later, removed_part, kept, prepared.summary_text, room)
        problem = None
        if unpinned:
            problem = (
                f"{unpinned} identifier(s) named since the summary was written are held only by "
                "the removed part and do not fit the summary"
            )
        elif section:
            with_section = f"{since}\n\n{section}".strip()
            fitted = _assemble(prepared, messages, by_id, gone, with_section, recall, target, sizes)
            if bound is None or fitted.after <= bound:
                checked = section.count("\n- ")
                since, attempt = with_section, fitted
                break
            problem = (
                "the identifiers pinned at the swap would leave the thread over "
                f"{bound} (its prepare floor)"
            )
        else:
            break
        more, more_since = ([], "") if extra else deeper()
        if len(more) <= len(extra):  # into the keep window, up to the newest step
            more, more_since = deeper(newest_only=True)
        if len(more) <= len(extra):  # no deeper cut: prepare it again on the thread as it is
            return Stale(f"{problem}, and no deeper cut exists: prepare it again")
        extra, since = more, more_since
        attempt = _assemble(
            prepared, messages, by_id, present + extra, since, recall, target, sizes
        )
        if bound is not None and attempt.after > bound:
            return Stale(
                f"{problem}; going deeper would leave the thread at {attempt.after} chars, "
                f"over {bound} (its prepare floor): prepare it again"
            )
    gone = present + extra
    record = {
        "summary_id": attempt.summary.id,
        "summary_sha": fingerprint(attempt.summary),
        "messages_removed": len(gone),
        "chars_removed": sum(sizes[i] for i in gone),
        "tool_calls_removed": sum(len(getattr(by_id[i], "tool_calls", None) or []) for i in gone),
        "summarizer": prepared.summarizer,
        "model": prepared.model,
        "chars_before": before,
        "chars_after": attempt.after,
        "summary_chars": message_chars(attempt.summary),
        "shortened": sorted(attempt.shortened),
        "request_copy": copy_of,
        "since_summary": len(extra),
        "checked_at_swap": checked,
    }
    return Fitted(
        attempt.summary, attempt.patch, record, tuple(gone), tuple(sorted(attempt.shortened))
    )


@dataclass(frozen=True, slots=True)
class _Attempt:
    summary: HumanMessage
    patch: list[BaseMessage]
    shortened: dict[str, BaseMessage]
    after: int


def _assemble(
    prepared: Prepared,
    messages: Sequence[BaseMessage],
    by_id: Mapping[Any, BaseMessage],
    gone: list[str],
    since: str,
    recall: bool,
    target: int | None,
    sizes: Mapping[Any, int],
) -> _Attempt:
    """The patch that removes ``gone`` (the summary in the first one's place, a kept request's
    copy in the second's) and shortens the plan's kept results, then more of them while the
    thread would be over ``target``; and the thread's size after it."""
    removed_chars = sum(sizes[i] for i in gone)
    text = prepared.summary_text.rstrip()
    if since:  # before the summary's last line, the recall note, when it has one
        body, sep, last = text.rpartition("\n\n")
        if sep and last.startswith("_") and last.endswith("_"):
            text = f"{body}\n\n{since}\n\n{last}"
        else:
            text = f"{text}\n\n{since}"
    summary = build_summary_message(
        message_id=gone[0],
        summary_text=text,
        replaced_ids=gone,
        replaced_chars=removed_chars,
        summarizer=prepared.summarizer,
        compactions=prepared.compactions,
        request=prepared.request,
        extra={**prepared.meta, "job_id": prepared.job_id, "model": prepared.model},
    )
    patch: list[BaseMessage] = [summary]
    added = message_chars(summary)
    copy_of = prepared.request_copy
    if copy_of is not None:
        source = by_id[copy_of]
        if copy_of in prepared.shorten:  # a long request: its copy is shortened, and cites it
            source = shorten(source, prepared.shorten[copy_of], recall=recall)  # type: ignore[arg-type]
        copy = HumanMessage(
            id=gone[1],
            content=source.content,
            additional_kwargs={**source.additional_kwargs, REQUEST_COPY: copy_of},
        )
        patch.append(copy)
        added += message_chars(copy)
    patch += [RemoveMessage(id=i) for i in gone[1 if copy_of is None else 2 :]]
    after = sum(sizes.values()) - removed_chars + added
    gone_set = set(gone)
    kept_results = {
        str(m.id): sizes[m.id]
        for m in messages
        if m.id not in gone_set and (isinstance(m, ToolMessage) or m.id in prepared.shorten)
    }
    caps = {i: c for i, c in prepared.shorten.items() if i in kept_results}
    shortened: dict[str, BaseMessage] = {}

    def apply_caps() -> int:
        for i, cap in caps.items():
            if i in shortened and message_chars(shortened[i]) <= cap:
                continue
            new = shorten(by_id[i], cap, recall=recall)  # type: ignore[arg-type]
            if new is not by_id[i]:
                shortened[i] = new
        return sum(kept_results[i] - message_chars(new) for i, new in shortened.items())

    saved = apply_caps()
    if target is not None and after - saved > target:
        more = caps_for(  # tool results only: a kept request is shortened to its cap, no lower
            [
                (i, message_chars(shortened.get(i, by_id[i])))
                for i in kept_results
                if isinstance(by_id[i], ToolMessage)
            ],
            after - saved - target,
        )
        for i, cap in more.items():
            caps[i] = min(cap, caps.get(i, cap))
        saved = apply_caps()
    patch += list(shortened.values())
    return _Attempt(summary, patch, shortened, after - saved)


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
