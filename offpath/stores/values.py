"""What the stores keep as sent, one rule on both backends: :func:`unstorable` names the first
value of a JSON-like structure that no store keeps (a NUL character, a lone UTF-16 surrogate,
an integer beyond 64 bits, NaN or Infinity); :class:`Unstorable` is what a write raises when
the database refused such a value it was given (:func:`refused_value`), naming where it is.

The API refuses these values in what a client sends (422); a write can still meet one that
reached a thread another way (a team's own agent's checkpointer, a thread written before the
API checked): the job that fails on it then names it in its reason.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import sqlalchemy as sa

#: Integers the stores hold exactly (orjson and msgpack: 64 bits, signed or unsigned).
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")


class Unstorable(ValueError):
    """The database refused a value no store keeps as sent; the message names where it is
    (``message <id>: tool_calls[0].args.q: NUL characters ...``), never the value itself."""


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
    """``"<path>: <problem>"`` for the first value in ``value`` (parsed JSON, or the dicts and
    lists a store writes) that no store keeps as sent: a string (or key) with a NUL character
    (PostgreSQL's text and ``jsonb`` refuse it), a lone UTF-16 surrogate (``"\\ud800"``), an
    integer beyond 64 bits (the checkpoint serializers refuse it), NaN or Infinity (no JSON
    answer can hold it); None if all is well."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if (problem := _problem_of(k)) is not None:
                return f"{path} key: {problem}"
            if (found := unstorable(v, f"{path}.{k}")) is not None:
                return found
        return None
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            if (found := unstorable(v, f"{path}[{i}]")) is not None:
                return found
        return None
    problem = _problem_of(value)
    return None if problem is None else f"{path}: {problem}"


#: What a driver raises for a value it cannot send or the database cannot keep (psycopg's
#: ``DataError`` "cannot contain NUL", PostgreSQL's ``UntranslatableCharacter``, an encoding
#: error), as SQLAlchemy wraps it.
REFUSED_ERRORS: tuple[type[BaseException], ...] = (sa.exc.StatementError, UnicodeError)


def refused_value(named: Iterable[tuple[str, Any]]) -> Unstorable | None:
    """The :class:`Unstorable` naming the first unstorable value among ``named`` (``(where,
    value)`` pairs: what a write was given), or None (the write failed for another reason).
    Called once the database refused a write, so the rule costs nothing on the common path."""
    for where, value in named:
        if (found := unstorable(value, where)) is not None:
            return Unstorable(found)
    return None
