"""The agent's place in the session, kept in every summary (DESIGN.md invariant 15).
Pure: no I/O.

After a compaction an agent must know what it was asked first, what it is doing now, what is
done and what is still open, or it goes back to an older task or reopens finished work (the
most common complaint about compaction: Codex issues #25686, #34095, #31659). A summarizer,
LLM or not, may lose that; so it is read from the messages themselves, deterministically:

* the **task**: the session's first request (or the one an earlier summary recorded);
* the **latest request** when it differs. A follow-up such as "continue" or "proceed" is no
  request of its own: it continues the one before it;
* what is **done**: a request the agent answered (a text reply with no tool call, not an
  interim report) before the next one came; the steps of the agent's plan it reported done;
* what is **open**, open first: a tool call still waiting for its result, a tool call that
  failed (``status="error"``: never recorded as done), the latest request while it is being
  worked on, the plan's steps not done (the one under way named);
* what is **next**: the agent's last stated next step;
* the **instructions in force**: a request that revises an earlier one ("actually, use prod
  instead") supersedes it;
* the **decisions**: what a user's message fixes (an approved wording, a chosen option, "do
  not touch X"), word for word, carried for the session's life under
  :data:`DECISIONS_HEADING`;
* the **standing instructions**: a block sent with every user message
  (:mod:`offpath.compaction.standing`), named once and never taken for a request.

:func:`read_frontier` builds a :class:`Frontier` from the removed and kept messages and the
frontier the last summary carried (its metadata); :func:`into_summary` writes it into the
seed's template: the **Investigating** line says the task (and the latest request), word for
word within a budget, and **Current state** gains the open, done and next lines. The next
compaction reads it back from the summary's text (:meth:`Frontier.from_text`), never from
its metadata, which a client can forge; the plan's steps are carried so.

The parts: :mod:`.reading` (the frontier read from the messages) and :mod:`.form` (the
:class:`Frontier`, written into a summary and read back from it).
"""
