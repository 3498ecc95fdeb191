"""The sizes a compaction is planned with: one thread's keep window, summary budget and least
gain, fitted to its fixed part (:func:`thread_budget`); where a compaction lands the thread
(its prepare floor, with headroom), the thread's growth per step, the keep window of a plan
made early, and the budget of a request kept as its own message. Every size is in chars."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from langchain_core.messages import BaseMessage

from offpath.compaction.accounting import message_chars
from offpath.compaction.settings import MIN_SHORTENED_CHARS, Settings
from offpath.compaction.summary.message import is_summary, overhead_chars

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
    the task gets as much room as the summary of everything else). Issue 18 asked for a long
    request kept as its own message, not quoted in the summary; kept whole, a task prompt of a
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


def estimate_summary_chars(budget: int, removed_chars: int, request: str | None) -> tuple[int, int]:
    """``(most chars the summary message will hold, chars left for its text and pinned
    facts)``. The summary is bounded by ``budget`` and by half the chars it replaces (at
    least :data:`MIN_SUMMARY_CHARS`), and its summarizer keeps to that, so the planner counts
    a safe upper bound, not a guess (a 6,670-char removal got a 4,777-char summary and left
    its thread over the threshold: gemini-cli#15225). A quoted ``request`` and the
    fixed lines (prefix, recall line) take their share of it."""
    size = min(budget, max(MIN_SUMMARY_CHARS, removed_chars // 2))
    if request:
        size = max(size, overhead_chars(request) + MIN_SUMMARY_CHARS // 2)
    return size, max(100, size - overhead_chars(request))


def earliest_worth(settings: Settings, fixed: int = 0) -> int:
    """The smallest thread (chars, its ``fixed`` part counted) a compaction is likely worth it
    on: the fixed part, then what the planner's gain rule needs removed, ``max(budget + gain,
    2 x gain)`` (a summary is at most the budget and at most half of what it replaces), and
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
