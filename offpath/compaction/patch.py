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

What a compaction is between its preparing and its applying: :class:`Prepared` (the
summary text and what the plan saw, kept as JSON in the job's row), and the two outcomes of
fitting it to the thread, :class:`Fitted` (the patch) or :class:`Stale`. Pure.

Fitting a prepared compaction to the thread as it is now (:func:`fit`: the checks, going
deeper and shortening to land under the target, the check at the swap; :func:`fit_now`, the
one way every apply calls it), and recognising one that has landed (:func:`landed`). Pure.

The patch puts the summary in the first removed message's place, a kept request's copy in
the second's, ``RemoveMessage`` for the rest, and shortens kept tool results while the
thread would be over its target.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    MessageLikeRepresentation,
    RemoveMessage,
    ToolMessage,
)
from langgraph.graph.message import add_messages

from offpath.compaction.accounting import content_text, message_chars
from offpath.compaction.budget import fit_summary, least_chars
from offpath.compaction.facts.pinning import pin, swap_check
from offpath.compaction.facts.sections import SINCE_HEADING
from offpath.compaction.fields import message_field
from offpath.compaction.frontier import KEPT_AFTER, one_line, pointer_line
from offpath.compaction.index import archive_index, index_room
from offpath.compaction.pairing import is_request, new_broken_turns
from offpath.compaction.planner import (
    CompactionPlan,
    extension,
    landing_bound,
    landing_chars,
    least_aim,
    request_cap_chars,
    step_chars,
    summary_budget_chars,
)
from offpath.compaction.settings import Settings
from offpath.compaction.shorten import (
    caps_for,
    digest,
    is_shortened,
    originals_of,
    shorten,
)
from offpath.compaction.standing import read_standing, standing_blocks, without_standing
from offpath.compaction.summary import (
    REQUEST_COPY,
    archived_as,
    build_summary_message,
    cite,
    compactions_of,
    fingerprint,
    summary_meta,
)

#: Reads the archived originals of messages shortened in place: archived ids -> the
#: originals found, by id (:func:`offpath.stores.archive.originals`, bound to a thread;
#: asked through :func:`~offpath.compaction.shorten.originals_of`).
Originals = Callable[[Sequence[str]], Mapping[str, BaseMessage]]


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
            tool_calls={str(m.id): len(message_field(m, "tool_calls") or []) for m in plan.removed},
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


def patched(messages: Sequence[BaseMessage], patch: Sequence[BaseMessage]) -> list[BaseMessage]:
    """``messages`` with ``patch`` applied as LangGraph's ``add_messages`` reducer applies it
    to a thread: a message whose id is known replaced in place, a ``RemoveMessage`` removing
    its id (``ValueError`` for an id not there), any other appended. A new list; neither
    argument is changed."""
    left: list[MessageLikeRepresentation] = [*messages]
    right: list[MessageLikeRepresentation] = [*patch]
    # typed for any message-like input and output: given two lists, it returns a list of
    # messages
    return cast("list[BaseMessage]", add_messages(left, right))


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


#: The least summary budget whose since-section heading says how it was made; below it the
#: short heading leaves its chars to the facts under it.
SHORT_HEADER_BUDGET = 8_000


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
    copy: bool = True,
    cap: int = 0,
) -> _Attempt:
    """The patch that removes ``gone`` (the summary in the first one's place, a kept request's
    copy in the second's) and shortens the plan's kept results, then more of them while the
    thread would be over ``target``; and the thread's size after it. ``copy`` False: the
    plan's request copy is left out (its turn went whole).

    The summary gets ``since`` (the sections added at the apply) and the archive's index
    (:func:`~offpath.compaction.index.archive_index`, over every message it replaces) before
    its last line, the recall note; then the whole message is fitted to ``cap`` chars (0: no
    bound) by :func:`~offpath.compaction.budget.fit_summary`."""
    removed_chars = sum(sizes[i] for i in gone)
    text = prepared.summary_text.rstrip()
    if KEPT_AFTER in text:
        # the Investigating line points at a request kept after the summary: one that goes
        # now (a later turn's apply took its turn whole, or the plan's copy stays out) is
        # quoted by its start again (``recall`` reads it whole), in its own words: the block
        # an agent framework sends with every user message is named once, by the frontier
        kept_copy = prepared.request_copy if copy else None
        blocks: tuple[str, ...] | None = None
        for mid in gone:
            cited = archived_as(by_id[mid])  # a request's copy: the request's id
            pointer = pointer_line(cited, KEPT_AFTER)
            if mid != kept_copy and by_id[mid].type == "human" and pointer in text:
                if blocks is None:
                    blocks = standing_blocks(messages, read_standing(text))
                words = content_text(by_id[mid].content)
                start = one_line(without_standing(words, blocks) or words)
                text = text.replace(pointer, f'{start} (whole: recall("{cite(cited)}"))')
    index = archive_index([by_id[i] for i in gone], index_room(cap), f"{text}\n{since}")
    sections = "\n\n".join(x for x in (since, index) if x)
    if sections:  # before the summary's last line, the recall note, when it has one
        body, sep, last = text.rpartition("\n\n")
        if sep and last.startswith("_") and last.endswith("_"):
            text = f"{body}\n\n{sections}\n\n{last}"
        else:
            text = f"{text}\n\n{sections}"
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
    content = fit_summary(str(summary.content), cap)
    if content != summary.content:
        summary = summary.model_copy(update={"content": content})
    patch: list[BaseMessage] = [summary]
    added = message_chars(summary)
    copy_of = prepared.request_copy if copy else None
    if copy_of is not None:
        source = by_id[copy_of]
        if copy_of in prepared.shorten:  # a long request: its copy is shortened, and cites it
            source = shorten(source, prepared.shorten[copy_of], recall=recall)
        request = HumanMessage(
            id=gone[1],
            content=source.content,
            name=source.name,
            additional_kwargs={**source.additional_kwargs, REQUEST_COPY: copy_of},
        )
        patch.append(request)
        added += message_chars(request)
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
            new = shorten(by_id[i], cap, recall=recall)
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


def fit(
    prepared: Prepared,
    messages: Sequence[BaseMessage],
    *,
    target: int | None = None,
    recall: bool = True,
    settings: Settings | None = None,
    outside_chars: int = 0,
    originals: Originals | None = None,
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
    target itself without ``settings``) is :class:`Stale` (re-plan it), unless what no cut
    removes nor shortens is over the floor and it at least halves the thread, as the planner
    takes such a compaction. None: no bound (an operator's "compact now").
    ``recall``: shortened results name the ``recall`` tool (the agent has it).
    ``originals``: reads the archived originals of messages offpath shortened in place, by
    id (those it cannot read left out): the since-section lists what a message that goes
    beyond the plan said before it was shortened (the agent's own words shortened over the
    threshold keep none of their facts). None: from the messages as they are.
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
    planned_ids = set(prepared.order)
    sizes = {m.id: message_chars(m) for m in messages}
    before = sum(sizes.values())
    bound = target
    # the thread's fixed part (its system prompts, in the thread and given to the agent): its
    # keep window, summary budget and least gain are the thread's (planner.thread_budget)
    outside = max(0, outside_chars)
    fixed = sum(sizes[m.id] for m in messages if m.type == "system") + outside
    if target is not None and settings is not None:  # what no compaction can remove
        copied = 0
        if copy_of is not None:
            copied = min(sizes[copy_of], prepared.shorten.get(copy_of, sizes[copy_of]))
        # aims for the headroom (the run's step size counted), lands under the floor at most
        bound = max(target, landing_bound(settings, fixed, copied))
        aim = landing_chars(settings, fixed, step_chars(messages), copied)
        target = max(min(target, aim), least_aim(settings, fixed, copied))
        # the attempts below count the thread alone
        bound, target = bound - outside, target - outside
    # the whole summary message's budget (DESIGN.md invariant 20): the thread's, or the one
    # its plan was made with
    cap = summary_budget_chars(settings, fixed) if settings is not None else prepared.summary_budget
    since = ""
    extra: list[str] = []
    # originals asked for so far, by message id (None: not archived); a deeper cut moves the
    # same messages again
    read: dict[str, BaseMessage | None] = {}

    def as_said(moved: list[BaseMessage]) -> list[BaseMessage]:
        """``moved`` with each message shortened in place as it was first (``originals``)."""
        wanted = [m for m in moved if is_shortened(m) and str(m.id) not in read]
        if wanted and originals is not None:
            read.update(dict.fromkeys(str(m.id) for m in wanted), **originals_of(wanted, originals))
        return [read.get(str(m.id)) or m for m in moved]

    copy = True  # a long request kept as a copy after the summary (the plan's request_copy)

    def assemble(gone: list[str], since: str, target: int | None) -> _Attempt:
        return _assemble(prepared, messages, by_id, gone, since, recall, target, sizes, copy, cap)

    def lonely_requests(last: int, grown: Sequence[int]) -> tuple[int, ...]:
        """``grown`` with the requests whose finished turns it takes whole: a request the plan
        kept in place goes with the rest of its answer; the plan's request copy is left out
        (``copy``) when its turn goes so. A request stays when its turn is the last one (in
        progress) or keeps some of its answer."""
        nonlocal copy
        gone = removed | {messages[i].id for i in grown}
        starts = [i for i, m in enumerate(messages) if is_request(m)]
        # no request left in the thread (the last one summarized): no turn to take whole
        ends = dict(zip(starts, [*starts[1:], None], strict=True)) if starts else {}
        extra = set(grown)
        for i in starts:
            end = ends[i]
            if end is None or messages[i].id in gone:
                continue
            body = [m for m in messages[i + 1 : end] if m.type != "system"]
            if body and all(m.id in gone for m in body):
                extra.add(i)
        if prepared.request_copy is not None and grown:
            tail_end = next((j for j in starts if j > last), None)
            tail = [m for m in messages[last + 1 : tail_end] if m.type != "system"]
            if tail_end is not None and tail and all(m.id in gone for m in tail):
                copy = False
        return tuple(sorted(extra))

    def deeper(newest_only: bool = False, shallowest: bool = False) -> tuple[list[str], str]:
        """The messages after the plan's removed part that may go too (up to the keep
        window, or with ``newest_only`` up to the newest model step; by whole turns, and
        open calls stay, so every call/result pair and every finished turn stays whole:
        :func:`~compaction.planner.extension`), and the since-section: the requests of the
        turns that go with their status, then their facts."""
        if settings is None:
            return [], ""
        last = max(i for i, m in enumerate(messages) if m.id in removed)
        grown = extension(
            messages,
            last + 1,
            settings,
            newest_only=newest_only,
            shallowest=shallowest,
            fixed=fixed,
        )
        grown = lonely_requests(last, grown)
        if not grown:
            return [], ""
        ids = [str(messages[i].id) for i in grown]
        moved = [messages[i] for i in grown]
        stay = [m for m in messages if m.id not in removed and m.id not in set(ids)]
        budget = summary_budget_chars(settings, fixed)
        room = max(400, budget // 3)
        # the instructions sent with every user message are named once, by the frontier
        blocks = standing_blocks(messages, read_standing(prepared.summary_text))
        asked = _requests_of(moved, room // 2, blocks)
        header = (
            f"{SINCE_HEADING} ({len(moved)} later messages, not summarized yet; their "
            "facts, by message; `recall` reads them):"
            if budget >= SHORT_HEADER_BUDGET
            else f"{SINCE_HEADING} ({len(moved)} later messages; `recall` reads them):"
        )
        # what the agent said and the user named on lines of their own: the summary keeps
        # them while it gives up the rest (budget.ORDER), the next one reads them back so
        text, _ = pin("", as_said(moved), room - len(asked), stay, header=header, stated_lines=True)
        text = text.strip() or f"{SINCE_HEADING} ({len(moved)} later messages archived)."
        if asked:
            heading, _, facts = text.partition("\n")
            text = "\n".join(x for x in (heading, asked, facts) if x)
        return ids, text

    def breaks_turns(attempt: _Attempt) -> bool:
        """The patch keeps a finished turn in part (DESIGN.md invariant 17): the plan cut
        into a turn that was in progress then and has ended since."""
        return bool(new_broken_turns(messages, patched(messages, attempt.patch)))

    # first as planned; over the target, first the messages that came after the plan go too
    # (the thread grew while the summary was written), then kept results are shortened
    attempt = assemble(present, since, None)
    if settings is not None and breaks_turns(attempt):
        # the plan cut into the turn then in progress, which has ended: the rest of it goes,
        # and so does its request where the plan kept it (in place, or as a copy)
        extra, since = deeper(shallowest=True)
        attempt = assemble(present + extra, since, None)
    if target is not None and attempt.after > target and settings is not None:
        more, more_since = deeper()
        if len(more) > len(extra):
            extra, since = more, more_since
            attempt = assemble(present + extra, since, None)
    if target is not None and attempt.after > target:
        gone = present + extra
        attempt = assemble(gone, since, target)
    if bound is not None and attempt.after > bound and settings is not None:
        # what the keep window holds cannot be shortened enough (a model's long messages)
        more, more_since = deeper(newest_only=True)
        if len(more) > len(extra):
            extra, since = more, more_since
            gone = present + extra
            attempt = assemble(gone, since, target)
    if bound is not None and attempt.after > bound and settings is not None:
        # a long request that came after the plan (the next task's prompt, sent while the
        # summary was written) stays, as every request of the turn in progress does; it is
        # shortened as the plan shortens a long request it keeps (its original archived,
        # ``recall`` reads the rest), rather than leaving the compaction stale and the thread
        # over its threshold until another summary is written
        late = _late_request_caps(messages, planned_ids, extra, request_cap_chars(settings, fixed))
        if late:
            prepared = dataclasses.replace(prepared, shorten={**prepared.shorten, **late})
            attempt = assemble(present + extra, since, target)
    if bound is not None and attempt.after > bound:
        if settings is None or attempt.after > before // 2:
            return Stale(
                f"it would leave the thread at {attempt.after} chars, over {bound} "
                "(its prepare floor) even with kept tool results shortened"
            )
        # what no cut removes nor shortens (the newest model step, its results at their
        # floor) is over the floor already: as the planner takes such a compaction
        # (planner.lands), the deepest there is, applied when it at least halves the thread;
        # stale, it would leave the thread growing with every step, each call masked, until
        # calls went over the hard limit (DESIGN.md invariant 9)
        bound = attempt.after
    # the check before the swap (DESIGN.md invariant 16): what the messages written meanwhile
    # name that only the removed part held is pinned, or the compaction is prepared again.
    # Those messages count whether they stay or went to the since-section: naming an id is
    # not holding its context, and the since-section lists the naming message, not the line.
    # The pins are counted in the landing budget: they may take what the prepare floor leaves
    # free (at least a quarter of a summary's budget, at most a whole one; a thread that
    # needs them gives up some of its headroom rather than their identifiers). When they do not fit,
    # or their section would leave the thread over its target, the compaction goes deeper
    # first (the messages that came since its plan go too, as for an ordinary overflow: a
    # fast run's thread can run away to 2x its threshold on stale retries), and is stale only
    # when no deeper cut exists.
    planned = set(prepared.order)
    later = [m for m in messages if m.id not in planned and m.type != "system"]
    checked = 0
    while later:
        gone = present + extra
        gone_set = set(gone)
        later_ids = {m.id for m in later}
        kept = [m for m in messages if m.id not in gone_set and m.id not in later_ids]
        # the section takes what the summary's other parts give up for it (all but the
        # agent's place, its decisions, the quoted request and an index line: budget.ORDER)
        content = str(attempt.summary.content)
        room = cap - least_chars(content) - 2 if cap else 1_000
        if bound is not None:
            room = min(room, bound - attempt.after + len(content) - least_chars(content) - 2)
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
            fitted = assemble(gone, with_section, target)
            if not _holds(str(fitted.summary.content), section):
                problem = (
                    "the identifiers named since the summary was written do not fit its budget"
                )
            elif bound is None or fitted.after <= bound:
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
        attempt = assemble(present + extra, since, target)
        if bound is not None and attempt.after > bound:
            return Stale(
                f"{problem}; going deeper would leave the thread at {attempt.after} chars, "
                f"over {bound} (its prepare floor): prepare it again"
            )
    gone = present + extra
    if broken := new_broken_turns(messages, patched(messages, attempt.patch)):
        return Stale(
            f"it would keep turns in part ({', '.join(sorted(broken)[:3])}); prepare it again"
        )
    record = {
        "summary_id": attempt.summary.id,
        "summary_sha": fingerprint(attempt.summary),
        "messages_removed": len(gone),
        "chars_removed": sum(sizes[i] for i in gone),
        "tool_calls_removed": sum(len(message_field(by_id[i], "tool_calls") or []) for i in gone),
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


def fit_now(
    prepared: Prepared,
    messages: Sequence[BaseMessage],
    settings: Settings,
    *,
    force: bool = False,
    outside_chars: int = 0,
    recall: bool = True,
    originals: Originals | None = None,
) -> Fitted | Stale:
    """``prepared`` fitted to the thread's ``messages`` as it is now, the one way a compaction
    is fitted before it is applied (by the worker, the post-turn hook, the middleware, and
    :func:`offpath.compaction.pipeline.compact`): it lands the thread under its prepare floor
    (:func:`~compaction.planner.landing_chars` of ``settings``), or with no bound when an
    operator asked for it (``force``: "compact now"). ``outside_chars``: what each model call
    sends besides the thread (a system prompt given to ``create_agent``, which the job
    carries); ``recall``: shortened results name the ``recall`` tool; ``originals``: reads
    the originals of messages shortened in place. See :func:`fit`."""
    return fit(
        prepared,
        messages,
        target=None if force else landing_chars(settings),
        recall=recall,
        settings=settings,
        outside_chars=outside_chars,
        originals=originals,
    )


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


def _holds(content: str, section: str) -> bool:
    """Every entry of the swap check's ``section`` is a line of the summary's ``content``."""
    lines = {" ".join(x.split()) for x in content.split("\n")}
    entries = [" ".join(x.split()) for x in section.split("\n")[1:] if x.startswith("- ")]
    return all(e in lines for e in entries)


def _requests_of(moved: Sequence[BaseMessage], room: int, blocks: Sequence[str] = ()) -> str:
    """Lines for the turns among ``moved`` (the messages a late apply removes beyond its
    plan), in at most ``room`` chars: the rest of a turn begun before them (the one the plan
    cut into, its request quoted above) and each request, with its status (answered: a model message follows it among
    them) and where ``recall`` reads it whole. A request leaves the model's view only with its
    answer, and the summary says so (DESIGN.md invariant 17). Quotes shrink (the answers' first,
    then the requests') until every turn fits; past that, the newest turns are listed and the
    older ones counted. A request is quoted without the standing ``blocks`` it holds
    (:func:`~offpath.compaction.standing.without_standing`)."""
    starts = [i for i, m in enumerate(moved) if is_request(m)]
    spans: list[tuple[int | None, int, int]] = (
        [(None, 0, starts[0] if starts else len(moved))] if not starts or starts[0] else []
    )
    ends = [*starts[1:], len(moved)]
    spans += [(i, i + 1, ends[k]) for k, i in enumerate(starts)]

    def answer_of(begin: int, end: int) -> BaseMessage | None:
        return next(
            (
                m
                for m in reversed(moved[begin:end])
                if isinstance(m, AIMessage) and not m.tool_calls and content_text(m.content).strip()
            ),
            None,
        )

    def line(request: int | None, begin: int, end: int, quote: int, answer: int) -> str | None:
        found = answer_of(begin, end)
        if request is None:
            return f"- The turn quoted above ended: {_quoted(found, quote)}" if found else None
        answered = any(isinstance(x, AIMessage) for x in moved[begin:end])
        text = f"- Request ({'answered' if answered else 'not answered yet'}): "
        text += _quoted(moved[request], quote, blocks)
        if found is not None and answer:
            text += f"; answer: {_quoted(found, answer)}"
        return text

    for quote, answer in ((120, 80), (120, 0), (60, 0), (30, 0)):
        lines = [x for span in spans if (x := line(*span, quote, answer)) is not None]
        if sum(len(x) + 1 for x in lines) <= room:
            return "\n".join(lines)
    kept: list[str] = []
    left = room - 60  # the count of the turns left out
    for x in reversed(lines):
        if len(x) + 1 > left:
            break
        kept.insert(0, x)
        left -= len(x) + 1
    if len(kept) < len(lines):
        kept.insert(0, f"- {len(lines) - len(kept)} earlier turn(s) went too (`recall` finds them)")
    return "\n".join(kept)


def _quoted(message: BaseMessage, limit: int = 120, blocks: Sequence[str] = ()) -> str:
    """``"<the message's text, clipped>" (recall("<its id>"))``, the standing ``blocks`` it
    holds left out."""
    text = content_text(message.content)
    if blocks:
        text = without_standing(text, blocks) or text
    text = " ".join(text.split())
    quote = text if len(text) <= limit else text[: limit - 3].rsplit(" ", 1)[0] + "..."
    return f'"{quote}" (recall("{cite(archived_as(message))}"))'


def _late_request_caps(
    messages: Sequence[BaseMessage], planned: set[Any], gone: Sequence[str], cap: int
) -> dict[str, int]:
    """``{id: cap}`` for the requests that came after a compaction's plan (not among
    ``planned`` nor ``gone``) and are over ``cap`` chars: what a prepared compaction shortens
    as its plan shortens a long request it keeps."""
    gone_set = set(gone)
    return {
        str(m.id): cap
        for m in messages
        if is_request(m) and m.id not in planned and m.id not in gone_set and message_chars(m) > cap
    }
