"""Job leases: at most one compaction job per thread in flight, and recovery in seconds.

Each thread has one *claim* key (in Redis, or in the usage database for the
embedded demo). Its value says who holds the thread:

========================  =================================================  ==========================
value                     meaning                                            expires after
========================  =================================================  ==========================
``q:<job>``               a job is queued (or waiting for a retry)           ``CELERY_VISIBILITY_TIMEOUT_S``
``r:<job>:<token>``       one delivery of a job is running                   ``JOB_LEASE_S``, renewed
``p:<job>``               the job's compaction is prepared, to be applied    a day
                          once the thread is over its threshold
``d:<job>``               the job applied a compaction; the thread is free   10 minutes
``s:<job>:<chars>[:<at>]``  the job found nothing worth compacting at          a day
                          <chars>; worth it from <at> chars, if known
``b:<job>``               the job failed; no new job until the backoff ends  the backoff
(absent)                  free                                               -
========================  =================================================  ==========================

A running job's lease is renewed by :class:`LeaseKeeper` (a heartbeat every
third of ``JOB_LEASE_S``), so it is never taken over while its worker lives, and
lapses within ``JOB_LEASE_S`` when the worker dies (DESIGN.md invariant 11). The next turn or the
reconciler then queues the thread
again. ``d:<job>`` tells the post-turn hook whose compaction it may not have
seen yet (a turn that read the thread before a patch landed
must not queue a job after it). ``s:<job>:<chars>:<at>`` lets a caller that cannot
afford to plan (the middleware, at every model call) wait until the thread has
grown to the size from which the planner said a compaction is worth it (``<at>``;
without it, by a compaction's least gain) before it asks again: the no-progress
rule, kept in one key.

Every change is one atomic compare-and-swap on the key (:class:`KeyStore`): a
Lua script on Redis, a conditional ``UPDATE``/``INSERT`` in SQL.

The package: :mod:`.key_stores` (:class:`KeyStore` in Redis or SQL) and :mod:`.claims`
(the claim protocol, :class:`LeaseKeeper`, the failure backoff).
"""
