"""The ``recall`` tool: the agent reads the originals its thread's summaries replaced.

A compaction archives every message it removes (:mod:`offpath.stores.archive`);
the summary's last line tells the model this tool exists, and its **Pinned facts**
name the message each fact came from. ``recall(query)`` answers, for the thread of
the run that calls it (LangGraph's ``thread_id``; another thread's archive is never
searched):

* ``query`` is an archived message id, or the first 8 hex chars of one that is a UUID (how a
  summary cites it: :func:`offpath.compaction.summary.cite`): that message as it was first
  archived (the
  original, never a summary that later took its id), :data:`~offpath.stores.archive.RECALL_MAX_CHARS`
  chars of it from ``offset`` on (a long tool result is read page by page: the line that
  replaced the part of it a shortening cut out names the offset);
* otherwise: the best full-text matches (SQLite FTS5, or PostgreSQL full-text
  search), best first and the newest first among equal ones, each an excerpt taken where
  the query's words are (:func:`~offpath.stores.search.excerpt`) with its message id, at
  most ``RECALL_MAX_CHARS`` chars in all.

Errors (no thread, the database down) come back as the tool's text, so a run never
fails on a lookup; a query no store can hold (a NUL character, a lone UTF-16 surrogate) is
answered as the bad input it is, before the archive is asked.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable

from langchain_core.messages import messages_from_dict
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.config import get_config
from sqlalchemy.engine import Engine

from offpath.compaction.accounting import content_text
from offpath.compaction.summary import CITED_UUID_CHARS
from offpath.stores import archive
from offpath.stores.search import search
from offpath.stores.values import unstorable

log = logging.getLogger("offpath.recall")

#: A cited message id: a UUID's first hex chars (:data:`CITED_UUID_CHARS`).
_CITED = re.compile(rf"[0-9a-f]{{{CITED_UUID_CHARS}}}")

#: The tool's description, as the model reads it.
DESCRIPTION = (
    "Search the original messages that this conversation's summaries replaced or shortened "
    "(tool outputs, logs, earlier answers), which are archived unchanged. `query`: words to "
    "find (an error code, a pod or file name, ...) or a message id named in the summary's "
    "Pinned facts or in a shortened tool result. For a message id, `offset` reads on from that "
    "char of the message (pages of 4,000 chars). Returns matching excerpts with their "
    "message ids, or the message's text."
)


def thread_of_run() -> str | None:
    """The ``thread_id`` of the run this call belongs to, if any."""
    try:
        value = get_config().get("configurable", {}).get("thread_id")
    except RuntimeError:  # not inside a run
        return None
    return str(value) if value is not None else None


def answer(engine: Engine, thread_id: str, query: str, offset: int = 0) -> str:
    """The tool's answer for ``query`` on ``thread_id``'s archive (see the module doc);
    at most about :data:`~offpath.stores.archive.RECALL_MAX_CHARS` chars. ``offset``: for a
    message id, the char of its text to read from (0: its start)."""
    query = query.strip()
    if not query:
        return "recall: give some words to search for, or a message id."
    if (problem := unstorable(query, "query")) is not None:  # bad input, not the archive's fault
        held = "a NUL character" if "NUL" in problem else "a lone UTF-16 surrogate (not text)"
        return f"recall: bad input: the query holds {held}; search again without it."
    limit = archive.RECALL_MAX_CHARS
    stored = archive.original(engine, thread_id, query)
    if stored is None and _CITED.fullmatch(query):
        ids = archive.ids_cited(engine, thread_id, query)
        if len(ids) == 1:
            stored = archive.original(engine, thread_id, ids[0])
    if stored is not None:
        (message,) = messages_from_dict([stored])
        # as a shortened result was cut from (its offsets): other parts as placeholders
        text = content_text(message.content, placeholders=True)
        calls = getattr(message, "tool_calls", None) or []
        if calls:
            text += "\n" + "\n".join(
                f"tool call {c.get('name')}({json.dumps(c.get('args'), default=str)})"
                for c in calls
            )
        start = min(max(0, int(offset)), len(text))
        end = min(len(text), start + limit)
        page = text[start:end]
        if start == 0 and end == len(text):
            return f"[{query}] ({message.type})\n{page}"
        more = f'; recall("{query}", offset={end}) reads on' if end < len(text) else ""
        return f"[{query}] ({message.type}) chars {start:,}-{end:,} of {len(text):,}{more}\n{page}"
    hits = search(engine, thread_id, query, max_chars=limit)
    if not hits:
        return f"recall: nothing archived in this conversation matches {query!r}."
    return "\n\n".join(f"[{h['message_id']}] ({h['type']}) {h['excerpt']}" for h in hits)


def recall_tool(
    engine_of: Callable[[], Engine], session_of: Callable[[], str | None] = thread_of_run
) -> BaseTool:
    """The ``recall`` tool over the archive in ``engine_of()`` (opened on first use), of the
    session ``session_of()`` names for the run calling it (default: its ``thread_id``; an
    agent run as a callee inside another run has a session of its own)."""

    def recall(query: str, offset: int = 0) -> str:
        thread_id = session_of()
        if thread_id is None:
            return "recall: this call is not part of a conversation (no thread_id)."
        try:
            return answer(engine_of(), thread_id, query, offset)
        except Exception as exc:  # the archive's store is down: the run goes on
            log.warning("recall failed on thread %s: %s", thread_id, exc)
            return f"recall: the archive could not be read ({type(exc).__name__}); try later."

    return StructuredTool.from_function(recall, name="recall", description=DESCRIPTION)
