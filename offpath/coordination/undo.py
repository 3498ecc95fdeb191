"""A failed chat run taken back (:func:`undo_run`): the messages it added leave the thread,
now or, when the checkpointer does not answer (the outage that failed the run), once it
answers again, before anything else is written to the thread (:func:`finish_undo`, called
under the thread's turn lock by every writer that adds or restores messages: a chat run, a
posted turn, a revert)."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, RemoveMessage

from offpath.compaction.summary import is_summary
from offpath.coordination.locks import LockUnavailable, RunInProgress
from offpath.coordination.logs import tag
from offpath.coordination.outages import cause, is_outage
from offpath.coordination.runtime import Runtime
from offpath.stores.checkpoints import read_thread, thread_config

log = logging.getLogger("offpath.api")


#: How long a failed run's take-back is tried again while its store does not answer (s);
#: any write to the thread (its turn lock taken) finishes it first meanwhile.
UNDO_RETRY_S = 600.0
UNDO_RETRY_MAX_GAP_S = 10.0


def _undo_key(rt: Runtime, session_id: str) -> str:
    return f"{rt.settings.redis_key_prefix}:undo:{session_id}"


def run_span(messages: list[BaseMessage], before: set[Any], request_id: str) -> list[str]:
    """The ids of what one run added to ``messages``: from its request (id ``request_id``;
    where a compaction folded it in, the first message not in ``before``) up to the next
    human message not in ``before`` (a later turn's, written while the take-back waited),
    those not in ``before``, summaries aside."""
    ids = [m.id for m in messages]
    if request_id in ids:
        start = ids.index(request_id)
    else:
        start = next((i for i, m in enumerate(messages) if m.id not in before), len(messages))
    span: list[str] = []
    for m in messages[start:]:
        later = isinstance(m, HumanMessage) and not is_summary(m) and m.id != request_id
        if later and m.id not in before and span:
            break
        if m.id not in before and not is_summary(m):
            span.append(str(m.id))
    return span


def _take_back(rt: Runtime, session_id: str, before: set[Any], request_id: str) -> None:
    """Remove what the run added (:func:`run_span`) from the thread's latest checkpoint. The
    failed step's writes that LangGraph keeps beside that checkpoint (its pending writes:
    the thread's state shows them, an update never applies them) end with the checkpoint
    this write makes. Raises what the checkpointer raises."""
    messages = read_thread(rt.checkpoints.saver, session_id).messages
    added = run_span(messages, before, request_id)
    if added:
        rt.patch(session_id, {"messages": [RemoveMessage(id=i) for i in added]})
        return
    shown = rt.graph.get_state(thread_config(session_id)).values.get("messages", [])
    if run_span(shown, before, request_id):
        rt.patch(session_id, {"messages": []})  # a checkpoint past the failed step's writes


def undo_run(rt: Runtime, session_id: str, before: set[Any], request_id: str) -> None:
    """Take back what a failed run added (``before``: the ids the thread held before it;
    ``request_id``: the run's human message), so
    the thread is as it was; a summary the run's middleware applied stays (it replaced
    messages that are gone). Called under the thread's turn lock.

    When the checkpointer does not answer (the outage that failed the run), the take-back
    is kept in the lock store (``<prefix>:undo:<thread>``, a day) and tried again on a
    thread of its own every 1-10 s for ``UNDO_RETRY_S``, holding the thread lock as a patch
    does (a turn arriving meanwhile waits up to ``LOCK_WAIT_S`` rather than answering 409);
    every later write to the thread (:func:`finish_undo`, under the same lock) completes it
    first, so no later turn lands beside the failed run's messages."""
    try:
        _take_back(rt, session_id, before, request_id)
        return
    except Exception as exc:
        if not is_outage(exc):
            log.error("[%s] could not take back the failed turn: %s", tag(session_id), exc)
            return
        log.warning(
            "[%s] the failed turn is taken back once the store answers: %s",
            tag(session_id),
            cause(exc),
        )
    try:
        key = _undo_key(rt, session_id)
        store = rt.leases.store
        kept = {"before": sorted(map(str, before)), "request": request_id}
        store.swap(key, store.get(key), json.dumps(kept), 86_400)
    except Exception as exc:
        log.error("[%s] could not keep the failed turn's take-back: %s", tag(session_id), exc)
        return
    threading.Thread(
        target=_retry_undo, args=(rt, session_id), name=f"undo-{session_id[:16]}", daemon=True
    ).start()


def finish_undo(rt: Runtime, session_id: str) -> None:
    """Complete a failed run's take-back kept by :func:`undo_run`, if any; called under the
    thread's turn lock before anything else is written to it. A lock store that does not
    answer is passed over (a take-back kept there waits for it); a checkpointer that does
    not answer raises (the take-back stays kept)."""
    key = _undo_key(rt, session_id)
    store = rt.leases.store
    try:
        kept = store.get(key)
    except Exception as exc:
        if not is_outage(exc):
            raise
        return  # the lock store is down: a take-back kept there waits for it
    if kept is None:
        return
    run = json.loads(kept)
    _take_back(rt, session_id, set(run["before"]), run["request"])
    store.swap(key, kept, None, 0)
    log.info("[%s] the failed turn is taken back", tag(session_id))


def _retry_undo(rt: Runtime, session_id: str) -> None:
    deadline = time.monotonic() + UNDO_RETRY_S
    gap = 1.0
    while time.monotonic() < deadline:
        time.sleep(gap)
        try:
            # held as a patch is (short): a turn arriving meanwhile waits for it, not a 409
            with rt.locks.patch(session_id):
                finish_undo(rt, session_id)
            return
        except (RunInProgress, LockUnavailable):
            pass  # a write holds the thread: it finishes the take-back first
        except Exception as exc:
            if not is_outage(exc):
                log.error("[%s] could not take back the failed turn: %s", tag(session_id), exc)
                return
        gap = min(2 * gap, UNDO_RETRY_MAX_GAP_S)
    log.error(
        "[%s] the failed turn is not taken back after %.0f s: the next write takes it back",
        tag(session_id),
        UNDO_RETRY_S,
    )
