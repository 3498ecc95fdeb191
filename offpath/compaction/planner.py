"""Where to cut: plan one compaction of a thread's messages, or say why not.

Pure: no network, broker or database. :func:`plan_compaction` takes the
thread's messages and the settings and returns a :class:`CompactionPlan` or a
:class:`Skip` with a named :class:`SkipReason`; it never raises on a valid
message list.

The cut rule
------------
The *cut point* ``c`` is the index where the kept tail starts. Messages before
it (but system messages) are replaced by one summary; earlier summaries
anywhere are folded into it, so a thread never holds two.

1. Walk back from the end until the kept tail holds ``SUMMARIZATION_KEEP_CHARS``
   (the seed); ``w`` is that index.
2. A cut is *valid* when no tool-call pair straddles it (an AI message and all
   of its results, parallel calls included, stay on one side; DESIGN.md
   invariant 3). A result answers the nearest earlier unanswered call with its
   id (:mod:`compaction.pairing`), not the first call with that id (ids repeat
   across turns on some servers) and not the message right before it (a human
   message may come in between). A call still waiting for its result (pending,
   or left open by a later turn: a long-running call's result may come turns
   later) is never summarized away: its AI message and the results it already has
   stay where they are, and the compaction removes the messages around them
   (DESIGN.md invariant 14). Orphan results (answering no
   call) and earlier summaries are removed wherever they stand.
3. The seed's rule first: the last valid cut at or before ``w`` that starts a
   turn (a human message that is not a summary). It is taken when it is
   *worth it* (below) and brings the thread under the threshold.
4. Otherwise (one request followed by a long run of tool calls, as in the
   ``single-turn`` case and the mini-swe-agent transcripts) the last valid cut
   at or before ``w`` between complete tool-call groups, if worth it. The
   request of the turn it cuts into is then quoted word for word in the
   summary message (``CompactionPlan.request``), or, when it is longer than a
   quarter of the summary's budget, kept as its own message right after the
   summary (``CompactionPlan.request_copy``). A request kept that way
   (a copy, or in place when it is not the first message) holds at most
   :func:`request_cap_chars`: a longer one is shortened like a kept tool result (head,
   tail, the facts of the middle, and where ``recall`` reads it whole; the original is
   archived). A 5,663-char task prompt kept whole at 20,000 / 6,000 left no compaction
   able to land under the prepare floor, and the run was masked on a third of its calls
   (mini-swe django).
5. Else the turn-start cut if it is worth it, else a :class:`Skip`.

The keep window holds no more than its budget
---------------------------------------------
The seed's walk keeps *at least* ``SUMMARIZATION_KEEP_CHARS``, so one huge tool result in
the tail was kept whole, whatever its size. Kept tool results are now shortened
(:mod:`compaction.shorten`: head, tail, facts, how to read the rest; the original is
archived) until the kept part holds at most the keep window plus one tool result's
allowance (``TOOL_RESULT_MAX_CHARS``), and at most what leaves the thread under its
prepare floor with room for more steps once the summary is in (DESIGN.md invariant 13):
a cut is always possible.

Worth it, and the no-progress rule
----------------------------------
A cut is *worth it* when it removes at least :data:`MIN_MESSAGES_REMOVED`
messages (the seed: fewer than 4 is too little; fewer do when they hold at least the keep
window, as one pasted request of 19k chars or three steps of a model writing files do: a
SWE-agent task at a 20,000-char threshold waited for four messages while every call was over
it) and its *gain*, the chars it
removes (and saves by shortening) minus the size of the summary that replaces them, is at least
``(SUMMARIZATION_THRESHOLD_CHARS - SUMMARIZATION_KEEP_CHARS) // 4``
(:func:`min_gain_chars`; 10,000 chars at the defaults).

The thread's fixed part
-----------------------
What no compaction removes (the system prompts, in the thread or given to the agent:
``outside_chars``) counts once against the threshold: the keep window, the summary budget and
the gain floor above are the thread's (:func:`thread_budget`). The gain floor is measured
against the room the fixed part leaves; when the fixed part, the keep window and a whole
summary do not fit under the prepare floor, the keep window and the summary budget shrink for
that thread, down to its newest turn (for a long turn in progress, its newest step). A fixed
part over the threshold leaves every call over it: the thread is held at that part, its newest
turn and a summary (:attr:`ThreadBudget.over`, whose warning names the setting to change).

A cut is worth it only if the thread lands under its prepare floor with it
(DESIGN.md invariant 13), the summary counted at its most: kept tool results are
shortened to get there, and when what the keep window holds cannot be (a model's long
messages, a pasted log), the shallowest valid cut inside it that lands; a thread that still
cannot land (a fixed part over the floor) lands under :func:`landing_bound`, never as a
compaction that removes less than it costs. "Compact now"
(``force``) applies whatever removes more than its summary adds.

The gain floor is what stops a requeue loop: after a compaction, later turns
only re-plan the same small cut (the summary plus a few messages), whose gain
is under the floor, so the post-turn hook skips with
:attr:`SkipReason.NO_PROGRESS` instead of queueing a job per turn. A skip names the size
from which a compaction could be worth it (:attr:`Skip.worth_at`), which its claim keeps:
the next job comes then, not after a fixed growth.

What planning a compaction returns: a :class:`CompactionPlan` (what is removed, what is
kept, the request quoted or kept, the results to shorten, the sizes), or a :class:`Skip` with
its :class:`SkipReason`.

The sizes a compaction is planned with: one thread's keep window, summary budget and least
gain, fitted to its fixed part (:func:`thread_budget`); where a compaction lands the thread
(its prepare floor, with headroom), the thread's growth per step, the keep window of a plan
made early, the budget of a request kept as its own message, and the lead a job needs on a
thread growing at a given rate (:func:`lead_chars`). Every size is in chars.

The cut rule (above): :func:`plan_compaction` chooses where to cut a thread,
or says why not, and :func:`extension` finds what a compaction applied late may remove
as well.

Both read one forward pass over the thread's messages (:class:`_Scan`: sizes, kinds,
tool-call pairs, the valid cuts and the messages kept in place), and what cutting at one
index would remove, keep, quote and shorten (:class:`_Candidate`), built into a plan.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import accumulate
from typing import Literal, TypeGuard

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from offpath.compaction.accounting import content_text, message_chars, text_only
from offpath.compaction.facts.extraction import Fact
from offpath.compaction.pairing import CallPairer, call_ids
from offpath.compaction.settings import MIN_SHORTENED_CHARS, Settings
from offpath.compaction.shorten import MIN_SAVING_CHARS, caps_for, saving
from offpath.compaction.standing import read_standing, standing_blocks, without_standing
from offpath.compaction.summary import is_summary, overhead_chars, summary_request


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
    #: facts the thread's earlier compactions took out of view, from their loss reports
    #: (offpath's own records, which the worker reads): what the agent said or the user
    #: named of them, nothing in view holding it, the fact guard pins again
    #: (:func:`~offpath.compaction.facts.pinning.pin`); empty: none known
    lost: tuple[Fact, ...] = ()

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


#: The smallest budget a summary message gets, whatever the threshold or the chars it
#: replaces: its prefix and recall lines, and the template's four headings with a few words.
MIN_SUMMARY_CHARS = 300
#: The least budget of a summary message where the keep window leaves room for it
#: (:func:`summary_budget_chars`): the template, the agent's place, the recall line and a few
#: hundred chars of pinned facts.
SMALL_SUMMARY_CHARS = 1_400
#: Model steps of headroom a compaction aims to leave under the prepare floor
#: (:func:`landing_chars`: "room for at least several more steps").
HEADROOM_STEPS = 3
#: The least share of the keep window a plan made under the threshold keeps
#: (:func:`early_keep_chars`): a plan made well before the crossing (an adaptive prepare
#: point) still keeps the last steps the summary would otherwise have to carry.
EARLY_KEEP_SHARE = 0.5
#: Seconds a job takes beyond its summarizer: publish, a worker taking it, the thread read
#: (for a run, the checkpoint catching up with it), the result stored.
JOB_OVERHEAD_S = 1.5
#: Weight of the newest sample in a thread's growth rate (an exponential moving average).
RATE_WEIGHT = 0.5
#: Margin on the growth a job's time spans: a thread's pace varies from step to step.
LEAD_MARGIN = 1.25


@dataclass(frozen=True, slots=True)
class ThreadBudget:
    """The sizes one thread is compacted with (chars), from :func:`thread_budget`: its
    ``fixed`` part (system prompts, in the thread or given to the agent: no compaction removes
    them), the ``keep`` window, the ``summary`` budget (the whole summary message) and the
    ``min_gain`` a compaction must bring, with the settings' ``threshold`` and prepare
    ``floor``."""

    threshold: int
    floor: int
    fixed: int
    keep: int
    summary: int
    min_gain: int
    #: the settings' own keep window, before the fixed part was counted
    keep_setting: int
    #: the least threshold at which the fixed part, that keep window and a whole summary fit
    #: under the prepare floor (rounded up to a thousand chars; 0: unknown)
    advised: int = 0

    @property
    def shrunk(self) -> bool:
        """The keep window is smaller than the setting's: the fixed part left no room for it."""
        return self.keep < self.keep_setting

    @property
    def over(self) -> bool:
        """The fixed part alone is over the threshold: every model call is, whatever a
        compaction removes (only a higher threshold or a shorter prompt changes that)."""
        return self.fixed > self.threshold

    def warning(self) -> str:
        """One line for the operator (:attr:`over`): the sizes and the setting to change."""
        return (
            f"the fixed part of this thread (system prompt and what no compaction removes) "
            f"is {self.fixed:,} chars, over the {self.threshold:,}-char threshold: every model "
            "call is over it; the thread is held at that part, its newest turn and a summary. "
            f"Set SUMMARIZATION_THRESHOLD_CHARS to at least {self.advised:,} (the fixed part, "
            f"the {self.keep_setting:,}-char keep window and a summary under the prepare "
            "floor) or shorten the system prompt"
        )


def thread_budget(settings: Settings, fixed: int = 0) -> ThreadBudget:
    """The keep window, summary budget and least gain of a thread whose ``fixed`` part
    (chars: its system prompts, in the thread or given to the agent) no compaction removes.

    The rule: the fixed part counts once, against the threshold. The least gain is measured
    against the room it leaves, ``(threshold - keep) / 4`` x ``(threshold - fixed) /
    threshold`` (at least a sixteenth of the threshold less the keep window). While the fixed
    part, the keep window and a whole summary fit under the prepare floor, the keep window and
    the summary budget are the settings'. Past that, both shrink in proportion, by the
    overshoot and up to one least gain more (headroom, so that the next compaction can be
    worth it before the threshold), down to nothing: the planner then keeps the newest turn
    (for a long turn in progress, its newest step), and the summary keeps at least
    :data:`SMALL_SUMMARY_CHARS`. Settings whose keep window and summary do not fit under
    their floor without a fixed part (the seed's 500 / 200 try-out) shrink by the fixed part
    alone.

    Why: at 60,000 / 20,000 a 32,547-char system prompt, the keep window and a summary filled
    0.93x of the threshold; every job ended ``no_progress`` until the thread was at 73k, and
    calls reached 1.3x."""
    threshold, floor = settings.summarization_threshold_chars, settings.prepare_floor_chars
    keep = settings.summarization_keep_chars
    summary, gain = _summary_setting(settings), max(1, (threshold - keep) // 4)
    fixed = max(0, fixed)
    share = settings.summarization_prepare_at - settings.summary_max_share
    advised = -(-int((fixed + keep) / share) // 1_000) * 1_000 if share > 0 else 0
    if not fixed:
        return ThreadBudget(threshold, floor, 0, keep, summary, gain, keep, advised)
    room = max(0, threshold - fixed)
    gain = max(1, gain // 4, gain * room // max(1, threshold))
    overshoot = fixed - max(0, floor - keep - summary)
    if overshoot <= 0:
        return ThreadBudget(threshold, floor, fixed, keep, summary, gain, keep, advised)
    both = keep + summary
    left = max(0, both - overshoot - min(gain, overshoot))
    return ThreadBudget(
        threshold,
        floor,
        fixed,
        keep * left // both,
        max(min(summary, SMALL_SUMMARY_CHARS), summary * left // both),
        gain,
        keep,
        advised,
    )


def min_gain_chars(settings: Settings, fixed: int = 0) -> int:
    """The least net reduction (chars) a compaction of a thread with a ``fixed`` part must
    bring (:func:`thread_budget`); see the module doc."""
    return thread_budget(settings, fixed).min_gain


def landing_bound(settings: Settings, fixed: int = 0, kept: int = 0) -> int:
    """The most chars a thread may hold once a compaction is applied (DESIGN.md invariant
    13): its prepare floor. When what no compaction removes (``fixed``: the system prompt, a
    long request kept as a message) and the keep window leave no room for a summary under
    it (a small threshold; the seed's 500 / 200 try-out, where its own example kept 384
    chars and wrote a 312-char summary), no compaction could meet that: those, and twice the
    smallest summary, so that such a setting still compacts as the seed shows. A compaction
    that cannot get under :func:`landing_chars` is still applied under this bound. ``kept``: a
    request kept as its own message (chars), which no compaction removes either; the thread's
    budget (:func:`thread_budget`) is ``fixed``'s alone."""
    return max(settings.prepare_floor_chars, _least_landing(settings, fixed, kept))


def _least_landing(settings: Settings, fixed: int, kept: int = 0) -> int:
    budget = thread_budget(settings, fixed)
    keep = budget.keep
    if fixed or kept:  # and room for the keep window's last group and a whole summary
        keep += settings.tool_result_limit_chars // 2 + budget.summary
    return fixed + kept + keep + 2 * MIN_SUMMARY_CHARS


def least_aim(settings: Settings, fixed: int = 0, kept: int = 0) -> int:
    """The lowest a compaction aims to land a thread (chars): its ``fixed`` part, a request
    ``kept`` as its own message, the keep window and a whole summary (:func:`thread_budget`);
    lower would cut into the keep window itself."""
    budget = thread_budget(settings, fixed)
    return fixed + kept + budget.keep + budget.summary


def prepare_from_chars(settings: Settings, fixed: int = 0) -> int:
    """The size (chars, the ``fixed`` part counted) from which a job may be queued for a
    thread: its prepare floor, or, when its fixed part is that large, where a compaction lands
    it at least (:func:`least_aim`) and a least gain above: under that no compaction is worth
    it, and a thread whose fixed part is over its floor would be asked at every call."""
    aim = least_aim(settings, fixed) + thread_budget(settings, fixed).min_gain
    return max(settings.prepare_floor_chars, aim)


def landing_chars(settings: Settings, fixed: int = 0, step: int = 0, kept: int = 0) -> int:
    """Where a compaction aims to land the thread (chars): under its prepare floor with
    headroom, ``floor - max(gain, HEADROOM_STEPS x step)``, but not below the keep window
    and a whole summary (``keep + summary budget``: lower would cut into the keep window
    itself; :func:`least_aim`, the fixed part and a ``kept`` request counted), nor above
    :func:`landing_bound`. ``step``: the run's growth per model step in chars
    (:func:`step_chars`; 0: unknown). The least gain and the keep window are the thread's
    (:func:`thread_budget`).

    Why: landing just under the floor (22-24k against a 24k floor at 30,000 / 10,000)
    starts the next job at once, on a thread with nothing worth compacting; it ends
    ``no_progress`` or ``too_few_messages`` and its skip holds the thread until it grew a
    compaction's gain more, and a fast run then crosses the threshold while that summary is
    written ("room for at least several more steps"). Landing ``gain``
    (:func:`min_gain_chars`) under the floor is where the planner's own keep budget puts a
    fresh plan; a run whose steps are large (mini-swe: ~2k chars a call; SRE dumps) gets
    :data:`HEADROOM_STEPS` of them. Kept tool results are shortened (recall-able) and the
    messages that came since a prepared plan are removed to get there; a thread whose kept
    part cannot get there lands under :func:`landing_bound` instead."""
    headroom = max(min_gain_chars(settings, fixed), HEADROOM_STEPS * max(0, step))
    aim = max(settings.prepare_floor_chars - headroom, least_aim(settings, fixed, kept))
    return min(landing_bound(settings, fixed, kept), aim)


def step_chars(messages: Sequence[BaseMessage], steps: int = 8) -> int:
    """The thread's growth per model step (chars), from its tail: the chars of the messages
    from its ``steps``-th last AI message on, over the AI messages among them (0 when it holds
    fewer than two). Pure, O(tail)."""
    chars = count = 0
    for m in reversed(messages):
        if m.type == "system" or is_summary(m):
            break
        chars += message_chars(m)
        if m.type == "ai":
            count += 1
            if count >= steps:
                break
    return chars // count if count >= 2 else 0


def early_keep_chars(settings: Settings, total: int, fixed: int = 0) -> int:
    """The keep window (chars) of a plan made at ``total`` chars, before the thread is over
    its threshold: the window (the thread's, :func:`thread_budget`) less the chars still to
    come before it can be applied (``threshold - total``), at least :data:`EARLY_KEEP_SHARE`
    of it.

    Why it still keeps the seed's promise: a compaction planned early is applied only once
    the thread is over its threshold (the middleware's first call over it, the post-turn
    hook on a crossing; an operator's "compact now" plans with ``force`` and keeps the whole
    window, though it applies one already prepared as it is), so by then at least
    ``threshold - total`` chars came after its kept part, and the kept tail holds the whole
    window *after compaction*. Kept whole at the plan, a fast
    run's early plans removed 9k of a 23k thread that grew 20k more while the summary was
    written: the thread was over its threshold again at the apply (django at
    30,000 / 10,000, 1.74x)."""
    keep = thread_budget(settings, fixed).keep
    ahead = max(0, settings.summarization_threshold_chars - total)
    return max(int(keep * EARLY_KEEP_SHARE), keep - ahead)


def request_cap_chars(settings: Settings, fixed: int = 0) -> int:
    """Most chars of a request a compaction keeps as its own message (:func:`summary_budget_chars`:
    the task gets as much room as the summary of everything else). A long request is kept as
    its own message, not quoted in the summary; kept whole, a task prompt of a
    quarter of the threshold or more (mini-swe: 5.6-6.5k chars; SWE-agent: 19k) plus the keep
    window and the summary is at the prepare floor already, so every later compaction ends
    ``no_progress`` and the run is masked instead. Shortened, nothing is lost: the original is
    archived and the kept part says how to read the rest. At least
    :data:`~offpath.compaction.settings.MIN_SHORTENED_CHARS`, as a shortened result. ``fixed``:
    the thread's fixed part (:func:`thread_budget`)."""
    return max(MIN_SHORTENED_CHARS, summary_budget_chars(settings, fixed))


def summary_budget_chars(settings: Settings, fixed: int = 0) -> int:
    """Most chars a summary message of a thread with a ``fixed`` part may hold, whole
    (:func:`thread_budget`); with none, the setting's (:func:`_summary_setting`)."""
    return thread_budget(settings, fixed).summary


def _summary_setting(settings: Settings) -> int:
    """Most chars a summary message may hold, whole: ``SUMMARY_MAX_SHARE`` x the threshold
    (a summary of a fixed 8.6-12.6k chars eats a small threshold's room), and at least
    :data:`SMALL_SUMMARY_CHARS` where the prepare floor leaves room for it beside the keep
    window (and half a compaction's least gain): at a 4,000-char threshold 15% is 600 chars,
    which the template, the agent's place and the recall line fill, and tau-bench's
    ground-truth ids were in view after 54% of compactions (96% at 1,400). The seed's 500 / 200
    try-out keeps :data:`MIN_SUMMARY_CHARS`."""
    gain = max(1, (settings.summarization_threshold_chars - settings.summarization_keep_chars) // 4)
    room = settings.prepare_floor_chars - settings.summarization_keep_chars - gain // 2
    return max(MIN_SUMMARY_CHARS, settings.summary_budget_chars, min(SMALL_SUMMARY_CHARS, room))


def estimate_summary_chars(
    budget: int, removed_chars: int, request: str | None, carried: int = 0, least_gain: int = 0
) -> tuple[int, int]:
    """``(most chars the summary message will hold, chars left for its text and pinned
    facts)``. The summary is bounded by ``budget`` and by half the chars it replaces (at
    least :data:`MIN_SUMMARY_CHARS`), and its summarizer keeps to that, so the planner counts
    a safe upper bound, not a guess (a 6,670-char removal got a 4,777-char summary and left
    its thread over the threshold: gemini-cli#15225). Of the chars it replaces, those of the
    earlier summaries it folds in (``carried``) count whole: the new summary carries what
    they held, their pinned facts first; halved at every compaction, a session's facts drop
    out of view one compaction after they were pinned. It stays ``least_gain`` chars under
    what it replaces (the least gain a cut must bring; 0: no such bound), never under half
    of it. A quoted ``request`` and the fixed lines (prefix, recall line) take their share
    of it."""
    whole = carried + (removed_chars - carried) // 2
    if least_gain:
        whole = min(whole, removed_chars - least_gain)
    size = min(budget, max(MIN_SUMMARY_CHARS, removed_chars // 2, whole))
    if request:
        size = max(size, overhead_chars(request) + MIN_SUMMARY_CHARS // 2)
    return size, max(100, size - overhead_chars(request))


def earliest_worth(settings: Settings, fixed: int = 0) -> int:
    """The smallest thread (chars, its ``fixed`` part counted) a compaction is likely worth it
    on: the fixed part, then what the planner's gain rule needs removed, ``max(budget + gain,
    2 x gain)`` (a summary is at most the budget, and at most half of what it replaces or a
    least gain under it), and
    half a tool result's allowance for the group the cut ends in, past the keep window *of a
    plan made that early* (:func:`early_keep_chars`: the window less what must still come
    before the apply, at least :data:`EARLY_KEEP_SHARE` of it); the budget is the thread's
    (:func:`thread_budget`). A job queued before this ends ``no_progress`` and holds its
    thread back until it grew by a compaction's worth: worse than a late one. With the whole
    keep window counted here (django at 30,000 / 10,000: 23,750 of a 24,000-char floor), a
    run landing at 21k after an apply and growing 8k a step would queue its next job only
    at the crossing."""
    budget = thread_budget(settings, fixed)
    gain = budget.min_gain
    need = settings.tool_result_limit_chars // 2 + max(budget.summary + gain, 2 * gain)
    keep = budget.keep
    room = settings.summarization_threshold_chars - budget.fixed
    if room - keep >= need:  # an early plan keeps less
        return budget.fixed + int(keep * EARLY_KEEP_SHARE) + need
    return budget.fixed + keep + need


def blended_rate(rate: float, sample: float) -> float:
    """A thread's growth rate (chars per second) with the newest ``sample`` taken in: an
    exponential moving average weighted :data:`RATE_WEIGHT`; the sample alone while ``rate``
    is unknown (0)."""
    return sample if rate <= 0 else RATE_WEIGHT * sample + (1 - RATE_WEIGHT) * rate


def lead_chars(rate: float, latency_s: float) -> int:
    """How far (chars) before its threshold a thread growing at ``rate`` chars per second gets
    its job, for the summary to be ready at the crossing: the growth over the summarizer's
    ``latency_s`` and :data:`JOB_OVERHEAD_S`, with :data:`LEAD_MARGIN`, rounded up."""
    return math.ceil(rate * (latency_s + JOB_OVERHEAD_S) * LEAD_MARGIN)


def turn_lead_chars(rate: float, latency_s: float, step: int) -> int:
    """The lead (chars) of a thread that grows by whole turns of ``step`` chars at ``rate``
    chars per second (the post-turn hook's threads): the job starts at the last turn that
    leaves it the time it needs (:func:`lead_chars`) before the first turn after the
    crossing, whose model call is the first to read the thread over its threshold. That is
    the job's time in whole turns, less the crossing turn's own: 0 (queued by the crossing
    turn, applied before the next one) when a job takes less than a turn; a whole turn, not
    a turn and a half, when it takes a turn and a half. Each turn of lead is one more turn
    in which a thread that stops leaves a summary paid for and not applied. With ``step``
    unknown (0), :func:`lead_chars`."""
    lead = lead_chars(rate, latency_s)
    if step <= 0:
        return lead
    return (math.ceil(lead / step) - 1) * step


@dataclass(frozen=True, slots=True)
class _Candidate:
    cut: int
    boundary: Literal["turn", "tool_group"]
    removed: tuple[int, ...]  # indexes, thread order; removed[0] is the head
    count: int  # messages removed
    chars: int  # chars removed
    request: str | None  # quoted in the summary
    request_copy: int | None  # index of the request message kept as a copy (it is removed[0])
    request_kept: int  # chars of the request kept as its own message (copy or in place), shortened
    shorten: tuple[tuple[str, int], ...]  # kept tool results to shorten: (id, cap)
    summary_chars: int  # chars left for the summary's text and pinned facts
    after: int  # estimated thread chars after the compaction
    least: int  # the least it could leave: every kept result shortened as far as it goes


class _Scan:
    """What the planner needs to know of each message, from one forward pass.

    ``blocked[c]`` for each cut index ``0..n``: 0 if the cut is valid, 1 if a
    tool-call pair straddles it; :meth:`whole_turns` says which valid cuts keep turns whole. ``kept_anywhere`` are the indexes of messages no
    compaction removes: AI messages with a call still waiting for its result, and
    the results those messages already have. Prefix sums give the size of any removed
    part in O(1).
    """

    def __init__(self, messages: Sequence[BaseMessage]) -> None:
        """One pass over the messages (each object is touched once, which matters for
        cache locality at 100,000 messages): sizes, ids, kinds and tool-call positions."""
        n = len(messages)
        self.messages = messages
        self.system = [False] * n
        self.summary = [False] * (n + 1)
        self.turn_start = [False] * (n + 1)
        self.tool = [False] * n
        self.sizes = sizes = [0] * n
        self.ids: list[str | None] = [None] * n
        self.pairer = pairer = CallPairer()
        ids = self.ids
        system, summary, turn_start, tool = self.system, self.summary, self.turn_start, self.tool
        for i, m in enumerate(messages):
            sizes[i] = message_chars(m)
            ids[i] = m.id
            if isinstance(m, ToolMessage):
                pairer.add_result(i, m.tool_call_id)
                tool[i] = True
            elif isinstance(m, AIMessage):
                if m.tool_calls or m.invalid_tool_calls:
                    pairer.add_calls(i, call_ids(m))
            elif isinstance(m, SystemMessage):
                system[i] = True
            elif isinstance(m, HumanMessage):
                if is_summary(m):
                    summary[i] = True
                else:
                    turn_start[i] = True
        self.total = sum(sizes)

    def index_pairs(self) -> None:
        """Valid cuts (``blocked``), the messages kept in place and the prefix sums."""
        n, system = len(self.messages), self.system
        self.head = 0
        while self.head < n and system[self.head]:
            self.head += 1
        diff = [0] * (n + 2)
        open_ai = {a for a, _ in self.pairer.open_calls()}
        kept = set(open_ai)
        for a, t in self.pairer.pairs:
            if a in open_ai:  # both stay where they are: the pair holds no cut back
                kept.add(t)
                continue
            diff[a + 1] += 1
            diff[t + 1] -= 1
        self.kept_anywhere = kept
        self.blocked = [1 if v else 0 for v in accumulate(diff[: n + 1])]
        # the turn in progress starts at the last request (None: no request after the head,
        # the whole thread is one turn in progress)
        self.last_turn = next(
            (i for i in range(n - 1, self.head - 1, -1) if self.turn_start[i]), None
        )
        # prefix sums of sizes; system messages (rarely past the head) are subtracted
        self.chars_before = [0, *accumulate(self.sizes)]
        self.summaries = [i for i in range(n) if self.summary[i]]
        # removed wherever they stand: orphan tool results (the next
        # compaction removes them). Earlier summaries are folded in when they are before the
        # cut, as offpath's always are (the first message after the system prompt); a
        # message a client marked as one after it stays: a marker is data, it never removes
        # a message of the kept part
        self.anywhere = sorted(self.pairer.orphans)
        self.removed_anywhere = set(self.anywhere)
        self.mid_systems = (
            [i for i in range(self.head, n) if system[i]] if any(system[self.head :]) else []
        )

    def whole_turns(self, cut: int) -> bool:
        """Cutting at ``cut`` keeps turns whole (DESIGN.md invariant 17): no tool-call pair
        straddles it, and it starts a turn or falls inside the turn in progress (whose
        request is then quoted or kept)."""
        if self.blocked[cut]:
            return False
        return self.turn_start[cut] or self.last_turn is None or cut > self.last_turn

    def evaluate(
        self,
        cut: int,
        boundary: Literal["turn", "tool_group"],
        total: int,
        budget: int,
        kept_budget: int,
        quote_max: int,
        request_cap: int,
        target: int | None = None,
        least_gain: int = 0,
    ) -> _Candidate:
        """The compaction that cuts at ``cut``: what it removes (earlier summaries after it
        folded in; messages kept in place left out), the request it quotes or keeps (over
        ``request_cap`` chars: shortened), the kept results it shortens, and the thread's size
        after it, its summary's size bound kept ``least_gain`` under what it removes
        (:func:`estimate_summary_chars`)."""
        head, sizes = self.head, self.sizes
        late = [i for i in self.anywhere if i >= cut]
        staying = {i for i in self.kept_anywhere if i < cut and i not in self.removed_anywhere} | {
            i for i in self.mid_systems if i < cut
        }
        request, request_at = None, None
        if boundary == "tool_group" and not self.turn_start[cut]:
            request, request_at = self._request(cut)
        copy, own = None, None  # own: the request kept as its own message, copy or in place
        if request is not None and len(request) > quote_max:
            if request_at is not None and request_at > head:
                staying.add(request_at)  # kept in place, right after the summary
                own = request_at
            elif request_at == head:
                copy = own = head  # the summary takes its place; a copy of it follows it
            request = None if request_at is not None else request
        request_cut: tuple[tuple[str, int], ...] = ()
        request_kept = sizes[own] if own is not None else 0
        if (
            own is not None
            and request_kept - request_cap >= MIN_SAVING_CHARS
            and text_only(self.messages[own].content)
        ):
            request_cut = ((str(self.ids[own]), request_cap),)
            request_kept = request_cap
        if not staying:
            removed = tuple(range(head, cut)) + tuple(late)
        else:
            removed = tuple(i for i in range(head, cut) if i not in staying) + tuple(late)
        chars = (
            sum(sizes[i] for i in removed)
            if staying
            else (self.chars_before[cut] - self.chars_before[head] + sum(sizes[i] for i in late))
        )
        kept_chars = total - chars + (sizes[copy] if copy is not None else 0)
        if own is not None:
            kept_chars -= sizes[own] - request_kept
        carried = sum(sizes[i] for i in removed if self.summary[i])
        summary_size, summary_chars = estimate_summary_chars(
            budget, chars, request, carried, least_gain
        )
        results = [
            (str(self.ids[i]), sizes[i])
            for i in range(cut, len(sizes))
            if self.tool[i] and i not in self.removed_anywhere
        ]
        least = kept_chars - saving(dict(results), caps_for(results, 10**12)) + summary_size
        # the keep window's budget, and below it what lands the thread under its target
        want = kept_budget if target is None else min(kept_budget, target - summary_size)
        shorten: tuple[tuple[str, int], ...] = request_cut
        if kept_chars > want:
            caps = caps_for(results, kept_chars - want)
            shorten = tuple(sorted(caps.items())) + request_cut
            kept_chars -= saving(dict(results), caps)
        after = kept_chars + summary_size
        count = len(removed) - (1 if copy is not None else 0)
        return _Candidate(
            cut,
            boundary,
            removed,
            count,
            chars,
            request,
            copy,
            request_kept,
            shorten,
            summary_chars,
            after,
            least,
        )

    def _request(self, cut: int) -> tuple[str | None, int | None]:
        """The request of the turn a mid-turn cut falls in and its index: its human message,
        or the request an earlier summary carried (the turn began before that compaction;
        no index)."""
        for i in range(cut - 1, self.head - 1, -1):
            if self.turn_start[i]:
                return content_text(self.messages[i].content), i
        for i in reversed(self.summaries):
            if i < cut and (request := summary_request(self.messages[i])):
                # a block sent with every user message is no part of the request
                summary = content_text(self.messages[i].content)
                blocks = standing_blocks(self.messages, read_standing(summary))
                return without_standing(request, blocks) or request, None
        return None, None

    def build(
        self, c: _Candidate, total: int, threshold: int, summary_budget: int = 0
    ) -> CompactionPlan:
        """The plan for candidate ``c``; ``summary_budget``: the whole summary's (chars)."""
        messages = self.messages
        removed_set = set(c.removed)
        removed = [messages[i] for i in c.removed]
        kept, order = [], []
        for i in range(self.head, len(messages)):
            if self.system[i]:
                continue
            order.append(self.ids[i])
            if i not in removed_set:
                kept.append(messages[i])
        return CompactionPlan(
            cut=c.cut,
            boundary=c.boundary,
            removed=tuple(removed),
            kept=tuple(kept),
            order=tuple(order),  # type: ignore[arg-type]
            request=c.request,
            total_chars=total,
            removed_chars=c.chars,
            estimated_chars_after=c.after,
            threshold_chars=threshold,
            request_copy=str(self.ids[c.request_copy]) if c.request_copy is not None else None,
            shorten=c.shorten,
            summary_chars=c.summary_chars,
            summary_budget=summary_budget,
        )


#: The seed: fewer messages than this is "too little to compact".
MIN_MESSAGES_REMOVED = 4
#: A request longer than this share of the summary budget is kept as its own message.
REQUEST_QUOTE_SHARE = 0.25


def plan_compaction(
    messages: Sequence[BaseMessage],
    settings: Settings,
    *,
    early: bool = False,
    force: bool = False,
    floor_chars: int | None = None,
    outside_chars: int = 0,
) -> CompactionPlan | Skip:
    """Plan a compaction of ``messages`` (a thread's ``messages`` channel) under ``settings``.

    Returns a :class:`CompactionPlan`, or a :class:`Skip` when compaction is
    disabled, the thread is under the threshold, no valid cut exists, or no
    cut is worth it. ``early``: plan from ``SUMMARIZATION_PREPARE_AT`` x the
    threshold already, or from ``floor_chars`` when given (a compaction prepared ahead,
    applied once the thread is over the threshold; DESIGN.md "Compaction during a run").
    ``force``: plan whatever the
    thread's size, and any cut that removes more than its summary adds is worth it (an
    operator asked: ``POST /sessions/{id}/compact``); the keep window, the tool-call pairs
    and the fewest messages removed still hold. A plan needs every message to carry an id (LangGraph's
    ``add_messages`` gives them one): :attr:`SkipReason.MISSING_IDS` otherwise. One forward
    pass and one backward walk: linear in the number of messages; only the
    chosen cut builds lists.

    ``outside_chars``: what every model call sends besides the thread (a system prompt given
    as ``create_agent(system_prompt=...)``, which no checkpoint holds), counted against the
    threshold, the floors and the landing as a system message of the thread would be (issue
    18 measured what a call sends: SWE-agent's 4.9k-char prompt put a run 1.13x over its
    threshold while the thread itself was under it). Those and the thread's system messages are
    its fixed part: the keep window, the summary budget and the least gain are the thread's
    (:func:`~offpath.compaction.planner.thread_budget`), and the keep window holds at
    least the newest step.

    A :class:`Skip` says from which size (``worth_at``) a compaction could be worth it, where
    it can tell: the thread is not asked again before then.
    """
    if not settings.active:
        return Skip(SkipReason.DISABLED, "summarization is disabled")
    scan = _Scan(messages)
    outside = max(0, outside_chars)
    sizes, total = scan.sizes, scan.total + outside
    threshold = settings.summarization_threshold_chars
    if force:
        floor = 0
    elif early:
        floor = settings.prepare_floor_chars if floor_chars is None else floor_chars
    else:
        floor = threshold
    if total <= floor:
        return Skip(SkipReason.UNDER_THRESHOLD, f"{total} chars <= {floor}", total, floor + 1)
    if None in scan.ids or "" in scan.ids:
        at = scan.ids.index(None) if None in scan.ids else scan.ids.index("")
        return Skip(
            SkipReason.MISSING_IDS,
            f"message {at} ({messages[at].type}) has no id: no compaction can remove it",
            total,
        )
    scan.index_pairs()
    n, head, blocked = len(messages), scan.head, scan.blocked
    if head < n and head in scan.kept_anywhere:
        return Skip(
            SkipReason.NO_CUT_POINT,
            "the first message is a tool call still waiting for its result: the summary could "
            "not go before it",
            total,
        )

    # what no compaction removes: the system prompts, in the thread and given to the agent
    systems = sum(sizes[i] for i in range(n) if scan.system[i]) + outside
    budget_of = thread_budget(settings, systems)
    # Walk back until the kept tail holds the keep window (as it will be at the apply), and at
    # least the newest step (its AI message and what came after it, or the newest request)
    keep = budget_of.keep
    if early and not force:
        keep = early_keep_chars(settings, total, systems)
    newest = max(
        (i for i in range(n - 1, head - 1, -1) if messages[i].type in ("ai", "human")),
        default=n,
    )
    reach = max(keep, scan.total - scan.chars_before[newest])
    min_gain = 1 if force else budget_of.min_gain
    step = step_chars(messages)
    w, acc = n, 0
    while w > head and acc < reach:
        w -= 1
        acc += sizes[w]
    if acc < reach:
        return Skip(
            SkipReason.NO_CUT_POINT,
            "everything after the system prompt fits the keep window"
            if head
            else "the whole thread fits the keep window (it has no system prompt)",
            total,
            total + reach - acc + min_gain,
        )

    # the last cut at or before w that keeps turns whole: a turn's start, or (the group cut)
    # a boundary between tool groups of the turn in progress (DESIGN.md invariant 17)
    turn_cut = group_cut = None
    for c in range(w, head, -1):
        if not scan.whole_turns(c):
            continue
        if group_cut is None:
            group_cut = c
        if scan.turn_start[c]:
            turn_cut = c
            break
    budget = budget_of.summary
    limit = settings.tool_result_limit_chars
    room = budget_of.min_gain
    # the kept part's budget beside the fixed part (the thread's own keep window and summary)
    kept_budget = min(
        keep + limit, max(keep, settings.prepare_floor_chars - systems - room - budget)
    )
    quote_max = int(budget * REQUEST_QUOTE_SHARE)
    request_cap = request_cap_chars(settings, systems)

    # DESIGN.md invariant 13: an applied compaction leaves the thread under its prepare floor
    # (an operator's "compact now" excepted); one that cannot is not worth a summary, unless
    # what no cut can remove or shorten is over the floor already and it halves the thread
    target = None if force else landing_chars(settings, systems, step)

    def evaluate(cut: int | None, boundary: Literal["turn", "tool_group"]) -> _Candidate | None:
        if cut is None:
            return None
        return scan.evaluate(
            cut,
            boundary,
            total,
            budget,
            systems + kept_budget,
            quote_max,
            request_cap,
            target,
            min_gain,
        )

    turn = evaluate(turn_cut, "turn")
    group = evaluate(group_cut, "tool_group") if group_cut != turn_cut else None

    def lands(c: _Candidate) -> bool:
        if target is None:
            return True
        copied = c.request_kept
        # the kept part is shortened toward the target (the headroom); one whose messages
        # cannot all get there still lands under the floor
        if c.after <= max(target, landing_bound(settings, systems, copied)):
            return True
        # what no cut can remove or shorten is over the floor already (a huge system prompt
        # or request): the deepest compaction there is, if it at least halves the thread
        return c.after <= c.least and c.after <= total // 2

    def worth(c: _Candidate | None) -> TypeGuard[_Candidate]:
        if c is None or c.count == 0 or total - c.after < min_gain:
            return False
        if c.count < MIN_MESSAGES_REMOVED and c.chars < keep:
            return False
        return lands(c)

    for choice in (turn if worth(turn) and turn.after <= threshold else None, group, turn):
        if worth(choice):
            assert choice is not None
            return scan.build(choice, total, threshold, budget)
    shallow = group or turn
    window = scan.total - scan.chars_before[w]  # what the walk back kept: over its budget?
    # the keep window's edge falls inside a finished turn, and no cut that keeps turns whole
    # at or before it is worth it (the turn began right after the summary, or at the head)
    # where a cut inside that turn would be: the turn goes whole (DESIGN.md invariant 17)
    # rather than the thread staying over its threshold
    inside = next((c for c in range(w, head, -1) if not blocked[c]), None)
    blocked_by_turns = (
        not worth(shallow) and inside is not None and worth(evaluate(inside, "tool_group"))
    )
    overfull = target is not None and window > kept_budget
    if (blocked_by_turns or overfull) and not worth(shallow):
        # no cut keeps turns whole outside the keep window (a finished turn holds its edge),
        # or the keep window holds more than its budget in what cannot be shortened (a
        # model's own long messages: a file written through a tool call's arguments, 5-7k
        # chars in the mini-swe runs; a pasted request larger than the window): the
        # shallowest cut inside it that keeps turns whole and lands ("the keep window itself
        # never holds more than its budget ... a cut is always possible"). The deepest one
        # first: when even it does not land (a system prompt over the floor), no shallower
        # one does, and the post-turn hook, which plans on every turn over the floor,
        # evaluates one cut, not the window's
        cuts = [c for c in range(w + 1, n) if scan.whole_turns(c)]

        def at_cut(c: int) -> _Candidate | None:
            return evaluate(c, "turn" if scan.turn_start[c] else "tool_group")

        if cuts and worth(at_cut(cuts[-1])):
            for c in cuts:
                if worth(deep := at_cut(c)):
                    assert deep is not None
                    return scan.build(deep, total, threshold, budget)
    if shallow is None:
        return Skip(
            SkipReason.NO_CUT_POINT, "no cut leaves tool-call pairs whole", total, total + min_gain
        )
    best = shallow
    # from which size a compaction is worth it: one more step (more messages), or the gain it
    # lacks (as the thread grows past the keep window, what the cut leaves stays and what it
    # removes grows; the summary grows by half of that, up to its budget)
    if best.count < MIN_MESSAGES_REMOVED and best.chars < keep:
        return Skip(
            SkipReason.TOO_FEW_MESSAGES,
            f"the best cut removes {best.count} message{'' if best.count == 1 else 's'} "
            f"(< {MIN_MESSAGES_REMOVED})",
            total,
            total + min(min_gain, step or min_gain),
        )
    short = min_gain - (total - best.after)
    grows = max(0, budget - estimate_summary_chars(budget, best.chars, best.request)[0])
    worth_at = total + max(1, short + min(short, grows))
    if not lands(best) and total - best.after >= min_gain:
        return Skip(
            SkipReason.NO_PROGRESS,
            f"the best cut would leave ~{best.after} chars, over the prepare floor ({target}): "
            "the kept part cannot be shortened enough; waiting for more messages",
            total,
            total + min_gain,
        )
    return Skip(
        SkipReason.NO_PROGRESS,
        f"the best cut saves ~{total - best.after} chars (< {min_gain}); waiting for more "
        f"messages (worth it from ~{worth_at} chars)",
        total,
        worth_at,
    )


def extension(
    messages: Sequence[BaseMessage],
    start: int,
    settings: Settings,
    *,
    newest_only: bool = False,
    shallowest: bool = False,
    fixed: int = 0,
) -> tuple[int, ...]:
    """Indexes of the messages from ``start`` on that a compaction applied late may remove as
    well (a fast run outgrew the summary while it was written): those before the last cut
    that keeps turns whole (DESIGN.md invariant 17: a turn's start, or a boundary between the
    tool groups of the turn in progress) and still leaves the keep window after it, but
    system messages, calls still waiting for their results (with the results they have), and
    the request of the turn in progress when the cut falls inside it. A finished turn goes
    whole, its request with its answer. Empty when no such cut lies after ``start``. Linear.

    ``newest_only``: the keep window is the newest model step only (its AI message and
    what came after it), for a keep window that holds more than its budget in what cannot be
    shortened, as the planner cuts into it (a model's long messages). ``shallowest``: the first
    cut from ``start`` on that keeps turns whole, whatever the keep window: a plan that cut into
    a turn then in progress, applied after that turn ended, takes the rest of it (as the
    planner itself cuts at the next turn's start when the keep window falls inside a finished
    turn).

    ``fixed``: the thread's fixed part (chars: its system prompts, in the thread and given to
    the agent), whose keep window is the thread's
    (:func:`~offpath.compaction.planner.thread_budget`); the newest step (or the newest
    request) always stays, as in :func:`plan_compaction`."""
    scan = _Scan(messages)
    scan.index_pairs()
    sizes, n = scan.sizes, len(messages)
    if shallowest:
        cut = next((c for c in range(start, n + 1) if scan.whole_turns(c)), start)
        return _removable(scan, start, cut)
    keep = thread_budget(settings, fixed).keep
    if newest_only:
        last_ai = next((i for i in range(n - 1, start - 1, -1) if messages[i].type == "ai"), None)
        if last_ai is None:
            return ()
        keep = min(keep, sum(sizes[last_ai:]))
    newest = next(
        (i for i in range(n - 1, start - 1, -1) if messages[i].type in ("ai", "human")), n
    )
    keep = max(keep, sum(sizes[newest:]))
    w, acc = n, 0
    while w > start and acc < keep:
        w -= 1
        acc += sizes[w]
    edge = next((c for c in range(w, start, -1) if scan.whole_turns(c)), None)
    if edge is None or acc < keep:
        return ()
    return _removable(scan, start, edge)


def _removable(scan: _Scan, start: int, cut: int) -> tuple[int, ...]:
    """Indexes from ``start`` to ``cut`` a compaction removes: not system messages, calls
    still waiting (with their results), nor the request of the turn in progress when ``cut``
    falls inside it."""
    stay = set(scan.kept_anywhere)
    if scan.last_turn is not None and start <= scan.last_turn < cut:
        stay.add(scan.last_turn)
    return tuple(i for i in range(start, cut) if not scan.system[i] and i not in stay)
