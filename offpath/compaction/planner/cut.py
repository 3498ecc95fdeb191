"""The cut rule (see the package doc): :func:`plan_compaction` chooses where to cut a thread,
or says why not, and :func:`extension` finds what a compaction applied late may remove
as well."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeGuard

from langchain_core.messages import BaseMessage

from offpath.compaction.planner.budgets import (
    early_keep_chars,
    estimate_summary_chars,
    landing_bound,
    landing_chars,
    request_cap_chars,
    step_chars,
    thread_budget,
)
from offpath.compaction.planner.plans import CompactionPlan, Skip, SkipReason
from offpath.compaction.planner.scan import _Candidate, _Scan
from offpath.compaction.settings import Settings

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
    (:func:`~offpath.compaction.planner.budgets.thread_budget`), and the keep window holds at
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
            "everything after the system prompt fits the keep window",
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
            cut, boundary, total, budget, systems + kept_budget, quote_max, request_cap, target
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
    (:func:`~offpath.compaction.planner.budgets.thread_budget`); the newest step (or the newest
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
