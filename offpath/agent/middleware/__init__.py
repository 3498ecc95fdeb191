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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Annotated, Any, NotRequired, get_type_hints

from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain.agents.middleware.types import (
    ExtendedModelResponse,
    ModelRequest,
    ModelResponse,
    OmitFromSchema,
    PrivateStateAttr,
)
from langchain_core.messages import BaseMessage, RemoveMessage
from langgraph.config import get_config
from langgraph.graph.message import REMOVE_ALL_MESSAGES, add_messages
from langgraph.types import Command

from offpath.agent.recall import recall_tool, thread_of_run
from offpath.compaction.accounting import message_chars
from offpath.compaction.facts import warm as warm_facts
from offpath.compaction.pairing import new_unpaired
from offpath.compaction.patch import Fitted, Prepared, Stale, fit, landed
from offpath.compaction.planner import (
    EARLY_KEEP_SHARE,
    landing_chars,
    min_gain_chars,
    request_cap_chars,
    summary_budget_chars,
)
from offpath.compaction.settings import Settings, get_settings
from offpath.compaction.shorten import MIN_OLDER_CHARS, arrival_caps, older_caps, shorten_each
from offpath.compaction.tokens import Calibration
from offpath.compaction.tracking import KEY, ThreadSize, mask_observations
from offpath.coordination.compactions import JobOptions, end_stale, head_mark, with_loss
from offpath.coordination.logs import tag
from offpath.coordination.runtime import Client
from offpath.events import CompactionUpdate
from offpath.stores import archive
from offpath.stores.db import (
    JobStatus,
    finalize,
    job_options,
    job_row,
    record_masking,
    set_job,
)
from offpath.stores.leases import Claim, Leases, State
from offpath.stores.tenants import note_own_thread
from offpath.stores.usage import crossing_unseen, note_crossing, summarizer_latency_p90_s

log = logging.getLogger("offpath.middleware")

#: How often (seconds) the background thread re-reads a thread's claim while the thread is
#: over its prepare point (every call, once over the threshold with a job in flight); and
#: how long it leaves an unreachable store alone.
CLAIM_REFRESH_S = 0.2
STORE_RETRY_S = 5.0
#: The longest (s) a model call over the threshold waits for the first read of its thread's
#: claim (a new process, a new run): a Redis GET takes a millisecond once the client is open
#: (:meth:`OffPathCompaction._warm` opens it as the agent is built), but a new process's
#: first call can come before that ends (about 50 ms, more on a loaded host); a store that
#: does not answer costs at most this, once per thread and process. Without it the call
#: shortens older results and the compaction the worker prepared waits for a later crossing.
FIRST_READ_WAIT_S = 0.25
#: At the run's end (``after_agent``: no model call is left to hold up), over the threshold,
#: the longest (s) it waits for that first read still in flight: a new process's first run
#: (a Redis client to open on a loaded host) would else end without the compaction the
#: worker prepared, and a short run has no later call to apply it.
END_READ_WAIT_S = 1.0
#: How often (s) at most a thread's size and last activity are recorded in offpath's
#: ``sessions`` table during a run (also at its first call and at the run's end).
NOTE_EVERY_S = 5.0
#: How long (s) whether a prepared job was forced (compact now) is remembered before the job
#: row is read again.
FORCED_REFRESH_S = 2.0
#: A queued job no worker has taken after this long (s) is reported once (issue 21, item 3).
PICKUP_WARN_S = 10.0
#: How often (s) the summarizer's latency p90 is read again, and what it is assumed to be
#: before any compaction of the deployment measured it.
LATENCY_REFRESH_S = 60.0
DEFAULT_LATENCY_S = 5.0
#: Seconds a job takes beyond its summarizer: publish, a worker taking it, the checkpoint
#: catching up with the run (LangGraph writes it in the background), storing the result.
JOB_OVERHEAD_S = 1.5
#: Weight of the newest sample in the run's growth rate (exponential moving average).
RATE_WEIGHT = 0.5
#: The longest (s) a model call's answer waits, once the model has answered, for the archive
#: writes of that call's shortenings and apply (they overlap the model call; the state update
#: that shortens or compacts the thread is returned only once its originals are archived).
ARCHIVE_WAIT_S = 30.0
#: The loss report of a compaction applied in a run, until it is made: it is made after the
#: swap, on the writer thread (the removed part's facts: tens of ms of CPU that the model
#: call no longer waits for), and replaces this in the job's stored record.
LOSS_PENDING = {
    "error": "made after the swap, off the model call's path: not there yet, or the agent's "
    "process ended before it was made"
}


@dataclass(slots=True)
class _Seen:
    claim: Claim | None = None
    at: float = 0.0  # monotonic time of the last read (or failed read)
    failed: bool = False
    reading: bool = False
    #: the prepared job of ``claim`` was asked for by an operator (compact now), as last read
    forced: bool = False
    forced_at: float = 0.0
    #: set once a read has ended (:meth:`OffPathCompaction._await_claim` waits on it)
    read: threading.Event = field(default_factory=threading.Event)


class OffPathState(AgentState):
    offpath: NotRequired[Annotated[dict[str, Any], PrivateStateAttr]]


#: The middleware's background threads, by name: how many each pool has, and what runs
#: there. Each kind of work has its own, so that none waits behind another (issue 18,
#: item 4: claim reads starved behind publishes and counters).
POOLS = {
    "read": 1,  # claim and latency reads
    "write": 2,  # publishes, counters, loss reports
    "archive": 2,  # archive writes a model call's update waits for
    "facts": 1,  # facts of new messages, read ahead
}


#: An archive write a model call makes: the job it stores (None: results shortened), and
#: the write itself.
_Write = tuple[str | None, Callable[[], None]]


@dataclass(slots=True)
class _Call:
    """One model call: the request to send, and the state update to return with the answer."""

    request: ModelRequest
    update: dict[str, Any] = field(default_factory=dict)
    chars: int = 0  # what the call is sent (messages), for the calibration
    session_id: str | None = None
    #: the archive writes of this call's shortenings and apply, in the order they were
    #: made, running (one after another) while the model answers
    stored: Future[Any] | None = None
    #: the thread's size as the state had it before the call (put back if a write fails)
    size_before: dict[str, Any] | None = None


class OffPathCompaction(AgentMiddleware[OffPathState]):
    """Off-path compaction for a LangChain ``create_agent`` agent (see the module doc).

    ``settings``: offpath's settings (default: read from the environment and ``.env``).
    ``checkpointer_url``: where the worker reads the agent's threads
    (``postgresql://...`` or ``sqlite:///path``; default: offpath's own).
    ``patch``: offpath's own API agent only (the worker may then write the thread
    between runs). ``client``: the usage DB, leases and publisher to use (default:
    opened from ``settings`` as the agent is built, its lease store's connection warmed in
    the background; if that fails, on first use, which says why). ``recall``: give the agent the ``recall`` tool
    (:mod:`offpath.agent.recall`), which searches the thread's archived originals.
    ``on_compaction``: called with each :class:`~offpath.events.CompactionUpdate` of the
    run's thread (queued, completed, failed, cancelled; issue 21, item 4); what it raises is
    logged, never raised into the run. ``tenant``: the tenant whose API keys see this agent's
    threads (default ``OWN_AGENT_TENANT``, itself ``default``).
    """

    state_schema = OffPathState

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        checkpointer_url: str | None = None,
        patch: bool = False,
        client: Client | None = None,
        recall: bool = True,
        on_compaction: Callable[[CompactionUpdate], Any] | None = None,
        tenant: str | None = None,
    ) -> None:
        super().__init__()
        self.on_compaction = on_compaction
        #: ``recall`` (issue 11): the agent reads its thread's archived originals.
        self.tools = [recall_tool(lambda: self.client.engine)] if recall else []
        self.recall = recall
        self.settings = settings or get_settings()
        self.options = JobOptions(patch=patch, checkpoints=checkpointer_url)
        self.tenant = tenant or self.settings.own_agent_tenant
        self._noted: dict[str, float] = {}  # thread -> when its session row was last written
        self._client = client
        self._guard = threading.Lock()
        self._publishing: set[str] = set()
        self._published: dict[str, tuple[str | None, float]] = {}  # thread -> (job?, when)
        self._claims: dict[str, _Seen] = {}
        self._pools: dict[str, ThreadPoolExecutor] = {}  # by name, see POOLS
        self._storing: set[str] = set()  # jobs whose archive write is in flight
        self._warned: set[str] = set()
        self._latency: tuple[float, float] = (DEFAULT_LATENCY_S, 0.0)  # (p90 s, read at)
        #: chars sent per input token the provider reported (``usage_metadata``), over this
        #: agent's calls: the CHARS_PER_TOKEN to set for SUMMARIZATION_THRESHOLD_TOKENS
        self.calibration = Calibration(default=self.settings.chars_per_token)
        if self.settings.active:
            if self._client is None:  # its imports and pools now, as the agent is built
                with contextlib.suppress(Exception):  # else on first use, which says why
                    self._client = Client.open(self.settings)
            self._read(self._warm)

    @property
    def client(self) -> Client:
        with self._guard:
            if self._client is None:
                self._client = Client.open(self.settings)
            return self._client

    # --- hooks --------------------------------------------------------------------------

    def wrap_model_call(self, request: ModelRequest, handler: Any) -> Any:
        call = self._before_call(request)
        response = handler(call.request)
        self._settle(call)
        return self._answer(call, response)

    async def awrap_model_call(self, request: ModelRequest, handler: Any) -> Any:
        call = await asyncio.to_thread(self._before_call, request)  # it reads the job row
        response = await handler(call.request)
        if call.stored is not None:
            await asyncio.to_thread(self._settle, call)
        return self._answer(call, response)

    def after_agent(self, state: OffPathState, runtime: Any) -> dict[str, Any] | Command | None:
        """The end of the run: record a compaction applied at its last model call; apply a
        prepared one if the run's last messages took the thread over its threshold (the next
        run starts compacted; the reconciler records it, as no step of this run is left);
        queue a job if the thread is over its prepare point; and in a subgraph that removed
        messages hand the parent the thread whole."""
        session_id = thread_of_run()
        if session_id is None:
            return None
        messages: list[BaseMessage] = state["messages"]
        private = dict(state.get(KEY) or {})
        if pending := private.get("pending"):
            self._record(session_id, pending, messages)
            private["pending"] = None
        size = ThreadSize.from_state(private.get("size")).advance(messages)
        update: dict[str, Any] = {}
        s = self.settings
        out = _outside(private)  # the run's calls sent that besides the thread
        over = size.chars + out > s.summarization_threshold_chars
        if s.active and (over or not self.options.patch):
            known, holder = self._claim_of(session_id, urgent=over)
            if over and not known:
                known, holder = self._await_claim(session_id, END_READ_WAIT_S)
            prepared = known and holder is not None and holder.state is State.PREPARED
            if prepared and (over or self._forced(session_id)):
                assert holder is not None
                applied = self._apply(session_id, holder.job_id, messages, out)
                self._forget_claim(session_id)
                if applied is not None:
                    fitted, private["pending"] = applied
                    update["messages"] = fitted.patch
                    messages = add_messages(messages, fitted.patch)
                    size = ThreadSize().advance(messages)
                    private["removed"] = True
        if s.active and not self.options.patch:
            self._note_soon(session_id, len(messages), size.chars, every=0.0)
        if s.active and size.chars + out >= self._prepare_point(private):
            known, holder = self._claim_of(session_id)
            if known and (
                holder is None
                or holder.frees_for(size.chars + out, self._min_gain, self._threshold)
            ):
                self._publish_soon(session_id, size.chars + out, messages, private)
        if private.get("removed") and _graph_ns():
            return Command(
                graph=Command.PARENT, update=_parent_update({**state, "messages": messages})
            )
        return {**update, KEY: {**private, "size": size.to_state(), "removed": False}}

    def busy(self, session_id: str) -> bool:
        """A compaction job for the thread is being queued by this process, a read of its
        claim is in flight, or its claim (read now from the lease store) names a job queued
        or running; when none is, the claim just read becomes the one the next call sees (as
        a background read would make it). The demo's scripted model waits on it
        (``SCRIPTED_JOB_WAIT_S``) so that the demo takes the same steps at every run; False
        when the store cannot be read."""
        with self._guard:
            seen = self._claims.get(session_id)
            if session_id in self._publishing or (seen is not None and seen.reading):
                return True
        try:
            claim = self.client.leases.holder(session_id)
        except Exception:
            return False
        if claim is not None and claim.in_flight:
            return True
        with self._guard:
            seen = self._claims.setdefault(session_id, _Seen())
            if not seen.reading:
                seen.claim, seen.failed, seen.at = claim, False, time.monotonic()
                seen.read.set()
        return False

    # --- a model call -------------------------------------------------------------------

    @property
    def _min_gain(self) -> int:
        return min_gain_chars(self.settings)

    @property
    def _threshold(self) -> int:
        return self.settings.summarization_threshold_chars

    def _before_call(self, request: ModelRequest) -> _Call:
        settings = self.settings
        state = request.state or {}
        private = dict(state.get(KEY) or {})
        size_before = private.get("size")
        original: list[BaseMessage] = list(request.messages)
        old = ThreadSize.from_state(size_before)
        size = old.advance(original)
        unchanged = bool(old.n) and old.n <= len(original) and original[old.n - 1].id == old.last
        new_from = old.n if unchanged else 0
        messages = original
        session_id = thread_of_run()
        writes: list[_Write] = []  # archive writes, made while the model answers
        if session_id is not None and settings.active:
            if pending := private.get("pending"):
                self._record(session_id, pending, messages)
                private["pending"] = None
            # 1. new results over TOOL_RESULT_MAX_CHARS (a batch of parallel ones sharing the
            #    keep window), before any model call sees them
            big = arrival_caps(
                messages[new_from:],
                settings.tool_result_limit_chars,
                settings.summarization_keep_chars,
            )
            if big:
                messages = self._shorten(session_id, messages, big, "as it arrived", writes=writes)
            threshold = settings.summarization_threshold_chars
            # sizes count the thread; ``out`` is what the call sends besides it (a system
            # prompt given to create_agent), counted against the threshold and floors
            out = private["outside"] = outside_chars(request)
            chars = sum(message_chars(m) for m in messages) if big else size.chars
            reached = chars
            # 2. over the threshold: the prepared compaction, else older results shortened
            if chars + out > threshold:
                known, holder = self._claim_of(session_id, urgent=True)
                log.debug(
                    "[%s] call over the threshold: %d chars; claim %s (known: %s)",
                    tag(session_id),
                    chars,
                    holder.raw if holder else None,
                    known,
                )
                if crossing_unseen(holder):
                    self._write(note_crossing, self.client.engine, holder)  # the lag runs here
                if known and holder is not None and holder.state is State.PREPARED:
                    messages, chars = self._apply_now(
                        session_id, holder, messages, private, chars, out, writes
                    )
                # the size the thread reached, before this call's own shortening of older
                # results: a skip that holds the thread is weighed against it (a thread kept
                # under its threshold by shortening alone still needs its compaction)
                reached = chars
                if chars + out > threshold:
                    need = chars + out - settings.prepare_floor_chars
                    keep = settings.summarization_keep_chars
                    first_new = original[new_from].id if new_from < len(original) else None
                    at = next(
                        (i for i, m in enumerate(messages) if m.id == first_new), len(messages)
                    )
                    caps = older_caps(messages, keep, need, at, request_cap_chars(settings))
                    if caps:
                        messages = self._shorten(
                            session_id,
                            messages,
                            caps,
                            "over the threshold",
                            MIN_OLDER_CHARS,
                            writes,
                        )
                        chars = sum(message_chars(m) for m in messages)
            elif not self.options.patch:
                # an operator's "compact now" of this thread (issue 21, item 1): its
                # compaction is applied at the next call, under the threshold too
                known, holder = self._claim_of(session_id)
                if known and holder is not None and holder.state is State.PREPARED:
                    if self._forced(session_id):
                        messages, chars = self._apply_now(
                            session_id, holder, messages, private, chars, out, writes
                        )
            size = ThreadSize().advance(messages) if messages is not original else size
            if not self.options.patch:
                self._note_soon(session_id, len(messages), size.chars)
            # 3. from the prepare point on: the claim, and a job when the thread is free
            self._track_rate(private, size.chars)
            point = self._prepare_point(private)
            now, reached = size.chars + out, reached + out  # as a call sends them
            if max(now, reached) >= point:
                known, holder = self._claim_of(session_id)
                self._check_pickup(session_id, holder)
                if known and (holder is None or holder.frees_for(now, self._min_gain)):
                    self._publish_soon(session_id, now, messages, private)
                elif known and self._crossing_frees(holder, reached, private):
                    # planned from the size the thread is now (its older results shortened
                    # to keep it under the threshold), not from the prepare point over it
                    planned = min(now, point) - 1
                    self._publish_soon(session_id, reached, messages, private, planned)
        private["size"] = size.to_state()
        if session_id is not None and settings.active and new_from < len(original):
            fresh = {m.id for m in original[new_from:]}
            self._read_ahead([m for m in messages if m.id in fresh])
        call = _Call(
            self._shape(request, messages, size, session_id),
            {KEY: private},
            size.chars,
            session_id,
            self._store(writes) if writes else None,
            size_before,
        )
        if messages is not original:
            call.update["messages"] = _diff(original, messages)
        return call

    def _apply_now(
        self,
        session_id: str,
        holder: Claim,
        messages: list[BaseMessage],
        private: dict[str, Any],
        chars: int,
        out: int = 0,
        writes: list[_Write] | None = None,
    ) -> tuple[list[BaseMessage], int]:
        """Apply the prepared compaction of ``holder`` to this call's ``messages`` (``out``:
        chars the call sends besides them): the messages and their size after it (unchanged
        if it did not apply). ``writes``: see :meth:`_apply`."""
        applied = self._apply(session_id, holder.job_id, messages, out, writes)
        self._forget_claim(session_id)
        if applied is None:
            return messages, chars
        fitted, pending = applied
        private["pending"] = pending
        private["removed"] = True
        private["crossed"] = False  # a new crossing may queue a job again
        return add_messages(messages, fitted.patch), int(fitted.record["chars_after"])

    def _crossing_frees(self, holder: Claim | None, reached: int, private: dict[str, Any]) -> bool:
        """A skip decided under the threshold frees a thread that crossed it (``reached``:
        its size before this call shortened older results), once until the next compaction
        is applied: the thread's counted size is held near the prepare floor by that
        shortening, so the skip's gain rule alone would hold it while every call goes over
        the threshold (benchmark 17, sre-75k-dump at 20,000 / 6,000: one job in 34 calls; a
        pure replay held it from call 4 to call 13). A job queued so, which then finds
        nothing worth compacting, leaves a skip decided under the threshold again: the
        ``crossed`` flag stops a job per call."""
        if holder is None or private.get("crossed"):
            return False
        if not holder.frees_for(reached, self._min_gain, self._threshold):
            return False
        private["crossed"] = True
        return True

    def _store(self, writes: list[_Write]) -> Future[Any]:
        """Start a call's archive writes on the archive threads, one after another in the
        order they were made (a result shortened on arrival and again in the same call: the
        first write archives the original, the later one finds it there), while the model
        answers. A job with a write in flight is not applied again until it ends."""
        jobs = {job for job, _ in writes if job}
        with self._guard:
            self._storing |= jobs

        def run() -> None:
            try:
                for _, write in writes:
                    write()
            finally:
                with self._guard:
                    self._storing -= jobs

        return self._archive(run)

    def _settle(self, call: _Call) -> None:
        """Wait (at most :data:`ARCHIVE_WAIT_S`) for the archive writes the call started; if
        they failed, the state update keeps the thread as it was: the model saw it shortened
        or compacted for this call only, nothing is lost (invariant 12: removed is archived),
        the size the state had before the call is kept (the call's new messages are looked at
        again at the next one), and a compaction applied in the call is not recorded (its job
        stays prepared, applied at a later call)."""
        if call.stored is None or call.session_id is None:
            return
        try:
            call.stored.result(timeout=ARCHIVE_WAIT_S)
            return
        except Exception as exc:  # the write failed, or is still running after the wait
            failed = exc
        private = call.update[KEY]
        pending = private.get("pending")
        log.warning(
            "[%s] could not archive what this call shortened or removed: %s; the thread keeps "
            "its messages as they were",
            tag(call.session_id),
            failed or "timed out",
        )
        call.update.pop("messages", None)
        private.update(size=call.size_before, pending=None, removed=False)
        if pending:
            job_id = pending["job_id"]
            reason = f"not applied in this call (its archive write: {failed or 'timed out'})"
            self._tell(call.session_id, job_id, "cancelled", reason=reason)

    def _answer(self, call: _Call, response: Any) -> Any:
        self._calibrate(call.chars, response)
        if isinstance(response, ModelResponse):
            return ExtendedModelResponse(
                model_response=response, command=Command(update=call.update)
            )
        return ExtendedModelResponse(
            model_response=ModelResponse(result=[response]), command=Command(update=call.update)
        )

    def _calibrate(self, chars: int, response: Any) -> None:
        """Add the call to :attr:`calibration` (arithmetic only: the provider counted the
        tokens); once calibrated, say once if CHARS_PER_TOKEN is over 10% off the ratio."""
        result = response.result if isinstance(response, ModelResponse) else [response]
        answer = next((m for m in result if getattr(m, "usage_metadata", None)), None)
        if answer is None or not self.calibration.observe(chars, answer):
            return
        c = self.calibration
        if c.calibrated and abs(c.chars_per_token / self.settings.chars_per_token - 1) > 0.1:
            self._warn_once(
                "chars_per_token",
                f"the model's provider reports {c.chars_per_token:.2f} chars per input token "
                f"over {c.calls} calls; CHARS_PER_TOKEN is {self.settings.chars_per_token:g}"
                + (
                    f": SUMMARIZATION_THRESHOLD_TOKENS={self.settings.summarization_threshold_tokens} "
                    f"triggers at {self.settings.summarization_threshold_chars:,} chars, "
                    f"{c.to_chars(self.settings.summarization_threshold_tokens):,} at the measured "
                    "ratio (set CHARS_PER_TOKEN to it)"
                    if self.settings.summarization_threshold_tokens
                    else ""
                ),
            )

    def _shape(
        self,
        request: ModelRequest,
        messages: list[BaseMessage],
        size: ThreadSize,
        session_id: str | None,
    ) -> ModelRequest:
        """What the model is sent: ``messages`` without orphan tool results, the oldest tool
        results masked if it would still be over the hard limit, then the oldest AI messages'
        text and call arguments if that is not enough (the system prompt counted: DESIGN.md
        invariant 13, every call; :func:`~offpath.compaction.tracking.mask_observations`)."""
        sent = messages
        if size.orphans:
            orphans = set(size.orphans)
            sent = [m for m in messages if m.id not in orphans]
        limit = self.settings.hard_limit_chars
        system_chars = outside_chars(request)
        if self.settings.active and size.chars + system_chars > limit:
            sent, masking = mask_observations(sent, limit - system_chars)
            hid = masking.results + masking.messages
            if hid:
                sid = session_id or "?"
                log.warning(
                    "[%s] context over its hard limit (%d > %d chars) with no summary ready: "
                    "masked %d old tool results and %d old AI messages (%d chars) for this call",
                    tag(sid),
                    size.chars + system_chars,
                    limit,
                    masking.results,
                    masking.messages,
                    masking.chars,
                )
                if session_id is not None:
                    self._write(self._count_masking, session_id, hid, masking.chars)
        if sent is request.messages:
            return request
        return request.override(messages=sent)

    # --- shortening, applying, recording ----------------------------------------------------

    def _shorten(
        self,
        session_id: str,
        messages: list[BaseMessage],
        caps: dict[str, int],
        why: str,
        floor: int | None = None,
        writes: list[_Write] | None = None,
    ) -> list[BaseMessage]:
        """``messages`` with the messages named in ``caps`` shortened to their cap (not below
        ``floor``), their originals archived (:func:`archive.store_shortened`): first, or,
        given ``writes``, while the model answers (the write is added to ``writes``;
        :meth:`_settle` waits for it before the update is returned). Nothing shortened if the
        archive cannot be written first."""
        try:
            out, originals = shorten_each(messages, caps, recall=self.recall, floor=floor)
            if originals:
                write = partial(archive.store_shortened, self.client.engine, session_id, originals)
                if writes is None:
                    write()
                else:
                    writes.append((None, write))
        except Exception as exc:  # unarchived, nothing is shortened: the hard limit still holds
            log.warning("[%s] could not archive results to shorten: %s", tag(session_id), exc)
            return messages
        if out is not messages:
            saved = sum(message_chars(m) for m in messages) - sum(message_chars(m) for m in out)
            log.info(
                "[%s] shortened %d message(s) %s: -%d chars (originals archived)",
                tag(session_id),
                sum(a is not b for a, b in zip(messages, out, strict=True)),
                why,
                saved,
            )
        return out

    def _apply(
        self,
        session_id: str,
        job_id: str,
        messages: list[BaseMessage],
        out: int = 0,
        writes: list[_Write] | None = None,
    ) -> tuple[Fitted, dict[str, Any]] | None:
        """The fitted compaction of job ``job_id`` (its patch lands the thread under its
        prepare floor) and what to record once it is in the state; None if there is nothing
        to apply. Its record and the originals it removes are stored (invariant 12) first,
        or, given ``writes``, while the model answers (see :meth:`_shorten`); its loss report
        (issue 19) after that, on the writer thread (:data:`LOSS_PENDING` until then)."""
        client = self.client
        with self._guard:
            if job_id in self._storing:  # an earlier call's write of it is still running
                return None
        try:
            row = job_row(client.engine, job_id)
            if row is None or row["status"] != JobStatus.PREPARED or not row["result"]:
                return None
            result = row["result"]
            if landed(messages, job_id, result.get("record")):  # a crashed run had applied it
                self._record(session_id, {"job_id": job_id, "record": result["record"]}, messages)
                return None
            forced = bool((row.get("options") or {}).get("force"))
            fitted = fit(
                Prepared.from_json(result["prepared"]),
                messages,
                # compact now: no bound, as for offpath's own threads (apply_locked)
                target=None if forced else landing_chars(self.settings),
                recall=self.recall,
                settings=self.settings,
                outside_chars=out,
            )
            if isinstance(fitted, Stale):
                end_stale(client.engine, client.leases, session_id, job_id, fitted)
                self._tell(session_id, job_id, "cancelled", reason=f"stale: {fitted.reason}")
                return None
            if broken := new_unpaired(messages, add_messages(messages, fitted.patch)):
                reason = f"patch would orphan tool calls {sorted(broken)}"
                set_job(client.engine, job_id, session_id, JobStatus.FAILED, reason, "orphan_guard")
                client.leases.settle(session_id, job_id, None)
                self._tell(session_id, job_id, "failed", reason=reason)
                return None
            write = partial(self._store_applied, session_id, job_id, result, fitted, messages)
            if writes is None:
                write()
            else:
                writes.append((job_id, write))
        except Exception as exc:  # the run goes on uncompacted; the reconciler tidies up
            log.warning("[%s] could not apply job %s: %s", tag(session_id), job_id, exc)
            self._tell(session_id, job_id, "failed", reason=f"not applied: {exc}")
            return None
        log.info(
            "[%s] applying job %s in the run: %d -> %d chars",
            tag(session_id),
            job_id,
            fitted.record["chars_before"],
            fitted.record["chars_after"],
        )
        return fitted, {"job_id": job_id, "record": fitted.record}

    def _store_applied(
        self,
        session_id: str,
        job_id: str,
        result: dict[str, Any],
        fitted: Fitted,
        messages: list[BaseMessage],
    ) -> None:
        """Store the record of job ``job_id``'s compaction fitted to ``messages`` and the
        originals it removes (before its patch is in the state), then have its loss report
        made on the writer thread."""
        rows = archive.rows_for(
            session_id, job_id, str(fitted.summary.id), messages, fitted.removed, fitted.shortened
        )
        record = {**fitted.record, "loss": LOSS_PENDING}
        archive.store_record(self.client.engine, job_id, {**result, "record": record}, rows)
        self._write(self._report_loss, session_id, job_id, fitted, messages)

    def _report_loss(
        self, session_id: str, job_id: str, fitted: Fitted, messages: list[BaseMessage]
    ) -> None:
        """Make job ``job_id``'s loss report (:func:`with_loss`, which never raises) and put it
        in its stored record."""
        loss = with_loss(fitted, messages)["loss"]
        try:
            archive.store_loss(self.client.engine, job_id, str(fitted.summary.id), loss)
        except Exception as exc:  # the record keeps LOSS_PENDING, which says so
            log.warning(
                "[%s] could not store the loss report of job %s: %s", tag(session_id), job_id, exc
            )

    def _record(
        self, session_id: str, pending: dict[str, Any], messages: list[BaseMessage]
    ) -> None:
        """Record a compaction this run applied, once its summary is in the state (exactly
        once: the usage event is unique by job id)."""
        job_id, record = pending["job_id"], pending["record"]
        if not landed(messages, job_id, record):
            log.warning(
                "[%s] the update of job %s did not land; not recorded", tag(session_id), job_id
            )
            return
        client = self.client
        try:
            finalize(client.engine, job_id, session_id)
            client.leases.settle(session_id, job_id, Leases.after(job_id, State.DONE))
        except Exception as exc:  # a later job or the reconciler records it
            log.warning("[%s] could not record job %s: %s", tag(session_id), job_id, exc)
        self._tell(
            session_id,
            job_id,
            "completed",
            record.get("chars_before"),
            record.get("chars_after"),
        )

    # --- when to prepare ----------------------------------------------------------------------

    def _track_rate(self, private: dict[str, Any], chars: int) -> None:
        """Keep the run's growth in chars per second (a moving average over its model calls)
        in the private key."""
        now = time.time()
        rate = dict(private.get("rate") or {})
        last_t, last_chars = rate.get("t"), rate.get("chars")
        if isinstance(last_t, float | int) and isinstance(last_chars, int):
            dt = now - float(last_t)
            if 0 < dt < 600 and chars > last_chars:
                sample = (chars - last_chars) / dt
                g = rate.get("g")
                rate["g"] = sample if not g else RATE_WEIGHT * sample + (1 - RATE_WEIGHT) * g
        rate["t"], rate["chars"] = now, chars
        private["rate"] = rate

    def _prepare_point(self, private: dict[str, Any]) -> int:
        """The size (chars) from which a job is queued: early enough that its summary is ready
        when the thread crosses its threshold (the run's growth rate x the summarizer's p90
        latency and a job's overhead), never later than the prepare floor
        (``SUMMARIZATION_PREPARE_AT``), and not before a compaction could be worth it (the
        keep window, a summary's budget and the no-progress gain, plus the system prompt given
        to the agent, which no compaction removes). Sizes as a call sends them."""
        s = self.settings
        floor = s.prepare_floor_chars
        growth = float((private.get("rate") or {}).get("g") or 0.0)
        if growth <= 0:
            return floor
        lead = growth * (self._latency_p90() + JOB_OVERHEAD_S) * 1.25
        ahead = int(s.summarization_threshold_chars - lead)
        # sizes as a call sends them: a system prompt given to the agent is in every one
        return min(floor, max(earliest_worth(s) + _outside(private), ahead))

    def _latency_p90(self) -> float:
        """The summarizer's p90 latency in seconds over the deployment's recent compactions,
        read in the background at most every :data:`LATENCY_REFRESH_S`."""
        p90, at = self._latency
        if time.monotonic() - at >= LATENCY_REFRESH_S:
            self._latency = (p90, time.monotonic())

            def read() -> None:
                try:
                    value = summarizer_latency_p90_s(self.client.engine)
                except Exception:  # the usage database is away: keep the last figure
                    return
                if value is not None:
                    self._latency = (value, time.monotonic())

            self._read(read)
        return p90

    # --- the claim, in the background -------------------------------------------------------

    def _claim_of(self, session_id: str, urgent: bool = False) -> tuple[bool, Claim | None]:
        """``(known, claim)``: the thread's claim as last read in the background (known:
        read at all, and not failing), and a refresh started if it is older than
        :data:`CLAIM_REFRESH_S` (``urgent``: the thread is over its threshold with a job in
        flight, refreshed at every call). Never waits for the store."""
        now = time.monotonic()
        with self._guard:
            seen = self._claims.setdefault(session_id, _Seen())
            known = seen.at > 0 and not seen.failed
            first = seen.at == 0
            every = 0.0 if urgent and seen.claim is not None and seen.claim.in_flight else None
            wait = STORE_RETRY_S if seen.failed else every if every is not None else CLAIM_REFRESH_S
            refresh = not seen.reading and now - seen.at >= wait
            if refresh:
                seen.reading = True
        if refresh:
            self._read(self._read_claim, session_id)
        if urgent and first:  # over the threshold, never read: worth a few ms for the read
            return self._await_claim(session_id, FIRST_READ_WAIT_S)  # (this one's or earlier)
        return known, seen.claim

    def _warm(self) -> None:
        """Open the client and its lease store's connection on the reader thread, as the
        agent is built: a new process's first model call over the threshold then reads its
        thread's claim in a millisecond, inside :data:`FIRST_READ_WAIT_S`, and applies a
        compaction the worker prepared (it found it unknown under load, shortened older
        results instead and left the compaction prepared)."""
        try:
            self.client.leases.holder(f"{KEY}-warm-up")
        except Exception as exc:  # said once when a run needs the store
            log.debug("offpath: lease store not reachable yet: %s", exc)

    def _await_claim(self, session_id: str, timeout_s: float) -> tuple[bool, Claim | None]:
        """``(known, claim)`` once a read of the thread's claim (started by
        :meth:`_claim_of`) has ended, waiting at most ``timeout_s``; ``(False, None)`` if
        none ended by then or it failed."""
        with self._guard:
            seen = self._claims.setdefault(session_id, _Seen())
        seen.read.wait(timeout_s)
        with self._guard:
            return (True, seen.claim) if seen.at > 0 and not seen.failed else (False, None)

    def _read_claim(self, session_id: str) -> None:
        try:
            claim, failed = self.client.leases.holder(session_id), False
        except Exception as exc:  # Redis away: the run goes on, no compaction for now
            self._warn_once("store", f"offpath: lease store unreachable ({exc}); not compacting")
            claim, failed = None, True
        with self._guard:
            seen = self._claims.setdefault(session_id, _Seen())
            same = seen.claim is not None and claim is not None and seen.claim.raw == claim.raw
            forced, forced_at = (seen.forced, seen.forced_at) if same else (False, 0.0)
        if (
            not self.options.patch
            and claim is not None
            and claim.state is State.PREPARED
            and time.monotonic() - forced_at >= FORCED_REFRESH_S
        ):
            forced, forced_at = self._read_forced(claim.job_id), time.monotonic()
        with self._guard:
            seen = self._claims.setdefault(session_id, _Seen())
            seen.claim, seen.failed, seen.at, seen.reading = claim, failed, time.monotonic(), False
            seen.forced, seen.forced_at = forced, forced_at
            seen.read.set()

    def _read_forced(self, job_id: str) -> bool:
        """Job ``job_id`` was asked for by an operator (``POST /sessions/{id}/compact``)."""
        try:
            options = job_options(self.client.engine, job_id)
        except Exception:  # the usage database is away: applied over the threshold only
            return False
        return bool((options or {}).get("force"))

    def _forced(self, session_id: str) -> bool:
        """The thread's prepared compaction, as last read, was asked for by an operator."""
        with self._guard:
            seen = self._claims.get(session_id)
            return bool(seen and seen.forced)

    def _note_soon(self, session_id: str, messages: int, chars: int, every: float = NOTE_EVERY_S):
        """Record the thread as a session of kind ``own agent`` (its size, last activity) in
        the background, at most every ``every`` seconds."""
        now = time.monotonic()
        with self._guard:
            last = self._noted.get(session_id)
            if last is not None and now - last < every:
                return
            if len(self._noted) > 10_000:
                self._noted.clear()
            self._noted[session_id] = now
        self._write(self._note, session_id, messages, chars)

    def _note(self, session_id: str, messages: int, chars: int) -> None:
        try:
            mine = note_own_thread(
                self.client.engine,
                session_id,
                self.tenant,
                self.options.checkpoints,
                messages,
                chars,
            )
        except Exception as exc:
            log.warning("[%s] could not record the thread as a session: %s", tag(session_id), exc)
            return
        if not mine:
            self._warn_once(
                f"taken:{session_id}",
                f"[{tag(session_id)}] offpath: thread id {session_id!r} is already another "
                f"tenant's session or an API session: it is not listed as tenant "
                f"{self.tenant!r}'s own agent thread",
            )

    def _forget_claim(self, session_id: str) -> None:
        """The claim changed (this call applied or dropped a prepared compaction)."""
        with self._guard:
            self._claims.pop(session_id, None)

    def _check_pickup(self, session_id: str, holder: Claim | None) -> None:
        """Say once when a job this process queued has waited :data:`PICKUP_WARN_S` with no
        worker taking it, naming the queue and the broker (issue 21, item 3)."""
        if holder is None or holder.state is not State.QUEUED:
            return
        with self._guard:
            job, since = self._published.get(session_id, (None, 0.0))
        if job != holder.job_id or time.monotonic() - since < PICKUP_WARN_S:
            return
        from kombu.utils.url import sanitize_url

        s = self.settings
        self._warn_once(
            "pickup",
            f"offpath: compaction job {holder.job_id} has waited over {PICKUP_WARN_S:g} s in "
            f"queue {s.celery_queue!r} on broker {sanitize_url(s.broker_url)} and no worker "
            "has taken it: is an offpath worker (`offpath worker`) running against that broker "
            "and queue? Until one is, model calls over the hard limit are masked.",
        )

    def _pool(self, name: str) -> ThreadPoolExecutor:
        """The background pool ``name`` (:data:`POOLS`), started on first use."""
        with self._guard:
            pool = self._pools.get(name)
            if pool is None:
                pool = self._pools[name] = ThreadPoolExecutor(
                    POOLS[name], thread_name_prefix=f"offpath-{name}"
                )
        return pool

    def _read(self, fn: Any, *args: Any) -> Future[Any]:
        """Run ``fn`` on the reader thread: claim and latency reads only, so that they are
        never starved by publishes and counters (issue 18, item 4)."""
        return self._pool("read").submit(fn, *args)

    def _read_ahead(self, messages: list[BaseMessage]) -> None:
        """Find the facts of ``messages`` (those a model call is the first to see) on the facts
        thread, while the model answers (:func:`offpath.compaction.facts.warm`): a later
        shortening of them, and a compaction applied in the run, then find them ready instead
        of reading them in a model call's path."""

        def read() -> None:
            try:
                warm_facts(messages)
            except Exception as exc:  # found again when needed, in the path
                log.debug("offpath: facts not read ahead: %s", exc)

        try:
            self._pool("facts").submit(read)
        except RuntimeError:  # the interpreter is shutting down: found when needed
            pass

    def _archive(self, fn: Any, *args: Any) -> Future[Any]:
        """Run ``fn`` (an archive write a model call's update waits for) on the archive
        threads: never queued behind publishes and counters."""
        return self._pool("archive").submit(fn, *args)

    def _write(self, fn: Any, *args: Any) -> None:
        self._pool("write").submit(fn, *args)

    def _publish_soon(
        self,
        session_id: str,
        chars: int,
        messages: Sequence[BaseMessage],
        private: dict[str, Any],
        planned: int | None = None,
    ) -> None:
        """Queue a job for the thread in a background thread (the model call does not wait).
        The job names the run's newest message (``seen``: the worker waits for the checkpoint
        to hold it, as LangGraph writes it in the background), the run's checkpoint namespace
        (a subgraph's), and the size it may plan from (the prepare point, or ``planned``)."""
        with self._guard:
            if session_id in self._publishing:
                return
            self._publishing.add(session_id)
        options = replace(
            self.options,
            seen=messages[-1].id if messages else None,
            head=head_mark(messages),
            checkpoint_ns=_graph_ns() or None,
            floor=min(chars if planned is None else planned, self._prepare_point(private)),
            outside=_outside(private),
        )
        self._write(self._publish, session_id, chars, options)

    def _publish(self, session_id: str, chars: int, options: JobOptions) -> None:
        from offpath.coordination.hook import queue_job

        try:
            client = self.client
            result = queue_job(
                client.leases,
                client.engine,
                client.publish,
                session_id,
                chars,
                options=options,
                min_gain=self._min_gain,
                threshold=self._threshold,
            )
            if result.action == "queued":
                with self._guard:
                    self._published[session_id] = (result.job_id, time.monotonic())
                if result.job_id:
                    self._tell(session_id, result.job_id, "in_progress", chars)
        except Exception as exc:
            log.warning("[%s] compaction not queued: %s", tag(session_id), exc)
        finally:
            self._read_claim(session_id)  # the claim it took (or found), before the next try
            with self._guard:
                self._publishing.discard(session_id)

    def _count_masking(self, session_id: str, results: int, chars: int) -> None:
        try:
            record_masking(self.client.engine, session_id, results, chars)
        except Exception as exc:
            log.warning("[%s] could not count a masking: %s", tag(session_id), exc)

    def _tell(
        self,
        session_id: str,
        job_id: str,
        status: Any,
        chars_before: int | None = None,
        chars_after: int | None = None,
        reason: str | None = None,
    ) -> None:
        """Call ``on_compaction`` with the update, if the app gave one; never raise."""
        if self.on_compaction is None:
            return
        update = CompactionUpdate(session_id, job_id, status, chars_before, chars_after, reason)
        try:
            self.on_compaction(update)
        except Exception:
            log.exception("[%s] on_compaction raised (ignored)", tag(session_id))

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)


def outside_chars(request: ModelRequest) -> int:
    """Chars a model call sends besides the thread's messages: its system prompt when it is
    given to the agent (``create_agent(system_prompt=...)``) rather than held in the thread.
    Tool schemas are not counted (the seed counts messages)."""
    system = request.system_message
    return message_chars(system) if system is not None else 0


def _outside(private: dict[str, Any]) -> int:
    """The chars the run's last model call sent besides the thread (:func:`outside_chars`,
    kept in the private key for the hooks that have no request: the run's end, the job)."""
    return int(private.get("outside") or 0)


def earliest_worth(settings: Settings) -> int:
    """The smallest thread (chars) a compaction is likely worth it on: what the planner's gain
    rule needs removed, ``max(budget + gain, 2 x gain)`` (a summary is at most the budget and
    at most half of what it replaces), and half a tool result's allowance for the group the
    cut ends in, past the keep window *of a plan made that early*
    (:func:`~offpath.compaction.planner.early_keep_chars`: the window less what must still
    come before the apply, at least :data:`~offpath.compaction.planner.EARLY_KEEP_SHARE` of
    it). A job queued before this ends ``no_progress`` and holds its thread back until it grew
    by a compaction's worth: worse than a late one. With the whole keep window counted here
    (benchmark 17, django at 30,000 / 10,000: 23,750 of a 24,000-char floor), a run landing
    at 21k after an apply and growing 8k a step queued its next job only at the crossing."""
    gain = min_gain_chars(settings)
    need = settings.tool_result_limit_chars // 2 + max(
        summary_budget_chars(settings) + gain, 2 * gain
    )
    keep = settings.summarization_keep_chars
    if settings.summarization_threshold_chars - keep >= need:  # an early plan keeps less
        return int(keep * EARLY_KEEP_SHARE) + need
    return keep + need


def _diff(before: Sequence[BaseMessage], after: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The ``add_messages`` update that turns ``before`` into ``after``, where ``after`` only
    replaced messages in place or removed them (its ids are ``before``'s, in order)."""
    now = {m.id: m for m in after}
    update: list[BaseMessage] = []
    for m in before:
        new = now.get(m.id)
        if new is None:
            update.append(RemoveMessage(id=str(m.id)))
        elif new is not m and new != m:
            update.append(new)
    return update


def _graph_ns() -> str:
    """The checkpoint namespace of the graph the middleware runs in: "" for a root graph, a
    subgraph's (``agent:<task id>``) when the agent runs as a node of a parent graph. A node's
    own config names its task last (``...|model:<task id>``): that part is not a graph's."""
    try:
        ns = str(get_config().get("configurable", {}).get("checkpoint_ns") or "")
    except RuntimeError:  # not inside a run
        return ""
    return ns.rsplit("|", 1)[0] if "|" in ns else ""


def _parent_update(state: dict[str, Any]) -> dict[str, Any]:
    """What a subgraph run that removed messages writes to its parent: its messages as they
    are (replacing the parent's whole list: the parent's reducer only adds and replaces, so
    the messages a compaction removed would stay there) and its other output keys."""
    hidden = {KEY}
    for name, hint in get_type_hints(AgentState, include_extras=True).items():
        extras = getattr(hint, "__metadata__", ())
        if any(isinstance(x, OmitFromSchema) and x.output for x in extras):
            hidden.add(name)
    update = {k: v for k, v in state.items() if k not in hidden and k != "messages"}
    update["messages"] = [RemoveMessage(id=REMOVE_ALL_MESSAGES), *state["messages"]]
    return update
