"""The coordination of a thread: who may compact it, when, and how a result reaches it.

* :mod:`.runtime`: what a process opens to queue, run and apply compactions;
* :mod:`.hook`: the post-turn hook (the threshold check that queues a job);
* :mod:`.jobs`: the one owner of a job's life and state (queue, start, prepare, apply,
  record, end, revert) and the values it passes around (what a job carries), with :mod:`.writers`
  (the checkpoint patch and the run's state update a compaction is written by);
* :mod:`.revert`: undoing one;
* :mod:`.locks`: thread locks (Redis or SQL); :mod:`.broker`, :mod:`.consumers`: the
  Celery broker's queues and the workers listening on it;
* :mod:`.admin`: the operator's actions (force, cancel, forget);
* :mod:`.metrics`, :mod:`.logs`, :mod:`.faults`, :mod:`.eviction`: what a process reports,
  and the checks and fault points it runs.

May import :mod:`offpath.compaction`, :mod:`offpath.events` and :mod:`offpath.stores`:
never the agent side, the worker, the API or the CLI (``tests/test_layout.py`` checks it).
"""
