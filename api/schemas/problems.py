"""Error answers: :class:`Problem` (``{"detail": str}``), :class:`Invalid` for 422 (with
``errors``), and the error answers each route lists in the OpenAPI document (:data:`ERRORS`,
:data:`READ`, :data:`WRITE`...).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Problem(BaseModel):
    """An error: ``detail`` says what is wrong, in one line."""

    detail: str


class FieldError(BaseModel):
    loc: list[str] = Field(description="Where: body, messages, 0, content...")
    msg: str
    type: str | None


class Invalid(Problem):
    """A request that is not valid: ``detail`` in one line, ``errors`` one per field (the
    input is never echoed)."""

    errors: list[FieldError] = Field(default_factory=list)


def _problem(description: str) -> dict[str, Any]:
    return {"model": Problem, "description": description}


#: The error answers of the routes, for the OpenAPI document.
ERRORS: dict[int | str, dict[str, Any]] = {
    400: _problem("The Host header is not in ALLOWED_HOSTS, or the body could not be read"),
    401: _problem("No API key, or an unknown or revoked one"),
    404: _problem("No such session (or another tenant's)"),
    409: _problem("Another turn (or a compaction job) is in progress on the session"),
    413: _problem("Request body over MAX_REQUEST_BYTES"),
    422: {"model": Invalid, "description": "The request is not valid; nothing was written"},
    429: _problem(
        "Too many bytes of request bodies in flight for this API key "
        "(twice MAX_REQUEST_BYTES); retry after Retry-After seconds"
    ),
    502: _problem("The chat model failed; the turn was taken back"),
    503: _problem(
        "No LLM is configured, or too many bytes of request bodies are in flight in this API "
        "process (four times MAX_REQUEST_BYTES; retry after Retry-After seconds)"
    ),
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The entries of :data:`ERRORS` for ``codes``."""
    return {code: ERRORS[code] for code in codes}


#: What every keyed route may answer: a bad Host header, no key.
ANY_ROUTE = errors(400, 401)
#: A read of one session.
READ = errors(400, 401, 404, 422)
#: A write to one session (a body: 413, and 429 or 503 past the bytes in flight; its lock:
#: 409).
WRITE = errors(400, 401, 404, 409, 413, 422, 429, 503)
