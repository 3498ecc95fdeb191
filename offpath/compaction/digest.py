"""What a message says, as a short digest: how a prepared compaction recognises, when it is
applied, that the messages it planned on are unchanged (:func:`compaction.patch.fit`). Pure.

A tool result offpath shortened (:mod:`compaction.shorten`) carries its original's digest in
its mark, so shortening a message does not make a compaction planned on it stale: it still
says the same thing, and its original is archived.
"""

from __future__ import annotations

import hashlib

import orjson
from langchain_core.messages import BaseMessage

#: ``additional_kwargs`` key of a tool result offpath shortened (see :mod:`compaction.shorten`).
SHORTENED = "offpath_shortened"


def raw_digest(message: BaseMessage) -> str:
    """A short digest of what ``message`` says now (type, content, tool calls, tool-call id,
    name): two processes compute the same for the same message. 16 hex chars."""
    parts = [
        message.type,
        message.content,
        getattr(message, "tool_calls", None) or None,
        getattr(message, "tool_call_id", None),
        message.name,
    ]
    raw = orjson.dumps(parts, default=str, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


def digest(message: BaseMessage) -> str:
    """:func:`raw_digest` of ``message``, or of its original when offpath shortened it."""
    mark = message.additional_kwargs.get(SHORTENED)
    if isinstance(mark, dict) and isinstance(mark.get("digest"), str):
        return mark["digest"]
    return raw_digest(message)
