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

The parts, dependencies pointing down:

* :mod:`.fitting`: :func:`fit`, :func:`fit_now` and :func:`landed`, and the patch itself
  (kept tool results shortened to the target);
* :mod:`.prepared`: :class:`Prepared`, :class:`Fitted`, :class:`Stale`.
"""
