"""``OffPathCompaction``: compaction for LangChain agents, with no model call waiting for it.

Replaces LangChain's ``SummarizationMiddleware`` in one line::

    from offpath import OffPathCompaction
    agent = create_agent(model, tools, checkpointer=saver,
                         middleware=[OffPathCompaction(checkpointer_url=DB_URL)])

All of its work at a model call happens inside the model call itself (``wrap_model_call``),
which adds no node to the graph: a run takes no more graph steps with offpath than with
LangChain's own ``SummarizationMiddleware`` (issue 21, item 5). Before the model is called:

1. the thread's size is advanced over the messages added since the last call (a private
   state key: O(new messages), no rescan);
2. each new tool result over ``TOOL_RESULT_MAX_CHARS`` is shortened (head, tail, the facts
   of the part cut out, how to read it) before any model call sees it; its original is
   archived first (:mod:`offpath.compaction.shorten`; DESIGN.md invariant 13);
3. over the threshold, a compaction the worker prepared is applied, fitted so that the
   thread lands under its prepare floor (kept tool results shortened as needed; else the job
   ends ``skipped: stale`` and a deeper one is prepared); with none ready, older tool
   results (outside the keep window) are shortened instead, so the call stays bounded while
   the summary is written;
4. from the *prepare point* on, the thread's claim is read and a job is queued, both in
   background threads (the call never waits, not even for a broker that is down). The
   prepare point adapts: from the run's growth (chars per second) and the summarizer's
   measured latency (p90 of the deployment's recent compactions), the job starts early
   enough for its summary to be ready when the thread crosses its threshold, never later
   than ``SUMMARIZATION_PREPARE_AT`` x the threshold;
5. the model is sent the thread without orphan tool results, and if that would still
   exceed ``CONTEXT_HARD_LIMIT_CHARS`` (the system prompt counted), the oldest tool results
   are masked for that call only, then, if that is not enough, the oldest AI messages' text
   and call arguments (never the request nor the latest step; logged and counted,
   ``/stats`` ``fallback_maskings``).

If the provider refuses the call as over its context length, the call is made smaller (the
prepared compaction applied, else older messages shortened and the rest masked, under the
prepare floor and what was refused) and retried once; a second refusal ends the run with
:class:`~offpath.agent.middleware.refusals.ContextRefused`.

What changed in the thread (shortened results, the compaction) is returned with the model's
answer as the model node's own state update; the compaction is recorded (job ``applied``,
its usage row) once it is in the state, at the next call or at the end of the run
(``after_agent``). The stored thread is never written by offpath in a user's own agent:
the worker only prepares (``patch=False``).

**Its threads are sessions** (issue 21, item 1): at a thread's first model call in the process,
then at most every :data:`NOTE_EVERY_S` and at the run's end, the middleware records the
thread in offpath's ``sessions`` table (kind ``own agent``, tenant ``OWN_AGENT_TENANT`` or
``tenant=``, its checkpointer's URL, its size), in the background: ``GET /sessions``, the web
UI and ``offpath sessions`` list it for that tenant's keys, ``GET /sessions/{id}/messages``
reads it from the agent's checkpointer, and ``POST /sessions/{id}/compact`` queues a job that
the worker prepares and this middleware applies at the thread's next model call (under the
threshold too: an operator asked for it), or at the run's end.

**Used as a subgraph** (an agent compiled with this middleware and added as a node of a
parent graph that shares ``messages``): the worker reads the subgraph's own checkpoint
namespace, and at the end of a run that removed messages the middleware hands the parent
its thread whole (``Command(graph=Command.PARENT)``), since a subgraph's
``RemoveMessage`` never reaches its parent's state (langgraph#5755; issue 18, item 5).

The worker reads the thread from the agent's checkpointer by URL (``checkpointer_url``;
default: offpath's own ``DATABASE_URL`` / SQLite file). Settings come from the environment
and ``.env`` as for the service (``REDIS_URL``, ``DATABASE_URL``, the broker, the
thresholds), or pass ``settings``.

The package, by concern (each module's constants live where they are read: patch them there):
:mod:`.hooks` (the class, its hooks and ``_before_call``), :mod:`.claims` (a thread's claim,
read in the background), :mod:`.shaping` (shortening, what the model is sent, calibration, the
prepare point), :mod:`.applying` (a prepared compaction applied in the run, stored, recorded),
:mod:`.pools` (the background pools), :mod:`.refusals` (a context-length refusal retried once,
smaller), :mod:`.state` and :mod:`.helpers` (at the bottom).
"""

from __future__ import annotations

from offpath.agent.middleware.applying import ARCHIVE_WAIT_S
from offpath.agent.middleware.claims import (
    CLAIM_REFRESH_S,
    FIRST_READ_WAIT_S,
    FORCED_REFRESH_S,
    NOTE_EVERY_S,
    PICKUP_WARN_S,
    STORE_RETRY_S,
)
from offpath.agent.middleware.helpers import outside_chars
from offpath.agent.middleware.hooks import END_READ_WAIT_S, OffPathCompaction
from offpath.agent.middleware.pools import POOLS
from offpath.agent.middleware.refusals import ContextRefused, context_refusal
from offpath.agent.middleware.shaping import (
    DEFAULT_LATENCY_S,
    JOB_OVERHEAD_S,
    LATENCY_REFRESH_S,
    RATE_WEIGHT,
)
from offpath.agent.middleware.state import OffPathState
from offpath.compaction.tracking import KEY
from offpath.coordination.writers import LOSS_PENDING

__all__ = [
    "ARCHIVE_WAIT_S",
    "CLAIM_REFRESH_S",
    "DEFAULT_LATENCY_S",
    "END_READ_WAIT_S",
    "FIRST_READ_WAIT_S",
    "FORCED_REFRESH_S",
    "JOB_OVERHEAD_S",
    "KEY",
    "LATENCY_REFRESH_S",
    "LOSS_PENDING",
    "NOTE_EVERY_S",
    "PICKUP_WARN_S",
    "POOLS",
    "RATE_WEIGHT",
    "STORE_RETRY_S",
    "ContextRefused",
    "OffPathCompaction",
    "OffPathState",
    "context_refusal",
    "outside_chars",
]
