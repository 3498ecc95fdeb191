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
   (a pending call and everything after it always stay). Pairs are matched by
   ``tool_call_id``, not by position, so a result that arrives after other
   messages (a human message in between) still binds its call.
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
from typing import Literal

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from compaction.accounting import message_chars
from compaction.settings import Settings
from compaction.summary import SUMMARY_PREFIX, is_summary, summary_meta

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


def is_turn_start(message: BaseMessage) -> bool:
    """A human message that opens a turn (summaries do not)."""
    return message.type == "human" and not is_summary(message)


def plan_compaction(messages: Sequence[BaseMessage], settings: Settings) -> CompactionPlan | Skip:
    """Plan a compaction of ``messages`` (a thread's ``messages`` channel) under ``settings``.

    Returns a :class:`CompactionPlan`, or a :class:`Skip` when compaction is
    disabled, the thread is under the threshold, no valid cut exists, or no
    cut is worth it. Every message must carry an id (LangGraph's
    ``add_messages`` gives them one); ``ValueError`` otherwise. One forward
    pass and one backward walk: linear in the number of messages.
    """
    if not settings.active:
        return Skip(SkipReason.DISABLED, "summarization is disabled")
    sizes = [message_chars(m) for m in messages]
    total = sum(sizes)
    threshold = settings.summarization_threshold_chars
    if total <= threshold:
        return Skip(SkipReason.UNDER_THRESHOLD, f"{total} chars <= {threshold}", total)
    for m in messages:
        if not m.id:
            raise ValueError(f"every message needs an id to be compacted; a {m.type} has none")

    n = len(messages)
    head = 0
    while head < n and messages[head].type == "system":
        head += 1

    blocked = _blocked_cuts(messages)
    first_pending = blocked.index(2) if 2 in blocked else n + 1

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
    upper = min(w, first_pending - 1)

    turn_cut = group_cut = None
    for c in range(upper, head, -1):
        if blocked[c]:
            continue
        if group_cut is None:
            group_cut = c
        if c < n and is_turn_start(messages[c]):
            turn_cut = c
            break
    if group_cut is None:
        return Skip(SkipReason.NO_CUT_POINT, "no cut leaves tool-call pairs whole", total)

    min_gain = min_gain_chars(settings)
    candidates = {"turn": _evaluate(messages, sizes, head, turn_cut, total, threshold, "turn")}
    if group_cut != turn_cut:
        candidates["tool_group"] = _evaluate(
            messages, sizes, head, group_cut, total, threshold, "tool_group"
        )

    def worth(plan: CompactionPlan | None) -> bool:
        return (
            plan is not None
            and len(plan.removed) >= MIN_MESSAGES_REMOVED
            and plan.total_chars - plan.estimated_chars_after >= min_gain
        )

    turn, group = candidates["turn"], candidates.get("tool_group")
    if worth(turn) and turn.fits:
        return turn
    if worth(group):
        return group
    if worth(turn):
        return turn
    best = group or turn
    assert best is not None
    if len(best.removed) < MIN_MESSAGES_REMOVED:
        return Skip(
            SkipReason.TOO_FEW_MESSAGES,
            f"the best cut removes {len(best.removed)} messages (< {MIN_MESSAGES_REMOVED})",
            total,
        )
    gain = best.total_chars - best.estimated_chars_after
    return Skip(
        SkipReason.NO_PROGRESS,
        f"the best cut saves ~{gain} chars (< {min_gain}); waiting for more messages",
        total,
    )


def _blocked_cuts(messages: Sequence[BaseMessage]) -> list[int]:
    """For each cut index ``0..n``: 0 if valid, 1 if a tool-call pair straddles it,
    2 if a tool call before it is still waiting for its result."""
    n = len(messages)
    call_at: dict[str, int] = {}
    answered: dict[str, int] = {}
    for i, m in enumerate(messages):
        if isinstance(m, AIMessage):
            for call in (*m.tool_calls, *m.invalid_tool_calls):
                cid = call.get("id")
                if cid and cid not in call_at:
                    call_at[cid] = i
        elif isinstance(m, ToolMessage):
            a = call_at.get(m.tool_call_id)
            if a is not None:
                answered[m.tool_call_id] = i
    diff = [0] * (n + 2)
    first_pending = n + 1
    for cid, a in call_at.items():
        t = answered.get(cid)
        if t is None:
            first_pending = min(first_pending, a + 1)
        else:
            diff[a + 1] += 1
            diff[t + 1] -= 1
    blocked = [0] * (n + 1)
    open_pairs = 0
    for c in range(n + 1):
        open_pairs += diff[c]
        if c >= first_pending:
            blocked[c] = 2
        elif open_pairs:
            blocked[c] = 1
    return blocked


def _evaluate(
    messages: Sequence[BaseMessage],
    sizes: Sequence[int],
    head: int,
    cut: int | None,
    total: int,
    threshold: int,
    boundary: Literal["turn", "tool_group"],
) -> CompactionPlan | None:
    if cut is None:
        return None
    removed: list[BaseMessage] = []
    kept: list[BaseMessage] = []
    order: list[str] = []
    removed_chars = 0
    last_request: BaseMessage | None = None
    for i in range(head, len(messages)):
        m = messages[i]
        if m.type == "system":
            continue
        order.append(str(m.id))
        if i < cut or is_summary(m):
            removed.append(m)
            removed_chars += sizes[i]
            if i < cut and is_turn_start(m):
                last_request = m
        else:
            kept.append(m)
    request = None
    if boundary == "tool_group" and not (cut < len(messages) and is_turn_start(messages[cut])):
        if last_request is not None:
            request = _text_of(last_request)
        else:  # the turn began before an earlier compaction: carry its quoted request on
            for s in reversed(removed):
                if is_summary(s) and summary_meta(s).get("request"):
                    request = str(summary_meta(s)["request"])
                    break
    after = total - removed_chars + estimate_summary_chars(removed_chars, request)
    return CompactionPlan(
        cut=cut,
        boundary=boundary,
        removed=tuple(removed),
        kept=tuple(kept),
        order=tuple(order),
        request=request,
        total_chars=total,
        removed_chars=removed_chars,
        estimated_chars_after=after,
        threshold_chars=threshold,
    )


def _text_of(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
    return "\n".join(parts)
