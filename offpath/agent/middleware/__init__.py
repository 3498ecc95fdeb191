"""``OffPathCompaction``: compaction for LangChain agents, with no model call waiting for it.

Replaces LangChain's ``SummarizationMiddleware`` in one line::

    from offpath import OffPathCompaction
    agent = create_agent(model, tools, checkpointer=saver,
                         middleware=[OffPathCompaction(checkpointer_url=DB_URL)])

All of its work at a model call happens inside the model call itself (``wrap_model_call``),
which adds no node to the graph: a run takes no more graph steps with offpath than with
LangChain's own ``SummarizationMiddleware``. Before the model is called:

1. the thread's size is advanced over the messages added since the last call (a private
   state key: O(new messages), no rescan);
2. each new tool result over ``TOOL_RESULT_MAX_CHARS`` is shortened (head, tail, the facts
   of the part cut out, how to read it) before any model call sees it; its original is
   archived first (:mod:`offpath.compaction.shorten`; DESIGN.md invariant 13);
3. over the threshold, a compaction the worker prepared is applied, fitted so that the
   thread lands under its prepare floor (kept tool results shortened as needed; else the job
   ends ``skipped: stale`` and a deeper one is prepared); with none ready, older tool
   results (outside the keep window) are shortened instead, so the call stays bounded while
   the summary is written; under it, a thread over its prepare floor whose last model call
   was ``SUMMARIZATION_IDLE_APPLY_S`` ago has the compaction prepared for it applied the
   same way (its claim read anew for it);
4. from the *prepare point* on, the thread's claim is read and a job is queued, both in
   background threads (the call never waits, not even for a broker that is down). The
   prepare point adapts: from the run's growth (chars per second) and the summarizer's
   measured latency (p90 of the deployment's recent compactions), the job starts early
   enough for its summary to be ready when the thread crosses its threshold, never later
   than ``SUMMARIZATION_PREPARE_AT`` x the threshold;
   the new messages' facts are found on the facts thread while the model answers and, past
   the keep window, stored in the fact store (:mod:`offpath.stores.facts`) for the job
   that removes them;
5. the model is sent the thread without orphan tool results (with the edits a middleware
   listed before offpath made to the call's copy, made again: offpath compacts and stores
   the state's own messages, never that copy), and if that would still
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

**Its threads are sessions**: at a thread's first model call in the process,
then at most every :data:`~.sessions.NOTE_EVERY_S` and at the run's end, the middleware records the
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
``RemoveMessage`` never reaches its parent's state (langgraph#5755).

The worker reads the thread from the agent's checkpointer by URL (``checkpointer_url``;
default: offpath's own ``DATABASE_URL`` / SQLite file). Settings come from the environment
and ``.env`` as for the service (``REDIS_URL``, ``DATABASE_URL``, the broker, the
thresholds), or pass ``settings``.

The package, by part (:class:`~offpath.agent.middleware.hooks.OffPathCompaction` builds each
with what it requires; each module's constants live where they are read: patch them there):
:mod:`.hooks` (the class, its hooks and the decisions of ``_before_call``), :mod:`.counting`
(the settings in force for a thread), :mod:`.pools` (the background threads), :mod:`.reports`
(outages, warnings, compaction updates), :mod:`.claims` (a thread's claim, read in the
background; the prepare point; a job queued), :mod:`.sessions` (an own agent's threads as
sessions), :mod:`.shaping` (shortening, what the model is sent, calibration),
:mod:`.applying` (a prepared compaction applied in the run, stored, recorded),
:mod:`.refusals` (a context-length refusal retried once, smaller) and :mod:`.state` (the
state, a call and its update; where a run stands among the graphs around it).
"""
