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
   invariant 3) and no tool call still waiting for its result lies before it
   (a pending call and everything after it always stay). A result answers the
   nearest earlier unanswered call with its id (:mod:`compaction.pairing`), not
   the first call with that id (ids repeat across turns on some servers) and not
   the message right before it (a human message may come in between). A call is
   pending while no later turn has begun; one that a later turn left without a
   result (input that was already broken) is already unpaired and holds no cut
   back, or one abandoned call would stop a thread from ever compacting.
   Orphan results (answering no call) and earlier summaries are removed
   wherever they stand.
3. The seed's rule first: the last valid cut at or before ``w`` that starts a
   turn (a human message that is not a summary). It is taken when it is
   *worth it* (below) and brings the thread under the threshold.
4. Otherwise (one request followed by a long run of tool calls, as in the
   ``single-turn`` case and the mini-swe-agent transcripts) the last valid cut
   at or before ``w`` between complete tool-call groups, if worth it. The
   request of the turn it cuts into is then quoted word for word in the
   summary message (``CompactionPlan.request``).
5. Else the turn-start cut if it is worth it, else a :class:`Skip`.

Worth it, and the no-progress rule
----------------------------------
A cut is *worth it* when it removes at least :data:`MIN_MESSAGES_REMOVED`
messages (the seed: fewer than 4 is too little) and its *gain*, the chars it
removes minus the estimated size of the summary that replaces them, is at least
``(SUMMARIZATION_THRESHOLD_CHARS - SUMMARIZATION_KEEP_CHARS) // 4``
(:func:`min_gain_chars`; 10,000 chars at the defaults).

The gain floor is what stops a requeue loop: when the best cut cannot bring the
thread under the threshold (a pending call or one huge tool result in the
tail), the compaction still runs if it is worth it, and the plan says
``fits=False``; after it, later turns only re-plan the same small cut (the
summary plus a few messages), whose gain is under the floor, so the post-turn
hook skips with :attr:`SkipReason.NO_PROGRESS` instead of queueing a job per
turn. The next job comes once new messages make a cut with a real gain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import accumulate
from typing import Literal

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from offpath.compaction.accounting import content_text, message_chars
from offpath.compaction.pairing import CallPairer, call_ids
from offpath.compaction.settings import Settings
from offpath.compaction.summary import SUMMARY_PREFIX, is_summary, summary_request

#: The seed: fewer messages than this is "too little to compact".
MIN_MESSAGES_REMOVED = 4
#: The summary's expected size: the template asks for under 400 words (~6 chars each).
SUMMARY_ESTIMATE_CHARS = 2_400


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
    """No compaction: ``reason`` names why, ``detail`` says it for a log line."""

    reason: SkipReason
    detail: str
    total_chars: int = 0


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


def min_gain_chars(settings: Settings) -> int:
    """The least net reduction (chars) a compaction must bring; see the module doc."""
    return max(1, (settings.summarization_threshold_chars - settings.summarization_keep_chars) // 4)


def estimate_summary_chars(removed_chars: int, request: str | None) -> int:
    """Expected size in chars of the summary message replacing ``removed_chars`` chars."""
    quoted = len(request) + 80 if request else 0
    return len(SUMMARY_PREFIX) + 2 + min(SUMMARY_ESTIMATE_CHARS, removed_chars // 2) + quoted


def plan_compaction(
    messages: Sequence[BaseMessage], settings: Settings, *, early: bool = False, force: bool = False
) -> CompactionPlan | Skip:
    """Plan a compaction of ``messages`` (a thread's ``messages`` channel) under ``settings``.

    Returns a :class:`CompactionPlan`, or a :class:`Skip` when compaction is
    disabled, the thread is under the threshold, no valid cut exists, or no
    cut is worth it. ``early``: plan from ``SUMMARIZATION_PREPARE_AT`` x the
    threshold already (a compaction prepared ahead, applied once the thread is
    over the threshold; DESIGN.md "Compaction during a run"). ``force``: plan whatever the
    thread's size, and any cut that removes more than its summary adds is worth it (an
    operator asked: ``POST /sessions/{id}/compact``); the keep window, the tool-call pairs
    and the fewest messages removed still hold. A plan needs every message to carry an id (LangGraph's
    ``add_messages`` gives them one): :attr:`SkipReason.MISSING_IDS` otherwise. One forward
    pass and one backward walk: linear in the number of messages; only the
    chosen cut builds lists.
    """
    if not settings.active:
        return Skip(SkipReason.DISABLED, "summarization is disabled")
    scan = _Scan(messages)
    sizes, total = scan.sizes, scan.total
    threshold = settings.summarization_threshold_chars
    floor = 0 if force else settings.prepare_floor_chars if early else threshold
    if total <= floor:
        return Skip(SkipReason.UNDER_THRESHOLD, f"{total} chars <= {floor}", total)
    if None in scan.ids or "" in scan.ids:
        at = scan.ids.index(None) if None in scan.ids else scan.ids.index("")
        return Skip(
            SkipReason.MISSING_IDS,
            f"message {at} ({messages[at].type}) has no id: no compaction can remove it",
            total,
        )
    scan.index_pairs()
    n, head, blocked = len(messages), scan.head, scan.blocked

    # Walk back until the kept tail holds the keep window.
    keep = settings.summarization_keep_chars
    w, acc = n, 0
    while w > head and acc < keep:
        w -= 1
        acc += sizes[w]
    if acc < keep:
        return Skip(
            SkipReason.NO_CUT_POINT,
            "everything after the system prompt fits the keep window",
            total,
        )
    upper = min(w, scan.first_pending)

    turn_cut = group_cut = None
    for c in range(upper, head, -1):
        if blocked[c]:
            continue
        if group_cut is None:
            group_cut = c
        if scan.turn_start[c]:
            turn_cut = c
            break
    if group_cut is None:
        return Skip(SkipReason.NO_CUT_POINT, "no cut leaves tool-call pairs whole", total)

    min_gain = 1 if force else min_gain_chars(settings)
    turn = scan.evaluate(turn_cut, "turn", total)
    group = scan.evaluate(group_cut, "tool_group", total) if group_cut != turn_cut else None

    def worth(c: _Candidate | None) -> bool:
        return c is not None and c.count >= MIN_MESSAGES_REMOVED and total - c.after >= min_gain

    for choice in (turn if worth(turn) and turn.after <= threshold else None, group, turn):
        if worth(choice):
            assert choice is not None
            return scan.build(choice, total, threshold)
    best = group or turn
    assert best is not None
    if best.count < MIN_MESSAGES_REMOVED:
        return Skip(
            SkipReason.TOO_FEW_MESSAGES,
            f"the best cut removes {best.count} messages (< {MIN_MESSAGES_REMOVED})",
            total,
        )
    return Skip(
        SkipReason.NO_PROGRESS,
        f"the best cut saves ~{total - best.after} chars (< {min_gain}); waiting for more messages",
        total,
    )


@dataclass(frozen=True, slots=True)
class _Candidate:
    cut: int
    boundary: Literal["turn", "tool_group"]
    count: int  # messages removed
    chars: int  # chars removed
    request: str | None
    after: int  # estimated thread chars after the compaction


class _Scan:
    """What the planner needs to know of each message, from one forward pass.

    ``blocked[c]`` for each cut index ``0..n``: 0 if the cut is valid, 1 if a
    tool-call pair straddles it. ``first_pending`` is the index of the first AI
    message with a call still waiting for its result (``n`` if none): no cut
    may lie after it. Prefix sums give the size of any removed part in O(1).
    """

    def __init__(self, messages: Sequence[BaseMessage]) -> None:
        """One pass over the messages (each object is touched once, which matters for
        cache locality at 100,000 messages): sizes, ids, kinds and tool-call positions."""
        n = len(messages)
        self.messages = messages
        self.system = [False] * n
        self.summary = [False] * (n + 1)
        self.turn_start = [False] * (n + 1)
        self.sizes = sizes = [0] * n
        self.ids: list[str | None] = [None] * n
        self.pairer = pairer = CallPairer()
        ids = self.ids
        system, summary, turn_start = self.system, self.summary, self.turn_start
        for i, m in enumerate(messages):
            sizes[i] = message_chars(m)
            ids[i] = m.id
            cls = type(m)
            if cls is ToolMessage or (cls is not AIMessage and isinstance(m, ToolMessage)):
                pairer.add_result(i, m.tool_call_id)
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
        """Valid cuts (``blocked``), the first pending call and the prefix sums."""
        n, system = len(self.messages), self.system
        self.head = 0
        while self.head < n and system[self.head]:
            self.head += 1
        diff = [0] * (n + 2)
        self.first_pending = n
        try:
            last_turn = n - 1 - self.turn_start[n - 1 :: -1].index(True)
        except ValueError:
            last_turn = -1
        for a, _ in self.pairer.open_calls():
            if a > last_turn:  # still waiting: no turn began after it
                self.first_pending = min(self.first_pending, a)
            # else abandoned by an earlier turn: already unpaired, it holds nothing back
        for a, t in self.pairer.pairs:
            diff[a + 1] += 1
            diff[t + 1] -= 1
        self.blocked = [1 if v else 0 for v in accumulate(diff[: n + 1])]
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

    def evaluate(
        self, cut: int | None, boundary: Literal["turn", "tool_group"], total: int
    ) -> _Candidate | None:
        """Size of the compaction that cuts at ``cut`` (earlier summaries after it folded in)."""
        if cut is None:
            return None
        late = [i for i in self.anywhere if i >= cut]
        systems = [i for i in self.mid_systems if i < cut]
        chars = self.chars_before[cut] - self.chars_before[self.head]
        chars += sum(self.sizes[i] for i in late) - sum(self.sizes[i] for i in systems)
        count = cut - self.head - len(systems) + len(late)
        request = (
            self._request(cut) if boundary == "tool_group" and not self.turn_start[cut] else None
        )
        after = total - chars + estimate_summary_chars(chars, request)
        return _Candidate(cut, boundary, count, chars, request, after)

    def _request(self, cut: int) -> str | None:
        """The request of the turn a mid-turn cut falls in: its human message, or the
        request an earlier summary carried (the turn began before that compaction)."""
        for i in range(cut - 1, self.head - 1, -1):
            if self.turn_start[i]:
                return content_text(self.messages[i].content)
        for i in reversed(self.summaries):
            if i < cut and (request := summary_request(self.messages[i])):
                return request
        return None

    def build(self, c: _Candidate, total: int, threshold: int) -> CompactionPlan:
        """The plan for candidate ``c``: list slices in the common case (no system message
        past the head, no earlier summary after the cut), else one loop."""
        head, cut, messages = self.head, c.cut, self.messages
        late = [i for i in self.anywhere if i >= cut]
        if not self.mid_systems and not late:
            removed, kept = list(messages[head:cut]), list(messages[cut:])
            order = self.ids[head:]
        else:
            removed, kept, order = [], [], []
            for i in range(head, len(messages)):
                if self.system[i]:
                    continue
                order.append(self.ids[i])
                (removed if i < cut or i in self.removed_anywhere else kept).append(messages[i])
        return CompactionPlan(
            cut=c.cut,
            boundary=c.boundary,
            removed=tuple(removed),
            kept=tuple(kept),
            order=tuple(order),
            request=c.request,
            total_chars=total,
            removed_chars=c.chars,
            estimated_chars_after=c.after,
            threshold_chars=threshold,
        )
