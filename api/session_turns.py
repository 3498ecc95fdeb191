"""What the session routes (:mod:`api.sessions`) do around a turn's write: the thread's state
(:func:`state_of`), the pruning of old checkpoints after the response (:func:`prune`), tool
results shortened as they arrive (:func:`offload`); a failed chat turn is taken back by :mod:`offpath.coordination.undo`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig

from offpath.compaction.accounting import message_chars
from offpath.compaction.summary import is_summary
from offpath.coordination.logs import tag
from offpath.coordination.runtime import Runtime
from offpath.stores import archive
from offpath.stores.checkpoints import thread_config

log = logging.getLogger("offpath.api")


def state_of(rt: Runtime, session_id: str) -> dict[str, Any]:
    return rt.graph.get_state(thread_config(session_id)).values


def prune(rt: Runtime, session_id: str) -> None:
    try:
        rt.checkpoints.prune(session_id, rt.settings.checkpoint_history)
    except Exception as exc:  # best effort: the next write prunes
        log.warning("[%s] could not prune old checkpoints: %s", tag(session_id), exc)


def offload(
    rt: Runtime, session_id: str, new: list[BaseMessage], position: int
) -> list[BaseMessage]:
    """The turn's messages (``position``: where the first lands in the thread) with each tool
    result over ``TOOL_RESULT_MAX_CHARS`` shortened in place (head, tail, the facts of the
    part cut out, how to read it with ``recall``), its original archived first: as it
    arrives, in the turn's own write. If the archive cannot be written
    the results are kept whole (never shortened unarchived); a compaction shortens them
    later."""
    limit = rt.settings.tool_result_limit_chars
    if not rt.settings.active:
        return new
    caps = {
        str(m.id): limit for m in new if isinstance(m, ToolMessage) and message_chars(m) > limit
    }
    if not caps:
        return new
    try:
        return archive.shorten_archived(rt.engine, session_id, new, caps, offset=position)
    except Exception as exc:
        log.warning("[%s] tool results kept whole, not archived: %s", tag(session_id), exc)
        return new


def run_turn(
    rt: Runtime, human: BaseMessage, config: RunnableConfig, before: set[Any]
) -> tuple[dict[str, Any], list[BaseMessage]]:
    """Run the chat agent on ``human``; returns the thread's values after the run and the
    messages the run produced, in order, once each (by id, in its latest form), including
    any that a compaction applied during the run has since folded into the summary, so a
    run's figures count what it did, not what is left of it. Messages whose id is in
    ``before`` and summaries are not the run's. Raises what the graph raises."""
    values: dict[str, Any] = {}
    produced: dict[str, BaseMessage] = {}
    # the thread after each step of the run: a message a later step folds into a
    # summary was in an earlier step's values. The run's messages are appended after the
    # thread's, so each step is read from its end back to the first message the thread
    # held before the run: a step costs the run's messages, not the thread's.
    for values in rt.graph.stream({"messages": [human]}, config, stream_mode="values"):
        tail: list[BaseMessage] = []
        for m in reversed(values.get("messages", [])):
            if m.id in before:
                break
            if not is_summary(m):
                tail.append(m)
        for m in reversed(tail):
            produced[str(m.id)] = m
    return values, list(produced.values())


def summary_text(messages: Sequence[BaseMessage]) -> str:
    """The text of the summary among ``messages``, or "" when there is none."""
    return next((str(m.content) for m in messages if is_summary(m)), "")
