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

The parts: :mod:`.plans` (the plan and the skip), :mod:`.budgets` (the thread's budget, the
gain, landing and summary sizes) and :mod:`.cut` (the cut rule: :func:`plan_compaction`,
:func:`extension`, over one pass over the messages and each cut's candidate).
"""
