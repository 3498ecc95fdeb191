"""Checks of what a client sends, as plain functions: :func:`is_json_media` (is a body parsed
as JSON), :func:`unstorable` (values a JSON parser returns but no store keeps: NUL, a lone
surrogate, an integer beyond 64 bits, NaN), :func:`nul_parameter` (a NUL in a query string)
and :func:`short` (what an error may quote of the input).
"""

from __future__ import annotations

import email.message
import math
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl


def is_json_media(content_type: str | None) -> bool:
    """Whether a body of ``content_type`` is parsed as JSON: FastAPI's own rule
    (``application/json`` or ``application/*+json``, in any letter case: media types are
    case-insensitive; issue 20, item 3), and no type at all, which FastAPI does not parse
    but which is checked all the same."""
    if not content_type:
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


#: Integers the stores hold exactly (orjson and msgpack: 64 bits, signed or unsigned).
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")


def _problem_of(value: Any) -> str | None:
    """What makes a scalar unstorable, or None."""
    if isinstance(value, str):
        if "\x00" in value:
            return "NUL characters are not accepted (PostgreSQL stores none; send the text without them)"
        if not value.isascii() and _SURROGATE.search(value):
            return "a lone UTF-16 surrogate is not text (send valid UTF-8)"
    elif isinstance(value, bool):
        return None
    elif isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
        return "an integer beyond 64 bits is not stored exactly (send it as a string)"
    elif isinstance(value, float) and not math.isfinite(value):
        return "NaN and Infinity are not JSON numbers"
    return None


def unstorable(value: Any, path: str = "body") -> str | None:
    """``"<path>: <problem>"`` for the first value in ``value`` (a parsed JSON body) that no
    store keeps as sent: a string (or key) with a NUL character (PostgreSQL's text and
    ``jsonb`` refuse it: the session then never compacted, issue 20, item 4) or a lone
    UTF-16 surrogate (``"\\ud800"``: it was stored as ``?``, or answered 500), an integer
    beyond 64 bits (the checkpoint serializers refuse it), NaN or Infinity (no JSON answer
    can hold it); None if all is well. One rule on both backends."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if (problem := _problem_of(k)) is not None:
                return f"{path} key: {problem}"
            if (found := unstorable(v, f"{path}.{k}")) is not None:
                return found
        return None
    if isinstance(value, list):
        for i, v in enumerate(value):
            if (found := unstorable(v, f"{path}[{i}]")) is not None:
                return found
        return None
    problem = _problem_of(value)
    return None if problem is None else f"{path}: {problem}"


def nul_parameter(query_string: bytes) -> str | None:
    """The first query parameter whose name or value holds a NUL character (``%00``), or
    None: such a value reaches SQL, where PostgreSQL refuses it (issue 20, item 4)."""
    if b"%00" not in query_string:
        return None
    for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        if "\x00" in name or "\x00" in value:
            return short(name.replace("\x00", "\\0"), 40) or "?"
    return None


def short(value: Any, limit: int = 80) -> str:
    """At most ``limit`` chars of ``value``, for an error message."""
    text = value if isinstance(value, str) else repr(value)
    text = text.encode("utf-8", "replace").decode()
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"
