"""``OffPathCompaction``: compaction for LangChain agents, with no model call waiting for it.

Replaces LangChain's ``SummarizationMiddleware`` in one line::

    from offpath import OffPathCompaction
    agent = create_agent(model, tools, checkpointer=saver,
                         middleware=[OffPathCompaction(checkpointer_url=DB_URL)])

At every model call of a run (``before_model``, ``after_model`` and once at the end,
``after_agent``) it:

1. advances the thread's size over the messages added since the last step (a
   private state key: O(new messages), no rescan);
2. under ``SUMMARIZATION_PREPARE_AT`` x the threshold, does nothing else: no I/O;
3. otherwise looks at the thread's claim, as last read by a background thread
   (refreshed at most every :data:`CLAIM_REFRESH_S`: the step itself never waits
   for Redis, even when it is down). A compaction prepared by the worker and the
   thread over its threshold: it applies it, as the run's own state update
   (``RemoveMessage``\\ s, the summary taking the first removed id), after
   checking that it still fits (else the job ends ``skipped: stale``), and records
   it once the update is in the state. A free thread: it publishes a job (the same
   Celery task, claim rules and job rows as the post-turn hook), in a background
   thread too.

In ``wrap_model_call`` it leaves orphan tool results out of the request, and if the
call would exceed ``CONTEXT_HARD_LIMIT_CHARS`` with nothing prepared, it masks the
oldest tool results for that call only (logged and counted, ``/stats``
``fallback_maskings``). The stored thread is never written by offpath in a user's
own agent: the worker only prepares (``patch=False``).

The worker reads the thread from the agent's checkpointer by URL
(``checkpointer_url``; default: offpath's own ``DATABASE_URL`` / SQLite file).
Settings come from the environment and ``.env`` as for the service (``REDIS_URL``,
``DATABASE_URL``, the broker, the thresholds), or pass ``settings``.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Annotated, Any, NotRequired

from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain.agents.middleware.types import ModelRequest, ModelResponse, PrivateStateAttr
from langchain_core.messages import BaseMessage
from langgraph.graph.message import add_messages

from offpath.compaction.pairing import new_unpaired
from offpath.compaction.patch import Prepared, Stale, fit, landed
from offpath.compaction.planner import min_gain_chars
from offpath.compaction.settings import Settings, get_settings
from offpath.compaction.tracking import ThreadSize, mask_observations
from offpath.service import archive
from offpath.service.compactions import JobOptions, end_stale
from offpath.service.db import (
    JobStatus,
    finalize,
    job_row,
    record_masking,
    set_job,
)
from offpath.service.leases import Claim, Leases, State
from offpath.service.logs import tag
from offpath.service.recall import recall_tool, thread_of_run
from offpath.service.runtime import Client
from offpath.service.usage import crossing_unseen, note_crossing

log = logging.getLogger("offpath.middleware")

#: The private state key: the thread's size (:class:`ThreadSize`) and a compaction this run
#: applied and must record once it is in the state.
KEY = "offpath"
#: How often (seconds) the background thread re-reads a thread's claim while the thread is
#: over the prepare floor; and how long it leaves an unreachable store alone.
CLAIM_REFRESH_S = 0.2
STORE_RETRY_S = 5.0


@dataclass(slots=True)
class _Seen:
    claim: Claim | None = None
    at: float = 0.0  # monotonic time of the last read (or failed read)
    failed: bool = False
    reading: bool = False


class OffPathState(AgentState):
    offpath: NotRequired[Annotated[dict[str, Any], PrivateStateAttr]]


class OffPathCompaction(AgentMiddleware[OffPathState]):
    """Off-path compaction for a LangChain ``create_agent`` agent (see the module doc).

    ``settings``: offpath's settings (default: read from the environment and ``.env``).
    ``checkpointer_url``: where the worker reads the agent's threads
    (``postgresql://...`` or ``sqlite:///path``; default: offpath's own).
    ``patch``: offpath's own API agent only (the worker may then write the thread
    between runs). ``client``: the usage DB, leases and publisher to use (default:
    opened from ``settings`` on first use). ``recall``: give the agent the ``recall`` tool
    (:mod:`offpath.service.recall`), which searches the thread's archived originals.
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
    ) -> None:
        super().__init__()
        #: ``recall`` (issue 11): the agent reads its thread's archived originals.
        self.tools = [recall_tool(lambda: self.client.engine)] if recall else []
        self.settings = settings or get_settings()
        self.options = JobOptions(patch=patch, checkpoints=checkpointer_url)
        self._client = client
        self._guard = threading.Lock()
        self._publishing: set[str] = set()
        self._claims: dict[str, _Seen] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._warned: set[str] = set()

    @property
    def client(self) -> Client:
        with self._guard:
            if self._client is None:
                self._client = Client.open(self.settings)
            return self._client

    # --- hooks --------------------------------------------------------------------------

    def before_model(self, state: OffPathState, runtime: Any) -> dict[str, Any] | None:
        return self._step(state, apply=True)

    def after_model(self, state: OffPathState, runtime: Any) -> dict[str, Any] | None:
        return self._step(state, apply=False)

    def after_agent(self, state: OffPathState, runtime: Any) -> dict[str, Any] | None:
        return self._step(state, apply=True)

    def wrap_model_call(self, request: ModelRequest, handler: Any) -> ModelResponse:
        return handler(self._shape(request))

    async def awrap_model_call(self, request: ModelRequest, handler: Any) -> ModelResponse:
        return await handler(self._shape(request))

    # --- the per-step check -----------------------------------------------------------------

    def _step(self, state: OffPathState, apply: bool) -> dict[str, Any] | None:
        settings = self.settings
        session_id = thread_of_run()
        if session_id is None:
            return None
        messages: list[BaseMessage] = state["messages"]
        private = state.get(KEY) or {}
        size = ThreadSize.from_state(private.get("size")).advance(messages)
        pending = private.get("pending")
        update: dict[str, Any] = {}
        if pending:
            self._record(session_id, pending, messages)
            pending = None
        if settings.active and size.chars >= settings.prepare_floor_chars:
            known, holder = self._claim_of(session_id)
            if size.chars > settings.summarization_threshold_chars and crossing_unseen(holder):
                self._submit(note_crossing, self.client.engine, holder)  # the lag runs from here
            if not known:  # first read under way, or the store is away: nothing to do now
                pass
            elif holder is not None and holder.state is State.PREPARED:
                if apply and size.chars > settings.summarization_threshold_chars:
                    applied = self._apply(session_id, holder.job_id, messages)
                    self._forget_claim(session_id)
                    if applied is not None:
                        update["messages"], pending = applied
                        size = ThreadSize()  # recounted at the next step
            elif holder is None or holder.frees_for(size.chars, min_gain_chars(settings)):
                self._publish_soon(session_id, size.chars, messages[-1].id if messages else None)
        update[KEY] = {"size": size.to_state(), "pending": pending}
        return update

    def _apply(
        self, session_id: str, job_id: str, messages: list[BaseMessage]
    ) -> tuple[list[BaseMessage], dict[str, Any]] | None:
        """The update that applies job ``job_id``'s prepared compaction, and what to record
        once it is in the state; None if there is nothing to apply."""
        client = self.client
        try:
            row = job_row(client.engine, job_id)
            if row is None or row["status"] != JobStatus.PREPARED or not row["result"]:
                return None
            result = row["result"]
            if landed(messages, job_id, result.get("record")):  # a crashed run had applied it
                self._record(session_id, {"job_id": job_id, "record": result["record"]}, messages)
                return None
            fitted = fit(Prepared.from_json(result["prepared"]), messages)
            if isinstance(fitted, Stale):
                end_stale(client.engine, client.leases, session_id, job_id, fitted)
                return None
            if broken := new_unpaired(messages, add_messages(messages, fitted.patch)):
                reason = f"patch would orphan tool calls {sorted(broken)}"
                set_job(client.engine, job_id, session_id, JobStatus.FAILED, reason, "orphan_guard")
                client.leases.settle(session_id, job_id, None)
                return None
            rows = archive.rows_for(
                session_id, job_id, str(fitted.summary.id), messages, fitted.removed
            )
            archive.store_record(client.engine, job_id, {**result, "record": fitted.record}, rows)
        except Exception as exc:  # the run goes on uncompacted; the reconciler tidies up
            log.warning("[%s] could not apply job %s: %s", tag(session_id), job_id, exc)
            return None
        log.info(
            "[%s] applying job %s in the run: -%d chars",
            tag(session_id),
            job_id,
            fitted.record["chars_removed"],
        )
        return fitted.patch, {"job_id": job_id, "record": fitted.record}

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

    def _claim_of(self, session_id: str) -> tuple[bool, Claim | None]:
        """``(known, claim)``: the thread's claim as last read in the background (known:
        read at all, and not failing), and a refresh started if it is older than
        :data:`CLAIM_REFRESH_S`. Never waits for the store."""
        now = time.monotonic()
        with self._guard:
            seen = self._claims.setdefault(session_id, _Seen())
            known = seen.at > 0 and not seen.failed
            refresh = not seen.reading and now - seen.at >= (
                STORE_RETRY_S if seen.failed else CLAIM_REFRESH_S
            )
            if refresh:
                seen.reading = True
        if refresh:
            self._submit(self._read_claim, session_id)
        return known, seen.claim

    def _read_claim(self, session_id: str) -> None:
        try:
            claim, failed = self.client.leases.holder(session_id), False
        except Exception as exc:  # Redis away: the run goes on, no compaction for now
            self._warn_once("store", f"offpath: lease store unreachable ({exc}); not compacting")
            claim, failed = None, True
        with self._guard:
            seen = self._claims.setdefault(session_id, _Seen())
            seen.claim, seen.failed, seen.at, seen.reading = claim, failed, time.monotonic(), False

    def _forget_claim(self, session_id: str) -> None:
        """The claim changed (this step applied or dropped a prepared compaction)."""
        with self._guard:
            self._claims.pop(session_id, None)

    def _submit(self, fn: Any, *args: Any) -> None:
        with self._guard:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(2, thread_name_prefix="offpath")
            pool = self._pool
        pool.submit(fn, *args)

    def _publish_soon(self, session_id: str, chars: int, seen: str | None) -> None:
        """Queue a job for the thread in a background thread (the model call does not wait).
        ``seen``: the id of the run's newest message, which the worker waits to find in the
        checkpoint (LangGraph writes it in the background) before it plans."""
        with self._guard:
            if session_id in self._publishing:
                return
            self._publishing.add(session_id)
        self._submit(self._publish, session_id, chars, seen)

    def _publish(self, session_id: str, chars: int, seen: str | None) -> None:
        from offpath.service.hook import queue_job

        try:
            client = self.client
            queue_job(
                client.leases,
                client.engine,
                client.publish,
                session_id,
                chars,
                options=replace(self.options, seen=seen),
                min_gain=min_gain_chars(self.settings),
            )
        except Exception as exc:
            log.warning("[%s] compaction not queued: %s", tag(session_id), exc)
        finally:
            self._read_claim(session_id)  # the claim it took (or found), before the next try
            with self._guard:
                self._publishing.discard(session_id)

    # --- what the model is sent -------------------------------------------------------------

    def _shape(self, request: ModelRequest) -> ModelRequest:
        """Leave orphan tool results out, and mask old tool results over the hard limit."""
        private = (request.state or {}).get(KEY) or {}
        size = ThreadSize.from_state(private.get("size"))
        messages = request.messages
        if size.orphans:
            orphans = set(size.orphans)
            messages = [m for m in messages if m.id not in orphans]
        limit = self.settings.hard_limit_chars
        if self.settings.active and size.chars > limit:
            messages, masking = mask_observations(messages, limit)
            session_id = thread_of_run() or "?"
            if masking.results:
                log.warning(
                    "[%s] context over its hard limit (%d > %d chars) with no summary ready: "
                    "masked %d old tool results (%d chars) for this call",
                    tag(session_id),
                    size.chars,
                    limit,
                    masking.results,
                    masking.chars,
                )
                self._count_masking(session_id, masking.results, masking.chars)
        if messages is request.messages:
            return request
        return request.override(messages=messages)

    def _count_masking(self, session_id: str, results: int, chars: int) -> None:
        def write() -> None:
            try:
                record_masking(self.client.engine, session_id, results, chars)
            except Exception as exc:
                log.warning("[%s] could not count a masking: %s", tag(session_id), exc)

        self._submit(write)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)
