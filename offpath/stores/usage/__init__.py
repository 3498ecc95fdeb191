"""Reading the usage tables for people: ``/stats`` (time windows, one session), the session
list, and forgetting a session's rows.

Where each figure comes from (the cheapest source that is right):

* a session's owner, last activity, messages and chars: the ``sessions`` table
  (:class:`~offpath.stores.tenants.SessionOwner`), written by every write offpath makes
  to one of its own threads (a turn, a chat run, a compaction patch), so listing and
  sorting never read a checkpoint;
* compactions and jobs: ``compaction_jobs`` (one row per job, indexed by session);
* what was saved, and what the summarizer cost: ``usage_events`` (one per applied
  compaction, with the tokens the LLM reported);
* fallback maskings: ``fallback_maskings``.

Threads of a team's own agent (the middleware in their process) have a row in ``sessions``
of kind ``own agent``, written by the middleware: they are listed, and
counted in ``/stats``, for the tenant it names, like the API's.

The package: :mod:`.totals` (``/metrics`` counts, the summarizer's latency),
:mod:`.stats_body` (``/stats``) and :mod:`.sessions` (the session list, forgetting a
session); when a thread crossed its threshold is marked on its job's row
(:func:`offpath.stores.db.transitions.note_crossing`).
"""
