""":class:`OffPathCompaction`, the class LangChain sees: its state schema, the parts it is
composed of (each built with what it requires), the hooks it overrides (``wrap_model_call``,
``awrap_model_call``, ``after_agent``), ``busy``, and the decisions a model call makes before
the model is called (``_before_call``), each delegated to a part."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import BaseMessage, RemoveMessage
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.runtime import Runtime
from langgraph.types import Command

from offpath.agent.middleware.applying import Applying, made_by_offpath
from offpath.agent.middleware.claims import FIRST_READ_WAIT_S, Claims, Pacing, Publisher
from offpath.agent.middleware.counting import ThreadSettings, ThreadTokens
from offpath.agent.middleware.pools import Background
from offpath.agent.middleware.refusals import Refusals
from offpath.agent.middleware.reports import Reports, log
from offpath.agent.middleware.sessions import Sessions
from offpath.agent.middleware.shaping import Shaping
from offpath.agent.middleware.state import (
    Call,
    CompactingTurn,
    OffPathState,
    Places,
    Turn,
    diff,
    outside_chars,
    outside_of,
    parent_update,
    private_of,
    thread_of,
)
from offpath.agent.recall import recall_tool
from offpath.compaction.patch import patched
from offpath.compaction.planner import request_cap_chars
from offpath.compaction.settings import (
    CHECKPOINTER_SCHEMES,
    TENANT_PATTERN,
    TENANT_RULE,
    Settings,
    SettingsError,
)
from offpath.compaction.shorten import MIN_OLDER_CHARS, arrival_caps
from offpath.compaction.tokens import Calibration
from offpath.compaction.tracking import KEY, SizedThreads, ThreadSize, position
from offpath.config import get_settings
from offpath.coordination.jobs import JobOptions
from offpath.coordination.logs import tag
from offpath.coordination.runtime import Client
from offpath.events import CompactionUpdate
from offpath.stores.db.transitions import crossing_unseen, note_crossing
from offpath.stores.leases.claims import Claim, State

#: At the run's end (``after_agent``: no model call is left to hold up), over the threshold
#: or in a team's own agent (where an operator's "compact now" applies under it), the longest
#: (s) it waits for the thread's first claim read still in flight: a new process's first run
#: (a Redis client and a database connection to open, the new messages' facts read ahead and
#: stored, on a loaded host: over a second seen) would else end without the compaction the
#: worker prepared, and a short run has no later call to apply it. Only a run that ends
#: before its process's first read waits; a read that fails (a store away) ends the wait.
END_READ_WAIT_S = 3.0


def _check_arguments(checkpointer_url: Any, tenant: Any, on_compaction: Any) -> None:
    """:class:`OffPathCompaction`'s arguments as the agent is built, not at its first run
    (where a bad one read as an outage, or failed every job as an internal error). Raises
    :class:`~offpath.compaction.settings.SettingsError` naming a bad ``checkpointer_url`` or
    ``tenant``, ``TypeError`` for an ``on_compaction`` that cannot be called."""
    if checkpointer_url not in (None, "") and (
        not isinstance(checkpointer_url, str)
        or not checkpointer_url.startswith(CHECKPOINTER_SCHEMES)
    ):
        raise SettingsError(
            "checkpointer_url must be postgresql://user@host:5432/db or sqlite:///path/to/file.db"
            f", got {str(checkpointer_url)[:40]!r}"
        )
    if tenant is not None and not (
        isinstance(tenant, str) and re.fullmatch(TENANT_PATTERN, tenant)
    ):
        raise SettingsError(f"tenant must be {TENANT_RULE}, got {str(tenant)[:70]!r}")
    if on_compaction is not None and not callable(on_compaction):
        raise TypeError(
            f"on_compaction must be callable (one CompactionUpdate), got {type(on_compaction).__name__}"
        )


class OffPathCompaction(AgentMiddleware[OffPathState, Any]):
    """Off-path compaction for a LangChain ``create_agent`` agent (see the package doc).

    ``settings``: offpath's settings (default: read from the environment and ``.env``).
    ``checkpointer_url``: where the worker reads the agent's threads
    (``postgresql://...`` or ``sqlite:///path``; None or empty: offpath's own).
    ``patch``: offpath's own API agent only (the worker may then write the thread
    between runs). ``client``: the usage DB, leases and publisher to use (default: opened
    from ``settings`` as the agent is built, its lease store's connection warmed in the
    background; if that fails, on first use, which says why). ``recall``: give the agent the
    ``recall`` tool (:mod:`offpath.agent.recall`), which searches the thread's archived
    originals. ``on_compaction``: called with each :class:`~offpath.events.CompactionUpdate`
    of the run's thread (queued, completed, failed, cancelled); what it raises is logged,
    never raised into the run. ``tenant``: the tenant whose API keys see this agent's threads
    (default ``OWN_AGENT_TENANT``, itself ``default``; 1-64 letters, digits or ``. _ -``).
    A bad ``checkpointer_url`` or ``tenant`` raises
    :class:`~offpath.compaction.settings.SettingsError`, an ``on_compaction`` that cannot be
    called ``TypeError``, as the agent is built.

    Its parts, each given what it requires as it is built (nothing else is read from the
    middleware): ``counting`` (the settings in force for a thread), ``background`` (its
    threads), ``reports`` (outages, warnings, compaction updates), ``claims`` (the threads'
    job claims), ``sessions`` (an own agent's threads as sessions), ``pacing`` (the prepare
    point), ``shaping`` (what a call sends), ``applying`` (a prepared compaction applied in the
    run), ``publisher`` (a job queued) and ``refusals`` (a refused call retried, smaller).
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
        base = settings or get_settings()
        _check_arguments(checkpointer_url, tenant, on_compaction)
        self.options = JobOptions(patch=patch, checkpoints=checkpointer_url)
        self.recall = recall
        self.tenant = tenant or base.own_agent_tenant
        self._client = client
        self._guard = threading.Lock()
        #: where each run stands among the graphs around it, and so its session
        self.places = Places()
        #: each thread's chars per token (SUMMARIZATION_THRESHOLD_TOKENS: its sizes scale)
        self.tokens = ThreadTokens(default=base.chars_per_token)
        self.sizes = SizedThreads()  # each thread's message sizes, kept across its calls
        self.counting = ThreadSettings(base, self.tokens, self.places)
        self.background = Background()
        self.reports = Reports(self.counting, on_compaction)
        # what most parts require: the settings in force, the client, the threads, the reports
        parts = (self.counting, self._open_client, self.background, self.reports)
        self.claims = Claims(*parts, patch=patch)
        self.sessions = Sessions(*parts, tenant=self.tenant, checkpoints=checkpointer_url)
        self.pacing = Pacing(self.counting, self._open_client, self.background)
        self.shaping = Shaping(
            *parts,
            self.tokens,
            Calibration(default=base.chars_per_token),
            recall=recall,
            patch=patch,
        )
        self.applying = Applying(*parts, self.claims, self.sizes, self.tokens, recall=recall)
        self.publisher = Publisher(*parts, self.claims, self.pacing, self.options)
        self.refusals = Refusals(
            self.counting, self.claims, self.applying, self.shaping, self.background
        )
        #: ``recall``: the agent reads its thread's archived originals.
        self.tools = (
            [recall_tool(lambda: self.client.engine, self.places.session_of_run)] if recall else []
        )
        if base.active:
            if self._client is None:  # its imports and pools now, as the agent is built
                with contextlib.suppress(Exception):  # else on first use, which says why
                    self._client = Client.open(base)
            self.background.read(self._warm)

    @property
    def settings(self) -> Settings:
        """The settings in force: the run's thread's while one of its hooks runs (scaled by
        its ratio when the threshold is in tokens), the agent's otherwise."""
        return self.counting.current

    @property
    def calibration(self) -> Calibration:
        """Chars sent per input token the provider reported (``usage_metadata``), over this
        agent's calls: the CHARS_PER_TOKEN to set for SUMMARIZATION_THRESHOLD_TOKENS."""
        return self.shaping.calibration

    @property
    def client(self) -> Client:
        """The usage database, leases and publisher (opened on first use if not given)."""
        return self._open_client()

    def _open_client(self) -> Client:
        with self._guard:
            if self._client is None:
                self._client = Client.open(self.counting.base)
            return self._client

    def _warm(self) -> None:
        """As the agent is built, on the reader thread: the lease store's connection opened,
        and for an own agent its tables and checkpointer checked."""
        self.claims.warm()
        if not self.options.patch:
            self.sessions.warm()

    # --- hooks --------------------------------------------------------------------------

    def wrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]
    ) -> Any:
        with self.counting.in_force(request):  # the thread's sizes (tokens threshold)
            call = self._before_call(request)
            try:
                response = handler(call.request)
            except Exception as exc:  # a context-length refusal: retried once, smaller
                call, response = self.refusals.retry(request, call, handler, exc)
            self.applying.settle(call)
            return self.shaping.answer(call, response)

    async def awrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], Awaitable[ModelResponse]],
    ) -> Any:
        with self.counting.in_force(request):  # copied into the threads below
            call = await asyncio.to_thread(self._before_call, request)  # it reads the job row
            try:
                response = await handler(call.request)
            except Exception as exc:  # a context-length refusal: retried once, smaller
                call, response = await self.refusals.aretry(request, call, handler, exc)
            if call.stored is not None:
                await asyncio.to_thread(self.applying.settle, call)
            return self.shaping.answer(call, response)

    # LangGraph runs the hook as a node, which may return a Command (the parent's update);
    # AgentMiddleware types its return as a state update only
    def after_agent(  # type: ignore[override]
        self, state: OffPathState, runtime: Runtime[Any]
    ) -> dict[str, Any] | Command[Any] | None:
        """The end of the run: record a compaction applied at its last model call; apply a
        prepared one if the run's last messages took the thread over its threshold (the next
        run starts compacted; the reconciler records it, as no step of this run is left);
        queue a job if the thread is over its prepare point; and in a subgraph that removed
        messages hand the parent the thread whole."""
        with self.counting.in_force():  # the thread's latest ratio (tokens threshold)
            return self._end_of_run(state)

    def _end_of_run(self, state: OffPathState) -> dict[str, Any] | Command[Any] | None:
        messages: list[BaseMessage] = list(state["messages"])
        place = self.places.of_run(messages)
        if place is None or not place.compacts:
            return None
        session_id = place.session_id
        private = private_of(state)
        if pending := private.get("pending"):
            self.applying.record(session_id, pending, messages)
            private["pending"] = None
        size = ThreadSize.from_state(private.get("size")).advance(messages)
        update: dict[str, Any] = {}
        s = self.settings
        if s.active and size.chars > s.summarization_keep_chars:
            # the run's last answer, which no model call saw: its facts stored as a call's are
            self.background.read_ahead(messages[-1:], partial(self._remember, messages))
        out = outside_of(private)  # the run's calls sent that besides the thread
        over = size.chars + out > s.summarization_threshold_chars
        if place.hands_whole and any(map(made_by_offpath, messages)):
            # a fanned run's messages become its caller's: handed whole, never compacted
            whole = self.applying.whole(session_id, messages)
            if whole is not None:
                return {
                    "messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *whole],
                    KEY: {**private, "size": ThreadSize().advance(whole).to_state()}
                    | {"removed": False},
                }
        if place.hands_whole:
            return {**update, KEY: {**private, "size": size.to_state(), "removed": False}}
        if s.active and (over or not self.options.patch):
            known, holder = self.claims.claim_of(session_id, urgent=over)
            if not known:
                known, holder = self.claims.await_claim(session_id, END_READ_WAIT_S)
            prepared = holder if known and holder and holder.state is State.PREPARED else None
            if prepared is not None and (over or self.claims.forced(session_id)):
                applied = self.applying.apply(session_id, prepared.job_id, messages, out)
                if applied is not None:  # else the claim as it left it: a job queued below
                    self.claims.forget(session_id)
                    fitted, private["pending"] = applied
                    update["messages"] = fitted.patch
                    messages = patched(messages, fitted.patch)
                    size = ThreadSize().advance(messages)
                    private["removed"] = True
        if s.active and not self.options.patch and place.listed:
            self.sessions.note_soon(
                session_id, len(messages), size.chars, every=0.0, fixed=private.get("fixed")
            )
        if s.active and size.chars + out >= self.pacing.point(private):
            known, holder = self.claims.claim_of(session_id)
            if known and self.pacing.frees(holder, size.chars + out, threshold=True):
                self.publisher.publish_soon(session_id, size.chars + out, messages, private, place)
        if private.get("removed") and place.hands_up:
            return Command(
                graph=Command.PARENT, update=parent_update({**state, "messages": messages})
            )
        return {**update, KEY: {**private, "size": size.to_state(), "removed": False}}

    def busy(self, session_id: str) -> bool:
        """A compaction job for the thread is being queued by this process, a read of its
        claim is in flight, or its claim (read now from the lease store) names a job queued
        or running; when none is, the claim just read becomes the one the next call sees (as
        a background read would make it). The demo's scripted model waits on it
        (``SCRIPTED_JOB_WAIT_S``) so that the demo takes the same steps at every run; False
        when the store cannot be read."""
        if self.publisher.publishing(session_id) or self.claims.reading(session_id):
            return True
        return self.claims.in_flight(session_id)

    # --- a model call -------------------------------------------------------------------

    def _before_call(self, request: ModelRequest) -> Call:
        """What the model is sent and the state update returned with its answer, from the
        decisions below (each its part's)."""
        turn = self._turn(request)  # the thread as the state sizes it, and its place
        if isinstance(turn, CompactingTurn):
            arrived_chars = turn.chars  # the thread as its new messages arrived
            self._shorten_arrivals(turn)  # 1. new results over TOOL_RESULT_MAX_CHARS
            if turn.chars + turn.out > self.settings.summarization_threshold_chars:
                self._over_threshold(turn)  # 2. the prepared compaction, else older shortened
            else:
                if not self.options.patch:
                    self._apply_forced(turn)  # an operator's "compact now", under the threshold
                self._apply_idle(turn)  # back after an idle time, over the prepare floor
            self._sized(turn)  # the thread's size after 1 and 2, noted as a session
            self._queue_if_due(turn)  # 3. from the prepare point on: a job, when free
            # the new messages' facts, read ahead (and stored for the worker's job)
            self.background.read_ahead(turn.fresh, self._facts_stored(turn, arrived_chars))
        return self._call(turn)

    def _turn(self, request: ModelRequest) -> Turn:
        """The call's :class:`Turn`: the thread as the state sizes it (its messages new to
        the state counted, no rescan); a :class:`CompactingTurn`, with the compaction
        applied at the last call recorded and the thread's budget, when offpath compacts
        the run's thread."""
        private = private_of(request.state)
        # the state's own messages (a middleware before offpath may send the call an edited
        # copy: its edits are made again on what offpath sends, never stored)
        original, overlay = thread_of(request)
        old = ThreadSize.from_state(private.get("size"))
        size = old.advance(original)
        unchanged = bool(old.n) and old.n <= len(original) and original[old.n - 1].id == old.last
        new_from = old.n if unchanged else 0
        seen = Turn(
            request,
            original,
            private,
            private.get("size"),
            size,
            new_from,
            original,
            overlay=overlay,
        )
        place = self.places.of_run(original)
        if place is not None and not place.compacts:
            self.reports.warn_once(
                "refused",
                f"offpath: the agent runs in graph namespace {place.ns!r} with some of its "
                "caller's messages (not all of them): a compaction there would replace or "
                "remove the caller's messages, so it does not compact this run. Give it the "
                "caller's whole `messages` list (a node that shares them) or messages of its "
                "own (a subagent run from a tool, or a Send with a list of its own).",
            )
        if place is None or not place.compacts or not self.settings.active:
            return seen
        session_id = place.session_id
        sizes = self.sizes.take(session_id)  # each message sized once, as this process sees it
        sizes.sync(original, size.chars)
        if sizes.chars != size.chars:  # the state's count missed a change made elsewhere
            size = ThreadSize().advance(original)
        if pending := private.get("pending"):
            self.applying.record(session_id, pending, original)
            private["pending"] = None
        # sizes count the thread; ``out`` is what the call sends besides it (a system prompt
        # given to create_agent), counted against the threshold and floors
        out = private["outside"] = outside_chars(request)
        budget = self.shaping.budget(session_id, original, out, private)  # its fixed part
        return CompactingTurn(
            request,
            original,
            private,
            seen.size_before,
            size,
            new_from,
            original,
            overlay=overlay,
            place=place,
            session=session_id,
            sizes=sizes,
            out=out,
            budget=budget,
        )

    def _shorten_arrivals(self, turn: CompactingTurn) -> None:
        """New results over TOOL_RESULT_MAX_CHARS shortened (a batch of parallel ones sharing
        the thread's keep window), before any model call sees them."""
        limit = self.settings.tool_result_limit_chars
        new = turn.messages[turn.new_from :]
        big = arrival_caps(new, limit, max(turn.budget.keep, limit // 2))
        if big:
            at = {str(m.id): turn.new_from + k for k, m in enumerate(new)}
            turn.changed += self._shorten(turn, big, "as it arrived", None, at)
        turn.reached = turn.sizes.chars

    def _shorten(
        self,
        turn: CompactingTurn,
        caps: dict[str, int],
        why: str,
        floor: int | None,
        at: dict[str, int],
    ) -> list[int]:
        """The messages named in ``caps`` (at ``at``) shortened in the turn (originals
        archived while the model answers) and sized again: their positions."""
        before = turn.messages
        turn.messages = self.shaping.shorten(
            turn.session, before, caps, why, floor, turn.writes, at=at
        )
        return self.shaping.replaced(turn.session, turn.sizes, before, turn.messages, at.values())

    def _over_threshold(self, turn: CompactingTurn) -> None:
        """Over the threshold: the compaction the worker prepared applied, if the thread's
        claim names one; and if the thread is still over, older tool results (outside the keep
        window) shortened towards the prepare floor, so that the call stays bounded while the
        summary is written."""
        s, session_id = self.settings, turn.session
        known, holder = self.claims.claim_of(session_id, urgent=True)
        log.debug(
            "[%s] call over the threshold: %d chars; claim %s (known: %s)",
            tag(session_id),
            turn.sizes.chars,
            holder.raw if holder else None,
            known,
        )
        if crossing_unseen(holder):
            self.background.write(note_crossing, self.client.engine, holder)  # the lag runs here
        chars = turn.sizes.chars
        if known and holder is not None and holder.state is State.PREPARED:
            chars = self._apply(turn, holder, chars)
        # the size the thread reached, before this call's own shortening of older results: a
        # skip that holds the thread is weighed against it (a thread kept under its threshold
        # by shortening alone still needs its compaction)
        turn.reached = chars
        if chars + turn.out <= s.summarization_threshold_chars:
            return
        first_new = turn.original[turn.new_from].id if turn.new_from < len(turn.original) else None
        caps = turn.sizes.older_caps(
            turn.budget.keep,
            chars + turn.out - s.prepare_floor_chars,
            position(turn.messages, first_new),
            request_cap_chars(s, turn.budget.fixed),
        )
        if caps:
            where = {i: turn.sizes.where[i] for i in caps}
            replaced = self._shorten(turn, caps, "over the threshold", MIN_OLDER_CHARS, where)
            turn.changed += [] if turn.applied else replaced

    def _apply_forced(self, turn: CompactingTurn) -> None:
        """Under the threshold, an operator's "compact now" of the thread: its prepared
        compaction applied at the next call."""
        holder = self.claims.prepared(turn.session)
        if holder is not None and self.claims.forced(turn.session):
            self._apply(turn, holder, turn.sizes.chars)

    def _apply_idle(self, turn: CompactingTurn) -> None:
        """Under the threshold and over the prepare floor, a thread back after an idle time
        (``SUMMARIZATION_IDLE_APPLY_S`` since its last model call): its prepared compaction
        applied at this call, its claim read anew for it (at most :data:`FIRST_READ_WAIT_S`:
        the claim last read may be that of a job still running then)."""
        s = self.settings
        if turn.applied or turn.chars + turn.out < s.prepare_floor_chars:
            return
        idle_s = self.pacing.idle_s(turn.private)
        if not s.idle_apply(idle_s):
            return
        known, holder = self.claims.fresh(turn.session, FIRST_READ_WAIT_S)
        if known and holder is not None and holder.state is State.PREPARED:
            log.info(
                "[%s] idle %.0f s under the threshold: applying prepared job %s",
                tag(turn.session),
                idle_s,
                holder.job_id,
            )
            self._apply(turn, holder, turn.chars)

    def _apply(self, turn: CompactingTurn, holder: Claim, chars: int) -> int:
        """The prepared compaction of ``holder`` applied to the turn's messages (of ``chars``),
        the thread sized anew if it applied: its size after (chars, as the job's record has
        it), or ``chars``."""
        turn.messages, chars, applied = self.applying.apply_sized(
            turn.session,
            holder,
            turn.messages,
            turn.private,
            chars,
            turn.out,
            turn.writes,
            turn.sizes,
        )
        turn.applied = turn.applied or applied
        return chars

    def _sized(self, turn: CompactingTurn) -> None:
        """The turn's size after its shortenings and apply (anew after an apply; else the same
        ids and calls, shortened in place), the sizes kept for the thread's next call, and an
        own agent's thread noted as a session."""
        if turn.applied:
            turn.size = ThreadSize().advance(turn.messages)
        elif turn.messages is not turn.original:
            turn.size = replace(turn.size, chars=turn.sizes.chars)
        self.sizes.give(turn.session, turn.sizes)
        if not self.options.patch and turn.place.listed:
            self.sessions.note_soon(
                turn.session, len(turn.messages), turn.size.chars, fixed=turn.budget.fixed
            )

    def _queue_if_due(self, turn: CompactingTurn) -> None:
        """From the prepare point on: the thread's claim read, and a job queued when no job
        holds the thread (or a skip that holds it is freed by its size, or by its crossing
        of the threshold, planned from the size it is now)."""
        self.pacing.track_rate(turn.private, turn.size.chars)
        point = self.pacing.point(turn.private)
        now, reached = turn.size.chars + turn.out, turn.reached + turn.out  # as a call sends them
        if max(now, reached) < point:
            return
        known, holder = self.claims.claim_of(turn.session)
        self.claims.check_pickup(turn.session, holder)
        place = turn.place
        if known and self.pacing.frees(holder, now):
            self.publisher.publish_soon(turn.session, now, turn.messages, turn.private, place)
        elif known and self.pacing.crossing_frees(holder, reached, turn.private):
            # planned from the size the thread is now (its older results shortened to keep it
            # under the threshold), not from the prepare point over it
            planned = min(now, point) - 1
            self.publisher.publish_soon(
                turn.session, reached, turn.messages, turn.private, place, planned
            )

    def _facts_stored(self, turn: CompactingTurn, chars: int) -> Callable[[], int] | None:
        """What stores the facts of the call's new messages (as they stand, and the originals
        of those shortened as they arrived) on the facts thread: once the thread as they
        arrived (``chars``) is past its keep window, as the post-turn hook does (a thread
        under it has nothing a compaction removes). None under it."""
        if chars <= self.settings.summarization_keep_chars:
            return None
        return partial(self._remember, turn.messages, turn.original[turn.new_from :])

    def _remember(self, messages: list[BaseMessage], arrived: Sequence[BaseMessage] = ()) -> int:
        """On the facts thread: the facts of the thread's messages not stored yet, and of
        ``arrived``, in the fact store (:meth:`offpath.stores.facts.FactStore.remember`: found
        through this process's cache, which the read ahead filled), where the job that removes
        them reads them; nothing is kept without Redis, and the job then finds them itself."""
        return self.client.facts.remember(messages, arrived, kept=True)

    def _call(self, turn: Turn) -> Call:
        """The call to make (what the model is sent: :meth:`Shaping.shape`) and the state
        update returned with its answer: the private key, and the messages this call changed
        (after an apply, the difference; else those shortened in place)."""
        turn.private["size"] = turn.size.to_state()
        sent, sized = turn.messages, turn.size
        if turn.overlay is not None:  # sized as sent, its orphans too (a copy cut short)
            sent = turn.overlay.over(turn.messages, turn.original)
            sized = ThreadSize().advance(sent)
        call = Call(
            self.shaping.shape(turn.request, sent, sized, turn.session_id),
            {KEY: turn.private},
            turn.size.chars,
            turn.session_id,
            self.applying.store(turn.writes) if turn.writes else None,
            turn.size_before,
        )
        if turn.messages is not turn.original:
            call.update["messages"] = (
                diff(turn.original, turn.messages)
                if turn.applied
                else [turn.messages[i] for i in sorted(turn.changed)]
            )
        return call
