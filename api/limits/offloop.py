"""JSON bodies off the event loop: :class:`OffLoopBody`, the routes' class, parses a JSON
body (by orjson, from the bytes, when its numbers are plain) and validates it (a turn one
message at a time) in a worker thread; the answers are FastAPI's own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from .checks import is_json_media
from .inner import JsonBudget
from .middleware import JSON_BUDGET, PLAIN_NUMBERS


class _Parsed(Request):
    """A request whose JSON body was parsed and validated already: FastAPI's handler reads
    the model from :meth:`json` (a model instance is not validated again)."""

    def __init__(self, request: Request, value: Any, has_body: bool = True) -> None:
        super().__init__(request.scope, request.receive)
        self._value = value
        self._has_body = has_body

    async def body(self) -> bytes:
        # FastAPI only asks whether there is one: the bytes themselves are freed already
        return b"{}" if self._has_body else b""

    async def json(self) -> Any:
        return self._value


def _parse(body: bytes, plain_numbers: bool) -> Any:
    """``body`` parsed: by orjson when its numbers are plain (it reads bytes with no
    decoded copy: a 30 MB string cost 4x its size with the standard parser, whose string
    writer over-allocates), else, or when orjson refuses it (a lone surrogate, NaN, a BOM,
    UTF-16), by the standard library's parser, whose answers (and errors) are FastAPI's."""
    if plain_numbers:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return json.loads(body)


def _parse_and_validate(
    route: APIRoute, body: bytes, plain_numbers: bool, budget: JsonBudget | None = None
) -> Any:
    """``body`` parsed and validated against the route's body model, in a worker thread;
    raises what FastAPI would. A model with ``validate_in_steps`` (a list of many items) is
    validated item by item: one validation of a 10,000-message turn held the GIL, and so
    the event loop, for ~200 ms; ``budget``: what JSON inside the body's strings may still
    hold (:mod:`.inner`; None: the body was not scanned, nothing more may)."""
    try:
        parsed = _parse(body, plain_numbers)
    except json.JSONDecodeError as exc:
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", exc.pos),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": exc.msg},
                }
            ]
        ) from None
    except (ValueError, RecursionError):  # not UTF-8, UTF-16 or UTF-32 text
        raise HTTPException(status_code=400, detail="There was an error parsing the body") from None
    assert route.body_field is not None
    model = route.body_field.field_info.annotation
    if model is not None and hasattr(model, "validate_in_steps"):
        value, errors = model.validate_in_steps(parsed, budget or JsonBudget(0, 0, 0))
    else:
        value, errors = route.body_field.validate(parsed, {}, loc=("body",))
    if errors:
        raise RequestValidationError(errors)
    return value


async def _caller_first(request: Request) -> None:
    """Raise the caller's 401 or 403 (no key, the UI's cookie without its header), which
    FastAPI's dependencies answer before a body's 422: a refused body says nothing to a
    caller who may not send it."""
    from ..deps import bearer, principal

    credentials = await bearer(request)
    await run_in_threadpool(principal, request, credentials)


class OffLoopBody(APIRoute):
    """A route whose JSON body is parsed and validated in a worker thread :
    on the event loop, a 30 MB body takes ~150 ms to parse and a 10,000-message turn
    200-400 ms to validate, during which no other request (``/healthz`` either) is answered. The
    answers are FastAPI's own (422 with the errors, 400 for a body that is not text)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def off_loop(request: Request) -> Response:
            content_type = request.headers.get("content-type")
            if content_type and is_json_media(content_type):
                chunks = [chunk async for chunk in request.stream()]  # not cached
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                del chunks
                if body:
                    plain = bool(request.scope.get(PLAIN_NUMBERS))
                    budget = request.scope.get(JSON_BUDGET)
                    try:
                        value = await run_in_threadpool(
                            _parse_and_validate, self, body, plain, budget
                        )
                    except RequestValidationError:
                        await _caller_first(request)
                        raise
                    del body
                    request = _Parsed(request, value)
                else:
                    request = _Parsed(request, None, has_body=False)
            return await handler(request)

        return off_loop
