"""Checks of what a client sends, as plain functions: :func:`is_json_media` (is a body parsed
as JSON), :func:`unstorable` (values a JSON parser returns but no store keeps: NUL, a lone
surrogate, an integer beyond 64 bits, NaN; the stores' own rule, :mod:`offpath.stores.values`),
:func:`nul_parameter` (a NUL in a query string) and :func:`short` (what an error may quote of
the input).
"""

from __future__ import annotations

import email.message
from typing import Any
from urllib.parse import parse_qsl

from offpath.stores.values import INT_MAX, INT_MIN, unstorable

__all__ = ["INT_MAX", "INT_MIN", "is_json_media", "nul_parameter", "short", "unstorable"]


def is_json_media(content_type: str | None) -> bool:
    """Whether a body of ``content_type`` is parsed as JSON: FastAPI's own rule
    (``application/json`` or ``application/*+json``, in any letter case: media types are
    case-insensitive), and no type at all, which FastAPI does not parse
    but which is checked all the same."""
    if not content_type:
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def nul_parameter(query_string: bytes) -> str | None:
    """The first query parameter whose name or value holds a NUL character (``%00``), or
    None: such a value reaches SQL, where PostgreSQL refuses it."""
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
