"""The life of a compaction job, and its one owner: :class:`Jobs` (DESIGN.md invariant 21).

A job is queued, started by one delivery (the running lease), prepared (planned and
summarized), applied or ended (skipped, failed, expired), and maybe reverted. :class:`Jobs`
alone writes a job's state: its row's :class:`~offpath.stores.db.JobStatus` and the thread's
claim (:mod:`offpath.stores.leases`), a projection of that status (:meth:`Jobs.claim_after`)
written in the same call. A prepared compaction is applied in one way (:meth:`Jobs.apply`):
landed already? fitted (:func:`~offpath.compaction.patch.fit_now`), refused if stale or if
it would orphan a tool call, then written by a :class:`Writer`: the checkpoint under the
thread's lock (the worker, the post-turn hook) or a state update of the run (the middleware;
:mod:`offpath.coordination.writers`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import orjson
from langchain_core.messages import BaseMessage, messages_from_dict, messages_to_dict
from sqlalchemy.engine import Engine

from offpath.compaction.pairing import new_unpaired
from offpath.compaction.patch import Fitted, Prepared, Stale, fit_now, landed, patched
from offpath.compaction.planner import SkipReason
from offpath.compaction.settings import Settings
from offpath.compaction.shorten import digest
from offpath.compaction.tokens import stored_ratio
from offpath.coordination.logs import tag
from offpath.coordination.outages import BROKER, LEASE_STORE, OUTAGES, USAGE_DB, is_outage, where
from offpath.stores import archive
from offpath.stores.db.job_queries import failures_in_a_row, has_unpublished_job
from offpath.stores.db.tables import JobStatus
from offpath.stores.db.transitions import (
    create_job,
    end_others,
    finalize,
    mark_forced,
    mark_reverted,
    set_job,
    set_published,
    start_job,
    store_result,
    uncount_attempt,
)
from offpath.stores.leases.claims import (
    Claim,
    Held,
    LeaseKeeper,
    Leases,
    Start,
    State,
    failure_backoff_s,
)

log = logging.getLogger("offpath.jobs")
_log = logging.getLogger("offpath.hook")  # a turn's "not queued" lines, as the hook's


# --- the values a job's life passes around ---------------------------------------------


#: The most a job's message carries of its run's messages (bytes of JSON): more (a thread
#: far past its hard limit, where compaction is far behind) is left out and the job reads
#: the checkpoint, so that a broker message stays bounded whatever the thread.
JOB_MESSAGES_MAX_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class JobOptions:
    """How a job's compaction may be applied (kept in the job's row and message).

    ``patch``: the thread is one of offpath's own agent threads, whose checkpoint the
    worker (or the post-turn hook) may write when no run holds it. False for a
    user's own agent: only its middleware applies the compaction, as a state update
    of its run. ``checkpoints``: the URL of the checkpointer that holds the thread,
    if it is not offpath's own (``postgresql://...`` or ``sqlite:///path``). ``seen``: the
    id of the newest message the run had when it queued the job; the worker waits (up to
    ``CHECKPOINT_LAG_S``) for the checkpoint to hold it before planning, as LangGraph writes
    a run's checkpoints in the background and they lag the live state.
    """

    patch: bool = True
    checkpoints: str | None = None
    seen: str | None = None
    #: An operator asked for it (``POST /sessions/{id}/compact``): planned with the planner's
    #: ``force`` and applied at once, under the threshold too.
    force: bool = False
    #: The checkpoint namespace the thread's messages live in: a subgraph's
    #: (``agent:<task id>``) when the agent runs as a node of a parent graph; None: the root.
    checkpoint_ns: str | None = None
    #: The size (chars) the job may plan from: the middleware's prepare point when it queued
    #: the job earlier than ``SUMMARIZATION_PREPARE_AT`` (a fast run); None: that floor.
    floor: int | None = None
    #: ``"<id>:<digest>"`` of the run's first message after the system prompt when it queued
    #: the job (:func:`head_mark`): after an in-run apply that is the new summary, which the
    #: checkpoint holds only a step later, while it already holds ``seen``; a job planned on
    #: the checkpoint before it was found stale at its swap ("message 0001 changed"), every
    #: time under load
    head: str | None = None
    #: Chars each model call of the run sends besides the thread (a system prompt given as
    #: ``create_agent(system_prompt=...)``, which no checkpoint holds): the planner counts
    #: them against the threshold (the bound is on what a call sends).
    outside: int = 0
    #: LangGraph's ``thread_id`` of the checkpoints that hold the messages, when the session
    #: is not named by it (an agent run as a callee inside another run: its session is
    #: ``<thread_id>|<namespace>``); None: the session id is the ``thread_id``.
    thread_id: str | None = None
    #: The thread's chars per token as its model counts them (:mod:`offpath.compaction.tokens`;
    #: None: not known, the worker counts the thread it reads)
    chars_per_token: float | None = None
    #: The run's messages when its middleware queued the job (a user's own agent): the job
    #: plans on them, the thread the run goes on from (later steps only add messages and
    #: shorten results in place, which a plan's digests allow), not on the checkpoint, which
    #: LangGraph writes in the background and which falls seconds behind a run on a loaded
    #: database: a plan on it names a thread the run no longer has (found stale at the swap,
    #: "message <first id> changed", or skipped under the threshold), and the next job
    #: waits for it again. Sent with the job's message (:meth:`to_message`), never kept in
    #: its row: a job published again (the reconciler) reads the checkpoint. None: read it.
    messages: tuple[BaseMessage, ...] | None = None

    def thread_of(self, session_id: str) -> str:
        """The ``thread_id`` the checkpoints of ``session_id``'s messages are kept under."""
        return self.thread_id or session_id

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"patch": self.patch, "checkpoints": self.checkpoints}
        if self.seen:
            data["seen"] = self.seen
        if self.force:
            data["force"] = True
        if self.checkpoint_ns:
            data["checkpoint_ns"] = self.checkpoint_ns
        if self.floor is not None:
            data["floor"] = self.floor
        if self.head:
            data["head"] = self.head
        if self.outside:
            data["outside"] = self.outside
        if self.thread_id:
            data["thread_id"] = self.thread_id
        if self.chars_per_token:
            data["chars_per_token"] = self.chars_per_token
        return data

    def to_message(self) -> dict[str, Any]:
        """:meth:`to_json` and the run's :attr:`messages` (LangChain's message dicts): what
        the job's message carries to the worker. Messages holding a value JSON cannot carry
        (an object a tool put in a message's fields), or more than
        :data:`JOB_MESSAGES_MAX_BYTES` of it, are left out: the job then reads the checkpoint."""
        data = self.to_json()
        if self.messages is not None:
            dicts = messages_to_dict(self.messages)
            try:
                size = len(orjson.dumps(dicts))
            except TypeError as exc:
                log.info("the run's messages are not sent with the job (%s): it reads them", exc)
            else:
                if size <= JOB_MESSAGES_MAX_BYTES:
                    data["messages"] = dicts
                else:
                    log.info("the run's messages (%d bytes) are not sent with the job: it reads "
                             "them", size)  # fmt: skip
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> JobOptions:
        if not data:
            return cls()
        return cls(
            patch=bool(data.get("patch", True)),
            checkpoints=data.get("checkpoints"),
            seen=data.get("seen"),
            force=bool(data.get("force", False)),
            checkpoint_ns=data.get("checkpoint_ns") or None,
            floor=int(data["floor"]) if isinstance(data.get("floor"), int) else None,
            head=data["head"] if isinstance(data.get("head"), str) else None,
            outside=max(0, data["outside"]) if isinstance(data.get("outside"), int) else 0,
            thread_id=data["thread_id"] if isinstance(data.get("thread_id"), str) else None,
            chars_per_token=stored_ratio(data.get("chars_per_token")),
            messages=_messages_of(data.get("messages")),
        )


def _messages_of(data: Any) -> tuple[BaseMessage, ...] | None:
    """The messages of a job's message (:meth:`JobOptions.to_message`); None when it has none
    or they cannot be read (the job reads the checkpoint)."""
    if not isinstance(data, list):
        return None
    try:
        return tuple(messages_from_dict(data))
    except Exception as exc:  # a message of a newer or older LangChain: the checkpoint's
        log.warning("the run's messages sent with a job could not be read: %s", exc)
        return None


def head_mark(messages: Sequence[BaseMessage]) -> str | None:
    """``"<id>:<digest>"`` of the first message after the system prompt (None: there is none),
    as :attr:`JobOptions.head` names it."""
    first = next((m for m in messages if m.type != "system"), None)
    return None if first is None else f"{first.id}:{digest(first)}"


def planned_head(prepared: Prepared) -> str | None:
    """``"<id>:<digest>"`` of the first message after the system prompt of the thread
    ``prepared`` was planned on (:func:`head_mark` of it; None: it saw none)."""
    first = prepared.order[0] if prepared.order else None
    return None if first is None else f"{first}:{prepared.digests.get(first)}"


#: The reason code of a job that failed on a value of its thread the database refused.
UNSTORABLE = "unstorable_value"


class JobEnded(Exception):
    """The job ended ``failed`` or ``skipped`` with ``code`` and ``reason`` (recorded by the
    caller); ``chars``: the thread's size when a planner skip was decided, ``worth_at``: the
    size from which its planner found a compaction worth it (0: not known); ``result``: what
    the job's run bought that its row does not hold yet (its prepared compaction and the
    summarizer's usage), stored with its ending."""

    def __init__(
        self, status: JobStatus, code: str, reason: str, chars: int = 0, worth_at: int = 0,
        result: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(reason)
        self.status = status
        self.code = code
        self.reason = reason
        self.chars = chars
        self.worth_at = worth_at
        self.result = result


#: The options of a job on one of offpath's own threads (its graph, its checkpointer).
OWN_THREAD = JobOptions()


@dataclass(frozen=True, slots=True)
class HookResult:
    """What the hook did: ``queued`` with the job id, ``applied``, or why not."""

    # "queued", "applied", "skipped", "already_queued", "prepared", "superseded", "backoff",
    # "error"
    action: str
    detail: str = ""
    job_id: str | None = None


def held(holder: Claim, session_id: str) -> HookResult:
    """What a turn that finds the thread's claim taken by ``holder`` did: nothing."""
    if holder.state is State.DONE:
        _log.info(
            "[%s] not queued: job %s compacted the thread after this turn",
            tag(session_id),
            holder.job_id,
        )
        return HookResult("superseded", holder.job_id)
    if holder.state is State.BACKOFF:
        return HookResult("backoff", f"job {holder.job_id} failed; backing off")
    if holder.state is State.PREPARED:
        return HookResult("prepared", holder.job_id)
    if holder.state is State.SKIPPED:
        return HookResult("skipped", SkipReason.NO_PROGRESS)
    return HookResult("already_queued", holder.job_id)


@dataclass(frozen=True, slots=True)
class Started:
    """What :meth:`Jobs.start` found: ``done``, the status of a job past running (nothing to
    do); else ``start`` and the claim ``before`` it, ``stored`` (a previous delivery's
    result) and, when it started, the running ``lease`` (renewed until the job ends);
    ``others``: whether the thread had another open job when it started (True when not
    known), which :meth:`Jobs.supersede_others` ends."""

    done: JobStatus | None
    stored: dict[str, Any] | None = None
    start: Start | None = None
    before: Claim | None = None
    lease: Held | None = None
    others: bool = True


@dataclass(frozen=True, slots=True)
class Landed:
    """:meth:`Jobs.apply` found the job's summary in the thread already (now recorded)."""

    record: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Applying:
    """A compaction fitted to the thread ``messages`` and about to be written: what a
    :class:`Writer` archives and writes. ``holding``: the claim it is applied under (the
    worker's running lease, or ``p:<job>``)."""

    session_id: str
    job_id: str
    result: Mapping[str, Any]
    fitted: Fitted
    messages: Sequence[BaseMessage]
    holding: Held | State | None = None
    #: ``messages`` with the patch applied (None: not made yet; :attr:`patched_messages`).
    after: Sequence[BaseMessage] | None = None

    @property
    def patched_messages(self) -> Sequence[BaseMessage]:
        """The thread once the patch is in (made once by :meth:`Jobs.apply`, which checks it)."""
        return patched(self.messages, self.fitted.patch) if self.after is None else self.after


#: The claim a caller of :class:`Jobs` holds on the thread: its delivery's running lease, or
#: ``p:<job>`` (:attr:`State.PREPARED`); None: none (the claim is left as it is).
Holding = Held | State | None


class Writer(Protocol):
    """Writes a fitted compaction: archives its record and the originals it removes (before
    the patch is in the thread, DESIGN.md invariant 12), then writes the patch. Raises
    :class:`JobEnded` for a job that must end (the caller ends it)."""

    def write(self, jobs: Jobs, applying: Applying) -> Any: ...


class Jobs:
    """The one writer of every job's state: its row and its thread's claim, together.

    ``publish(session_id, job_id, options)`` sends a job to the broker (raises on failure).
    The running leases this process takes are renewed by one :class:`LeaseKeeper`, made on
    first use and stopped by :meth:`stop`."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        leases: Leases,
        publish: Callable[[str, str, dict[str, Any] | None], None],
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.leases = leases
        self.publish = publish
        self._keeper: LeaseKeeper | None = None

    @property
    def keeper(self) -> LeaseKeeper:
        if self._keeper is None:
            self._keeper = LeaseKeeper(self.leases, self.settings.job_time_limit_s)
        return self._keeper

    def stop(self) -> None:
        if self._keeper is not None:
            self._keeper.stop()

    # -- the claim, a projection of the status ------------------------------------------

    def claim_after(
        self, session_id: str, job_id: str, status: JobStatus, chars: int = 0, worth_at: int = 0,
        *, running: bool = False,
    ) -> Claim | None:  # fmt: skip
        """The claim a job in ``status`` leaves on its thread: ``d`` (applied), ``p``
        (prepared), ``s`` (skipped by its planner, or reverted, at ``chars``), ``b`` (failed
        while it ran: the failure backoff), else free (None)."""
        if status is JobStatus.APPLIED:
            return Leases.after(job_id, State.DONE)
        if status is JobStatus.PREPARED:
            return Leases.after(job_id, State.PREPARED)
        if status in (JobStatus.SKIPPED, JobStatus.REVERTED) and chars:
            return Leases.after(job_id, State.SKIPPED, chars=chars, worth_at=worth_at)
        if status is JobStatus.FAILED and running:
            s = self.settings
            failures, _ = failures_in_a_row(self.engine, session_id)
            backoff = failure_backoff_s(failures, s.failure_backoff_s, s.failure_backoff_max_s)
            return Leases.after(job_id, State.BACKOFF, backoff_s=backoff)
        return None

    def _hand_on(
        self, session_id: str, job_id: str, status: JobStatus, holding: Holding,
        chars: int = 0, worth_at: int = 0,
    ) -> None:  # fmt: skip
        """Hand the thread on from the claim the caller holds (``holding``: this delivery's
        running lease, or ``p:<job>``; None: left as it is) to the one ``status`` projects to."""
        if holding is None:
            return
        lease = holding if isinstance(holding, Held) else None
        then = self.claim_after(session_id, job_id, status, chars, worth_at, running=bool(lease))
        if lease is None:
            self.leases.settle(session_id, job_id, then)
            return
        self.keeper.drop(lease)
        try:
            self.leases.finish(session_id, job_id, lease.token, then)
        except Exception as exc:  # the lease lapses on its own
            log.warning("[%s] could not release the thread's lease: %s", tag(session_id), exc)

    # -- queued ---------------------------------------------------------------------------

    def queue(
        self,
        session_id: str,
        chars: int | None,
        superseded: Callable[[Claim], bool] = lambda _: False,
        *,
        options: JobOptions = OWN_THREAD,
        min_gain: int = 0,
        threshold: int = 0,
        say_outages: bool = False,
    ) -> HookResult:
        """Claim the thread for a new job, write its ``queued`` row and publish it (the one way
        to queue a job). ``chars`` is the thread's size, if known; a thread a job found
        nothing worth compacting in is queued again only once it has grown by ``min_gain``
        chars, or crossed its ``threshold`` (chars; 0: not known) since a skip decided under
        it (:meth:`Claim.frees_for`). ``say_outages``: say a store that cannot be reached
        once, naming it, then count its failures (:mod:`offpath.coordination.outages`); else
        each failure is logged."""
        sid = tag(session_id)

        def failed(store: str, exc: Exception, what: str) -> None:
            if say_outages and is_outage(exc):
                OUTAGES.failed(store, where(store, self.settings), exc, what)
            else:
                log.warning("[%s] %s (%s)", sid, what, exc)

        job_id = uuid.uuid4().hex
        opts = options.to_json()
        try:
            holder = self.leases.claim(
                session_id, job_id, superseded, chars=chars, min_gain=min_gain, threshold=threshold
            )
        except Exception as exc:  # Redis (or the lock database) unreachable
            failed(LEASE_STORE, exc, "compaction not queued: broker unreachable")
            why = f"lock store unreachable ({type(exc).__name__})"
            try:  # the reconciler publishes it (one such row per thread)
                if not has_unpublished_job(self.engine, session_id):
                    create_job(self.engine, job_id, session_id, chars, published=False,
                                  reason=why, options=opts)  # fmt: skip
            except Exception as exc2:
                log.warning("[%s] could not record the unqueued job either: %s", sid, exc2)
            return HookResult("error", f"broker unreachable: {exc}")
        if holder is not None:
            return held(holder, session_id)
        try:
            create_job(self.engine, job_id, session_id, chars, options=opts)
        except Exception as exc:
            failed(USAGE_DB, exc, "compaction not queued: usage database error")
            self.leases.release_queued(session_id, job_id)
            return HookResult("error", f"database error: {exc}")
        try:
            self.publish(session_id, job_id, options.to_message())
        except Exception as exc:
            # the claim stays, so later turns do not pile up jobs; the reconciler publishes it
            failed(BROKER, exc, "compaction not queued: publish failed")
            try:
                why = f"publish failed ({type(exc).__name__})"
                set_published(self.engine, job_id, False, why)
            except Exception:  # already logged above; the job row stays queued
                pass
            return HookResult("error", f"publish failed: {exc}")
        log.info("[%s] compaction queued: job %s (%s chars)", sid, job_id, chars)
        return HookResult("queued", job_id=job_id)

    def publish_again(
        self, session_id: str, job_id: str, options: JobOptions, *, claimed: bool, published: bool
    ) -> bool:
        """Publish an open job again (the reconciler: its broker was away, or its lease lapsed),
        claiming its thread first unless it holds it (``claimed``); False if another claim
        keeps the thread. ``published``: its row says the broker had taken it once."""
        if not claimed and self.leases.claim(session_id, job_id) is not None:
            return False
        self.publish(session_id, job_id, options.to_json())
        if not published:
            set_published(self.engine, job_id, True)
        return True

    def publish_lost(self, session_id: str, job_id: str, options: JobOptions) -> None:
        """Publish a queued job whose message is gone (its consumer died holding it, and the
        caller removed it from the broker), on the claim it holds. If the broker refuses it,
        the row says not published (the reconciler publishes it) and the error is raised."""
        try:
            self.publish(session_id, job_id, options.to_json())
        except Exception as exc:
            set_published(self.engine, job_id, False, f"publish failed ({type(exc).__name__})")
            raise

    # -- running ----------------------------------------------------------------------------

    def start(self, session_id: str, job_id: str) -> Started:
        """One delivery of job ``job_id`` starts: its row ``running`` (the attempt counted) and
        the thread's running lease taken and renewed, unless the job is past running."""
        done, stored, others = start_job(self.engine, job_id, session_id)
        if done is not None:
            self.leases.release_queued(session_id, job_id)  # a re-publish raced its end
            return Started(done)
        token = uuid.uuid4().hex[:12]
        started, before = self.leases.start(session_id, job_id, token)
        if started is Start.DUPLICATE:
            uncount_attempt(self.engine, job_id)  # the delivery running it counted one
        lease = self.keeper.hold(session_id, job_id, token) if started is Start.OK else None
        return Started(None, stored, started, before, lease, others)

    def retry(self, lease: Held) -> None:
        """Running -> queued while the job waits for its retry (its lease no longer renewed)."""
        self.keeper.drop(lease)
        self.leases.requeue(lease.session_id, lease.job_id, lease.token)

    def let_go(self, lease: Held) -> None:
        """Stop renewing ``lease`` (its job handed the thread on, or the lease lapses)."""
        self.keeper.drop(lease)

    def supersede_others(self, session_id: str, job_id: str) -> int:
        """End the thread's other open jobs (``job_id`` holds its running lease: they are
        dead); how many. Called when the job's start found some (:attr:`Started.others`):
        no job is queued for the thread while this one holds its claim."""
        return end_others(self.engine, session_id, job_id)

    def prepare(
        self, session_id: str, job_id: str, stored: dict[str, Any], lease: Held, why: str
    ) -> JobStatus:
        """The job ends its run with its compaction ``stored`` and prepared, the thread handed
        on to ``p:<job>`` at once (under the thread's lock when the caller holds it: a turn
        that crosses the threshold next finds it prepared)."""
        store_result(self.engine, job_id, stored, JobStatus.PREPARED)
        self._hand_on(session_id, job_id, JobStatus.PREPARED, lease)
        log.info("[%s] summarizer: compaction prepared (%s)", tag(session_id), why)
        return JobStatus.PREPARED

    def end(
        self, session_id: str, job_id: str, ended: JobEnded, holding: Holding = None,
        *, only_if_open: bool = False,
    ) -> bool:  # fmt: skip
        """The job ends as ``ended`` says (``skipped`` or ``failed``, its code and reason, and
        the result its run bought when ``ended`` carries one), the thread handed on from ``holding`` (see :meth:`_hand_on`): a planner skip leaves
        ``s:<job>:<chars>:<at>``, a run that failed the failure backoff. False if
        ``only_if_open`` and the job had ended already (nothing changed)."""
        e = ended
        changed = set_job(self.engine, job_id, session_id, e.status, e.reason, e.code,
                          only_if_open=only_if_open, result=e.result)  # fmt: skip
        self._hand_on(session_id, job_id, e.status, holding, e.chars, e.worth_at)
        return changed

    def expire(self, session_id: str, job_id: str, reason: str) -> bool | None:
        """A prepared job waited too long: its claim freed first (a run that finds it gone
        applies nothing), then it ends ``skipped: expired``. None if the claim moved on
        meanwhile (nothing changed); else whether the row changed."""
        if not self.leases.settle(session_id, job_id, None):
            return None
        return set_job(
            self.engine, job_id, session_id, JobStatus.SKIPPED, reason, "expired", only_if_open=True
        )

    def force(self, job_id: str) -> bool:
        """Mark the prepared job as asked for by an operator (its options' ``force``: applied
        at the next chance, under the threshold too); False if it is no longer prepared."""
        return mark_forced(self.engine, job_id)

    # -- applied ------------------------------------------------------------------------------

    def apply(
        self,
        writer: Writer,
        session_id: str,
        job_id: str,
        result: Mapping[str, Any],
        messages: Sequence[BaseMessage],
        *,
        force: bool,
        outside: int,
        settings: Settings,
        recall: bool = True,
        lease: Held | None = None,
        replan: bool = False,
        unsaved: bool = False,
    ) -> Any:
        """Apply job ``job_id``'s prepared compaction (``result["prepared"]``) to the thread's
        ``messages`` through ``writer``; the thread is handed on from ``lease`` (the worker's)
        or ``p:<job>`` (None). ``force``, ``outside``, ``recall``: as :func:`fit_now` takes them.
        ``unsaved``: ``result`` is not in the job's row yet (the worker's run, which stores it
        with the transition that ends the run): a job that ends here keeps it with its ending.

        Returns what ``writer`` wrote; :class:`Landed` (its summary was in ``messages``: now
        recorded); :class:`Stale` (ended ``skipped: stale``, unless ``replan``: the caller
        plans again); or the :class:`JobEnded` it ended with (the patch would orphan a tool
        call, or the writer refused it)."""
        holding: Holding = lease or State.PREPARED
        if landed(messages, job_id, result.get("record")):
            self.record(session_id, job_id, holding=holding)
            return Landed(result["record"])
        prepared = Prepared.from_json(result["prepared"])
        fitted = fit_now(prepared, messages, settings, force=force, outside_chars=outside,
                         recall=recall, originals=partial(self.originals, session_id))  # fmt: skip
        if isinstance(fitted, Stale):
            if not replan:
                why = fitted.reason
                log.info(
                    "[%s] prepared compaction of job %s dropped: %s (planned on %s, whose "
                    "first message was %s; the thread's is %s)",
                    tag(session_id),
                    job_id,
                    why,
                    result.get("planned_on") or "a thread not named",
                    planned_head(prepared),
                    head_mark(messages),
                )
                stale = JobEnded(JobStatus.SKIPPED, "stale", f"stale: {why}",
                                 result=dict(result) if unsaved else None)  # fmt: skip
                self.end(session_id, job_id, stale, holding)
            return fitted
        try:
            after = patched(messages, fitted.patch)  # the writer's loss report reads it too
            if broken := new_unpaired(messages, after):
                why = f"patch would orphan tool calls {sorted(broken)}"
                raise JobEnded(JobStatus.FAILED, "orphan_guard", why)
            return writer.write(
                self, Applying(session_id, job_id, result, fitted, messages, holding, after)
            )
        except JobEnded as ended:
            if unsaved and ended.result is None and ended.code != UNSTORABLE:
                ended.result = dict(result)
            self.end(session_id, job_id, ended, holding)
            return ended

    def originals(self, session_id: str, message_ids: Sequence[str]) -> dict[str, BaseMessage]:
        """The archived originals of the thread's messages shortened in place, by id
        (:func:`~offpath.stores.archive.originals`); none when the archive cannot be read:
        the summary then lists what their shortened copies show."""
        try:
            return archive.originals(self.engine, session_id, message_ids)
        except Exception as exc:
            log.warning("[%s] originals of shortened messages not read: %s", tag(session_id), exc)
            return {}

    def archive(self, applying: Applying, record: dict[str, Any]) -> None:
        """Store the job's ``record`` of the summary it patches in, and the originals it removes
        (before the patch). Raises :class:`~offpath.stores.values.Unstorable`."""
        a, f = applying, applying.fitted
        rows = archive.rows_for(a.session_id, a.job_id, str(f.summary.id), a.messages, f.removed,
                                f.shortened)  # fmt: skip
        archive.store_record(self.engine, a.job_id, {**a.result, "record": record}, rows)

    def record(
        self, session_id: str, job_id: str, stored: dict[str, Any] | None = None,
        *, holding: Holding = None, size: tuple[int, int] | None = None,
    ) -> bool:  # fmt: skip
        """The job's compaction is in its thread: its usage event (exactly once) and ``applied``,
        the thread handed on to ``d:<job>`` from ``holding`` (see :meth:`_hand_on`).
        ``stored``: the result the caller wrote to the job's row (saves reading it back);
        ``size``: the thread's size once patched (messages, chars), for the session list, in
        the same transaction. False if it was recorded already. Raises ``LookupError`` for a
        job with no record."""
        done = finalize(self.engine, job_id, session_id, stored, size)
        self._hand_on(session_id, job_id, JobStatus.APPLIED, holding)
        return done

    def report_loss(self, job_id: str, summary_id: str, loss: dict[str, Any]) -> bool:
        """Put the loss report of job ``job_id`` in its stored record (False: the record is no
        longer that of ``summary_id``)."""
        return archive.store_loss(self.engine, job_id, summary_id, loss)

    # -- reverted ---------------------------------------------------------------------------

    def hold_for_revert(self, session_id: str, holder: Claim | None, then: Claim | None) -> bool:
        """The thread's claim ``holder`` replaced by ``then`` before a revert writes the thread
        (no job is queued for it meanwhile); False if the claim moved on."""
        return self.leases.set_from(session_id, holder, then)

    def release_revert(self, session_id: str, then: Claim | None, holder: Claim | None) -> None:
        """A revert that failed puts the claim it replaced back."""
        self.leases.set_from(session_id, then, holder)

    def reverted(
        self, session_id: str, job_id: str, reason: str, superseded: Claim | None = None
    ) -> bool:
        """Job ``job_id`` is ``reverted`` (its originals are back in the thread); a compaction
        prepared on its summary (``superseded``, the claim the revert replaced) ends
        ``skipped: superseded``."""
        if superseded is not None and superseded.state is State.PREPARED:
            why = f"superseded: job {job_id} was reverted; the compaction prepared on its summary"
            ended = JobEnded(JobStatus.SKIPPED, "superseded", f"{why} no longer fits")
            self.end(session_id, superseded.job_id, ended, only_if_open=True)
        return mark_reverted(self.engine, job_id, reason)

    def forget(self, session_id: str, holder: Claim | None) -> None:
        """A deleted session's claim goes (if it is still ``holder``)."""
        if holder is not None:
            self.leases.set_from(session_id, holder, None)
