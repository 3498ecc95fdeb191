"""The cut rule (see the package doc): :func:`plan_compaction` chooses where to cut a thread,
or says why not, and :func:`extension` finds what a compaction applied late may remove
as well.

Both read one forward pass over the thread's messages (:class:`_Scan`: sizes, kinds,
tool-call pairs, the valid cuts and the messages kept in place), and what cutting at one
index would remove, keep, quote and shorten (:class:`_Candidate`), built into a plan."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from offpath.compaction.accounting import content_text, message_chars, text_only
from offpath.compaction.pairing import CallPairer, call_ids
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
from offpath.compaction.settings import Settings
from offpath.compaction.shorten import MIN_SAVING_CHARS, caps_for, saving
from offpath.compaction.standing import read_standing, standing_blocks, without_standing
from offpath.compaction.summary.message import is_summary, summary_request


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
            cls = type(m)
            if cls is ToolMessage or (cls is not AIMessage and isinstance(m, ToolMessage)):
                pairer.add_result(i, m.tool_call_id)
                tool[i] = True
            elif cls is AIMessage or isinstance(m, AIMessage):
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
    ) -> _Candidate:
        """The compaction that cuts at ``cut``: what it removes (earlier summaries after it
        folded in; messages kept in place left out), the request it quotes or keeps (over
        ``request_cap`` chars: shortened), the kept results it shortens, and the thread's size
        after it."""
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
        summary_size, summary_chars = estimate_summary_chars(budget, chars, request)
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

    def worth(c: _Candidate | None) -> bool:
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

        def at(c: int) -> _Candidate | None:
            return evaluate(c, "turn" if scan.turn_start[c] else "tool_group")

        if cuts and worth(at(cuts[-1])):
            for c in cuts:
                if worth(deep := at(c)):
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
    cut = next((c for c in range(w, start, -1) if scan.whole_turns(c)), None)
    if cut is None or acc < keep:
        return ()
    return _removable(scan, start, cut)


def _removable(scan: _Scan, start: int, cut: int) -> tuple[int, ...]:
    """Indexes from ``start`` to ``cut`` a compaction removes: not system messages, calls
    still waiting (with their results), nor the request of the turn in progress when ``cut``
    falls inside it."""
    stay = set(scan.kept_anywhere)
    if scan.last_turn is not None and start <= scan.last_turn < cut:
        stay.add(scan.last_turn)
    return tuple(i for i in range(start, cut) if not scan.system[i] and i not in stay)
