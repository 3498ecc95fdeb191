""":class:`OffPathCompaction`, the class LangChain sees: its state schema, its settings and
client, the hooks it overrides (``wrap_model_call``, ``awrap_model_call``, ``after_agent``),
``busy``, and what a model call does before the model is called (``_before_call``). Its
private methods by concern come from the mixins of the sibling modules."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import ModelRequest
from langchain_core.messages import BaseMessage
from langgraph.graph.message import add_messages
from langgraph.types import Command

from offpath.agent.middleware.applying import ApplyingMixin
from offpath.agent.middleware.claims import ClaimsMixin
from offpath.agent.middleware.counting import CountingMixin, ThreadTokens, per_thread
from offpath.agent.middleware.helpers import (
    _diff,
    _outside,
    _parent_update,
    log,
    outside_chars,
)
from offpath.agent.middleware.place import Places
from offpath.agent.middleware.pools import PoolsMixin
from offpath.agent.middleware.refusals import RefusalsMixin
from offpath.agent.middleware.shaping import DEFAULT_LATENCY_S, ShapingMixin
from offpath.agent.middleware.state import OffPathState, _Call, _Seen, _Write
from offpath.agent.recall import recall_tool
from offpath.compaction.planner.budgets import min_gain_chars, request_cap_chars
from offpath.compaction.settings import Settings
from offpath.compaction.shorten import MIN_OLDER_CHARS, arrival_caps
from offpath.compaction.sizing import SizedThreads, position
from offpath.compaction.tokens import Calibration
from offpath.compaction.tracking import KEY, ThreadSize
from offpath.config import get_settings
from offpath.coordination.job_values import JobOptions
from offpath.coordination.logs import tag
from offpath.coordination.runtime import Client
from offpath.events import CompactionUpdate
from offpath.stores.leases.claims import State
from offpath.stores.usage.crossings import crossing_unseen, note_crossing

#: At the run's end (``after_agent``: no model call is left to hold up), over the threshold,
#: the longest (s) it waits for that first read still in flight: a new process's first run
#: (a Redis client to open on a loaded host) would else end without the compaction the
#: worker prepared, and a short run has no later call to apply it.
END_READ_WAIT_S = 1.0


class OffPathCompaction(
    AgentMiddleware[OffPathState],
    CountingMixin,
    ClaimsMixin,
    ShapingMixin,
    ApplyingMixin,
    PoolsMixin,
    RefusalsMixin,
):
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
        #: where each run stands among the graphs around it, and so its session
        self.places = Places()
        #: ``recall``: the agent reads its thread's archived originals.
        self.tools = (
            [recall_tool(lambda: self.client.engine, self.places.session_of_run)] if recall else []
        )
        self.recall = recall
        self.settings = settings or get_settings()
        self.options = JobOptions(patch=patch, checkpoints=checkpointer_url)
        self.tenant = tenant or self.settings.own_agent_tenant
        self._noted: dict[str, float] = {}  # thread -> when its session row was last written
        self._note_later: dict[str, tuple[int, int, int | None]] = {}  # thread -> size held back
        self._client = client
        self._guard = threading.Lock()
        self._publishing: set[str] = set()
        self._published: dict[str, tuple[str | None, float]] = {}  # thread -> (job?, when)
        self._claims: dict[str, _Seen] = {}
        self._sizes = SizedThreads()  # each thread's message sizes, kept across its calls
        self._pools: dict[str, ThreadPoolExecutor] = {}  # by name, see POOLS
        self._storing: set[str] = set()  # jobs whose archive write is in flight
        self._warned: set[str] = set()
        self._stores_at: dict[str, str] = {}  # store -> where it is (outage lines)
        self._queued_since: dict[str, float] = {}  # queued job -> when (time.time())
        self._latency: tuple[float, float] = (DEFAULT_LATENCY_S, 0.0)  # (p90 s, read at)
        #: chars sent per input token the provider reported (``usage_metadata``), over this
        #: agent's calls: the CHARS_PER_TOKEN to set for SUMMARIZATION_THRESHOLD_TOKENS
        self.calibration = Calibration(default=self.settings.chars_per_token)
        #: each thread's chars per token (SUMMARIZATION_THRESHOLD_TOKENS: its sizes scale)
        self.tokens = ThreadTokens(default=self.settings.chars_per_token)
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
        with self._thread_settings(request):  # the thread's sizes (tokens threshold)
            call = self._before_call(request)
            try:
                response = handler(call.request)
            except Exception as exc:  # a context-length refusal: retried once, smaller
                call, response = self._retry_refused(request, call, handler, exc)
            self._settle(call)
            return self._answer(call, response)

    async def awrap_model_call(self, request: ModelRequest, handler: Any) -> Any:
        with self._thread_settings(request):  # copied into the threads below
            call = await asyncio.to_thread(self._before_call, request)  # it reads the job row
            try:
                response = await handler(call.request)
            except Exception as exc:  # a context-length refusal: retried once, smaller
                call, response = await self._aretry_refused(request, call, handler, exc)
            if call.stored is not None:
                await asyncio.to_thread(self._settle, call)
            return self._answer(call, response)

    @per_thread
    def after_agent(self, state: OffPathState, runtime: Any) -> dict[str, Any] | Command | None:
        """The end of the run: record a compaction applied at its last model call; apply a
        prepared one if the run's last messages took the thread over its threshold (the next
        run starts compacted; the reconciler records it, as no step of this run is left);
        queue a job if the thread is over its prepare point; and in a subgraph that removed
        messages hand the parent the thread whole."""
        messages: list[BaseMessage] = state["messages"]
        place = self.places.of_run(messages)
        if place is None or not place.compacts:
            return None
        session_id = place.session_id
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
        if s.active and not self.options.patch and place.listed:
            self._note_soon(
                session_id, len(messages), size.chars, every=0.0, fixed=private.get("fixed")
            )
        if s.active and size.chars + out >= self._prepare_point(private):
            known, holder = self._claim_of(session_id)
            if known and (
                holder is None
                or holder.frees_for(size.chars + out, self._min_gain, self._threshold)
            ):
                self._publish_soon(session_id, size.chars + out, messages, private, place)
        if private.get("removed") and place.hands_up:
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
        place = self.places.of_run(original)
        session_id = place.session_id if place is not None and place.compacts else None
        if place is not None and not place.compacts:
            self._warn_once(
                "refused",
                f"offpath: the agent runs in graph namespace {place.ns!r} with some of its "
                "caller's messages (not all of them): a compaction there would replace or "
                "remove the caller's messages, so it does not compact this run. Give it the "
                "caller's whole `messages` list (a node that shares them) or messages of its "
                "own (a subagent run from a tool, or a Send with a list of its own).",
            )
        writes: list[_Write] = []  # archive writes, made while the model answers
        changed: list[int] = []  # positions of ``original`` shortened in place by this call
        applied = False  # a compaction applied: the thread is sized anew
        if place is not None and session_id is not None and settings.active:
            # each message sized once, as this process first sees it
            sizes = self._sizes.take(session_id)
            sizes.sync(original, size.chars)
            if sizes.chars != size.chars:  # the state's count missed a change made elsewhere
                size = ThreadSize().advance(original)
            if pending := private.get("pending"):
                self._record(session_id, pending, messages)
                private["pending"] = None
            # sizes count the thread; ``out`` is what the call sends besides it (a system
            # prompt given to create_agent), counted against the threshold and floors
            out = private["outside"] = outside_chars(request)
            budget = self._budget(session_id, messages, out, private)  # its fixed part counted
            # 1. new results over TOOL_RESULT_MAX_CHARS (a batch of parallel ones sharing the
            #    thread's keep window), before any model call sees them
            limit = settings.tool_result_limit_chars
            big = arrival_caps(messages[new_from:], limit, max(budget.keep, limit // 2))
            if big:
                at = {str(m.id): new_from + k for k, m in enumerate(messages[new_from:])}
                before = messages
                messages = self._shorten(
                    session_id, messages, big, "as it arrived", writes=writes, at=at
                )
                changed += self._replaced(session_id, sizes, before, messages, at.values())
            threshold = settings.summarization_threshold_chars
            chars = sizes.chars
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
                    messages, chars, applied = self._apply_sized(
                        session_id, holder, messages, private, chars, out, writes, sizes
                    )
                # the size the thread reached, before this call's own shortening of older
                # results: a skip that holds the thread is weighed against it (a thread kept
                # under its threshold by shortening alone still needs its compaction)
                reached = chars
                if chars + out > threshold:
                    need = chars + out - settings.prepare_floor_chars
                    keep = budget.keep
                    first_new = original[new_from].id if new_from < len(original) else None
                    caps = sizes.older_caps(
                        keep,
                        need,
                        position(messages, first_new),
                        request_cap_chars(settings, budget.fixed),
                    )
                    if caps:
                        before = messages
                        where = {i: sizes.where[i] for i in caps}
                        messages = self._shorten(
                            session_id,
                            messages,
                            caps,
                            "over the threshold",
                            MIN_OLDER_CHARS,
                            writes,
                            at=where,
                        )
                        replaced = self._replaced(
                            session_id, sizes, before, messages, where.values()
                        )
                        changed += [] if applied else replaced
                        chars = sizes.chars
            elif not self.options.patch:
                # an operator's "compact now" of this thread (issue 21, item 1): its
                # compaction is applied at the next call, under the threshold too
                known, holder = self._claim_of(session_id)
                if known and holder is not None and holder.state is State.PREPARED:
                    if self._forced(session_id):
                        messages, chars, applied = self._apply_sized(
                            session_id, holder, messages, private, chars, out, writes, sizes
                        )
            if applied:
                size = ThreadSize().advance(messages)
            elif messages is not original:  # shortened in place: the same ids and calls
                size = replace(size, chars=sizes.chars)
            self._sizes.give(session_id, sizes)
            if not self.options.patch and place.listed:
                self._note_soon(session_id, len(messages), size.chars, fixed=budget.fixed)
            # 3. from the prepare point on: the claim, and a job when the thread is free
            self._track_rate(private, size.chars)
            point = self._prepare_point(private)
            now, reached = size.chars + out, reached + out  # as a call sends them
            if max(now, reached) >= point:
                known, holder = self._claim_of(session_id)
                self._check_pickup(session_id, holder)
                if known and (holder is None or holder.frees_for(now, self._min_gain)):
                    self._publish_soon(session_id, now, messages, private, place)
                elif known and self._crossing_frees(holder, reached, private):
                    # planned from the size the thread is now (its older results shortened
                    # to keep it under the threshold), not from the prepare point over it
                    planned = min(now, point) - 1
                    self._publish_soon(session_id, reached, messages, private, place, planned)
        private["size"] = size.to_state()
        if session_id is not None and settings.active and new_from < len(original):
            fresh = {m.id for m in original[new_from:]}  # the newest: at the thread's end
            self._read_ahead([m for m in messages[-len(fresh) :] if m.id in fresh])
        call = _Call(
            self._shape(request, messages, size, session_id),
            {KEY: private},
            size.chars,
            session_id,
            self._store(writes) if writes else None,
            size_before,
        )
        if messages is not original:
            call.update["messages"] = (
                _diff(original, messages) if applied else [messages[i] for i in sorted(changed)]
            )
        return call
