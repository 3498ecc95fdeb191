"""One forward pass over a thread's messages (:class:`_Scan`: sizes, kinds, tool-call pairs,
the valid cuts and the messages kept in place), and what cutting at one index would remove,
keep, quote and shorten (:class:`_Candidate`), built into a plan."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from offpath.compaction.accounting import content_text, message_chars, text_only
from offpath.compaction.pairing import CallPairer, call_ids
from offpath.compaction.planner.budgets import estimate_summary_chars
from offpath.compaction.planner.plans import CompactionPlan
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
        # removed wherever they stand: orphan tool results (issue 8, item 10: the next
        # compaction removes them). Earlier summaries are folded in when they are before the
        # cut, as offpath's always are (the first message after the system prompt); a
        # message a client marked as one after it stays: a marker is data, it never removes
        # a message of the kept part (issue 20, item 8)
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
