"""Every byte a client sends counts (DESIGN.md invariant 8; issue 10, item 2; issue 20).

* :class:`BodyLimit`, an ASGI middleware, sees every request before the app does:

  - a request with a body and no valid API key is refused (401) before one byte of the
    body is read (issue 20, item 1: the body of an unauthenticated request was parsed
    first), except the web UI's login form (a few KiB at most);
  - a query string with a NUL character is refused (422 naming the parameter: PostgreSQL
    stores no NUL, issue 20, item 4);
  - the body is checked in one streaming pass as it arrives (:class:`JsonScan`): over
    ``MAX_REQUEST_BYTES`` 413, nested deeper than ``MAX_JSON_DEPTH``, more values than
    ``MAX_JSON_VALUES`` or more ``messages`` than ``MAX_TURN_MESSAGES`` 422, each before
    anything is parsed; memory is the body itself plus a few bytes per nesting level, and
    the pass gives the event loop back every :data:`SLICE_BYTES`.

* :class:`OffLoopBody`, the routes' class: a JSON body is parsed (by orjson, from the
  bytes, when its numbers are plain) and validated (a turn one message at a time) in a
  worker thread, in calls short enough that the event loop goes on serving (``/healthz``
  answers meanwhile; ``offpath_api_event_loop_lag_seconds`` shows how late it wakes).
* :func:`unstorable`: values a JSON parser returns but no store keeps (NUL, a lone surrogate
  from the escape ``"\\ud800"``, an integer beyond 64 bits, NaN): refused with 422 naming
  the field.
* :func:`short`: what an error may quote of the input (422 answers never echo it).
* :class:`HostCheck`: Starlette's ``Host`` check (``ALLOWED_HOSTS``), whose 400 is JSON
  like every other error answer.
"""

from __future__ import annotations

import asyncio
import email.message
import json
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl

import orjson
from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import Response

#: How much of a body the streaming check reads before it gives the event loop back.
SLICE_BYTES = 16 * 1024
#: Largest body of a request that needs no key (the web UI's login and logout forms).
FORM_BYTES = 16 * 1024
#: Paths whose body is read without a key (the login form carries the key).
PUBLIC_BODIES = frozenset({"/ui/login", "/ui/logout"})
#: Scope key: the body holds no run of 19 digits, so orjson reads every number exactly.
PLAIN_NUMBERS = "offpath.plain_numbers"
#: How many bytes of an object key the streaming check keeps (to name a field).
KEY_BYTES = 128


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


# --- the streaming check ------------------------------------------------------------------------

#: A token: a whole string (its closing quote in group 1: absent when the chunk ends inside
#: it) or a structural char. Numbers, true, false, null and spaces are skipped in C.
#: Possessive: the regex engine keeps no state per char of a string (the old pattern cost
#: ~115 bytes of memory per char).
_TOKEN = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+(")?|[\[\]{},:]', re.DOTALL)
#: An integer orjson would read as a float (beyond 64 bits): the standard parser reads it.
_LONG_DIGITS = re.compile(rb"\d{19}")
#: The rest of a string that began in an earlier chunk, up to its closing quote.
_STRING_REST = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+', re.DOTALL)


class _Open:
    """An array or object the scan is inside: its items so far (counted at each comma, and
    at its end for one of a single item), whether anything but spaces came after its
    opening bracket, and (an object) the key of the member it is in."""

    __slots__ = ("is_object", "items", "seen", "key", "want_key")

    def __init__(self, is_object: bool) -> None:
        self.is_object = is_object
        self.items = 0
        self.seen = False
        self.key: str | None = None
        self.want_key = is_object


class TooMuch(Exception):
    """A body over one of the limits: ``status`` (413 or 422) and ``detail`` (one line that
    names the field and the setting)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class JsonScan:
    """One pass over a JSON body's bytes as they arrive, chunk by chunk (:meth:`feed`):
    raises :class:`TooMuch` as soon as the body is over a limit, before anything is parsed.

    * nesting deeper than ``max_depth`` arrays and objects (a parser would recurse into it);
    * more than ``max_values`` values in all (array items and object members, at any
      depth): each costs a Python object, a validation and an error line (issue 20, item 2:
      a 2 MB list of a million items cost 1.6 GB and 43 s);
    * more than ``max_messages`` items in the top-level ``messages`` array (``/turns``).

    It reads structure only (brackets, commas, where strings start and end, keys), with one
    regular expression that skips strings, numbers and spaces in C: the JSON is not
    validated, which the parser does afterwards. Memory: a few bytes per open array or
    object. A raw NUL byte (no JSON text holds one: UTF-16 or UTF-32, which the scan could
    not read) is refused too.
    """

    def __init__(self, max_depth: int, max_values: int, max_messages: int) -> None:
        self.max_depth = max_depth
        self.max_values = max_values
        self.max_messages = max_messages
        self.stack: list[_Open] = []
        self.values = 0
        self.in_string = False
        self.escaped = False  # a chunk ended inside a string's escape (a backslash)
        self.key: bytearray | None = None  # the key being read (its first KEY_BYTES)
        #: 19 digits in a row somewhere (a number orjson would not read exactly, or text)
        self.long_digits = False
        self._tail = b""  # the last bytes of the previous chunk (digits across chunks)

    def feed(self, data: bytes) -> None:
        """Scan the next ``data`` of the body; raises :class:`TooMuch`."""
        if b"\x00" in data:
            raise TooMuch(422, "body: not UTF-8 JSON (it holds a NUL byte)")
        if not self.long_digits:
            self.long_digits = bool(_LONG_DIGITS.search(self._tail + data[:32]))
            self.long_digits = self.long_digits or bool(_LONG_DIGITS.search(data))
            self._tail = (self._tail + data[-18:])[-18:]
        pos = self._string(data) if self.in_string else 0
        stack = self.stack
        top = stack[-1] if stack else None
        for m in _TOKEN.finditer(data, pos):
            at, end = m.span()
            c = data[at]
            if top is not None and not top.seen:
                # its first item: a string or bracket here, or a number or literal before
                top.seen = c == 0x22 or c == 0x5B or c == 0x7B or bool(data[pos:at].strip())
            pos = end
            if c == 0x22:  # a string
                closed = m.end(1) >= 0
                if top is not None and top.want_key:
                    key = data[at + 1 : min(end - closed, at + 1 + KEY_BYTES)]
                    if closed:
                        top.key, top.want_key = _key_text(key), False
                    else:
                        self.key = bytearray(key)
                if not closed:  # it goes on in the next chunk
                    self.in_string = True
                    # a backslash left over at the end escapes the next chunk's first char
                    self.escaped = end < len(data)
                    if self.escaped and self.key is not None:
                        self.key += b"\\"
            elif c == 0x2C:  # ,
                if top is not None:
                    top.items = (top.items or 1) + 1
                    self._count(top, 2 if top.items == 2 else 1)
                    top.want_key = top.is_object
            elif c == 0x3A:  # :
                if top is not None:
                    top.want_key = False
            elif c == 0x5D or c == 0x7D:  # ] }
                if top is not None:
                    if not top.items and top.seen:  # a single item
                        top.items = 1
                        self._count(top, 1)
                    stack.pop()
                    top = stack[-1] if stack else None
            else:  # [ {
                if len(stack) >= self.max_depth:
                    raise TooMuch(
                        422,
                        f"{self.path()}: nested deeper than {self.max_depth} levels "
                        "(MAX_JSON_DEPTH)",
                    )
                top = _Open(c == 0x7B)
                stack.append(top)
        if top is not None and not top.seen and not self.in_string:
            top.seen = bool(data[pos:].strip())

    def _string(self, data: bytes) -> int:
        """Skip the rest of a string that began in an earlier chunk; returns where the scan
        goes on (``len(data)``: the string goes on in the next chunk too)."""
        pos = 0
        if self.escaped:
            self.escaped = False
            pos = 1  # the escaped char
        quote = data.find(b'"', pos)
        stop = quote if quote >= 0 else len(data)
        if data.find(b"\\", pos, stop) >= 0:  # an escape before it: the regex, in C
            stop = _STRING_REST.match(data, pos).end()  # type: ignore[union-attr]
        if self.key is not None and len(self.key) < KEY_BYTES:
            self.key += data[: min(stop, KEY_BYTES)]
        if stop >= len(data):
            return len(data)
        if data[stop] == 0x5C:  # a backslash ends the chunk: its char is in the next one
            self.escaped = True
            if self.key is not None and len(self.key) < KEY_BYTES:
                self.key += b"\\"
            return len(data)
        self.in_string = False  # data[stop] is the closing quote
        if self.key is not None:
            self.stack[-1].key, self.stack[-1].want_key = _key_text(bytes(self.key)), False
            self.key = None
        return stop + 1

    def _count(self, top: _Open, n: int) -> None:
        self.values += n
        if self.values > self.max_values:
            raise TooMuch(422, f"body: more than {self.max_values} JSON values (MAX_JSON_VALUES)")
        if (
            top.items > self.max_messages
            and len(self.stack) == 2
            and top is self.stack[1]
            and not top.is_object
            and self.stack[0].is_object
            and self.stack[0].key == "messages"
        ):
            raise TooMuch(
                422,
                f"messages: more than {self.max_messages} messages in one turn (MAX_TURN_MESSAGES)",
            )

    def path(self) -> str:
        """Where the scan is, as the 422 answers name fields: ``messages[3].content`` (at
        most 120 chars: the start of a deep path names the field)."""
        out = ""
        for level in self.stack:
            if level.is_object:
                out += f".{short(level.key or '?', 40)}"
            else:
                out += f"[{max(0, level.items - 1)}]"
            if len(out) > 120:
                return out.lstrip(".")[:120] + "..."
        return out.lstrip(".") or "body"


def _key_text(raw: bytes) -> str:
    """An object key as the parser will read it (escapes decoded: ``"mess\\u0061ges"`` is
    ``messages``), or its raw text if it does not decode."""
    if b"\\" in raw:
        try:
            return str(json.loads(b'"' + raw + b'"'))
        except ValueError:
            pass
    return raw.decode("utf-8", "replace")


# --- values no store keeps -----------------------------------------------------------------------

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


# --- the middleware --------------------------------------------------------------------------------

#: Answers why a request may not send a body (None: it may): the API's key check.
Gate = Callable[[dict[str, Any]], Awaitable[str | None]]


class BodyLimit:
    """ASGI middleware: no body without a key, no NUL in a query string, and every body
    within its limits (see the module doc); a body that passes is handed on unchanged."""

    def __init__(
        self,
        app: Any,
        max_bytes: int,
        max_depth: int,
        max_values: int = 200_000,
        max_messages: int = 10_000,
        gate: Gate | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self.max_values = max_values
        self.max_messages = max_messages
        self.gate = gate

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)  # the first of a repeated header, as Starlette reads it
        declared = headers.get("content-length")
        has_body = (declared is not None and declared.strip() not in ("", "0")) or (
            "transfer-encoding" in headers
        )
        public = scope["path"] in PUBLIC_BODIES
        if has_body and not public and self.gate is not None:
            if (refused := await self.gate(scope)) is not None:
                await refuse(send, 401, refused, {b"www-authenticate": b"Bearer"})
                return
        if (name := nul_parameter(scope.get("query_string") or b"")) is not None:
            problem = "NUL characters are not accepted (PostgreSQL stores none)"
            await refuse(
                send,
                422,
                f"{name}: {problem}",
                errors=[{"loc": ["query", name], "msg": problem, "type": "value_error"}],
            )
            return
        if not has_body:
            await self.app(scope, receive, send)
            return
        limit = FORM_BYTES if public else self.max_bytes
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            await refuse(send, 413, self._too_big(limit))
            return
        scan = (
            JsonScan(self.max_depth, self.max_values, self.max_messages)
            if not public and is_json_media(headers.get("content-type"))
            else None
        )
        # one buffer, filled as the body arrives (a list of chunks joined at the end held the
        # body twice, and left a heap of freed chunks behind: 4x a 30 MB body, issue 20)
        body: bytearray | None = bytearray()
        size = 0
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise TooMuch(413, self._too_big(limit))
                if scan is not None:
                    for at in range(0, len(chunk), SLICE_BYTES):
                        scan.feed(chunk[at : at + SLICE_BYTES])
                        await asyncio.sleep(0)  # the event loop serves others meanwhile
                body += chunk
                if not message.get("more_body"):
                    break
        except TooMuch as exc:
            await refuse(send, exc.status, exc.detail)
            return
        if scan is not None and not scan.long_digits:
            scope[PLAIN_NUMBERS] = True  # orjson reads this body exactly (OffLoopBody)

        async def replay() -> dict[str, Any]:
            nonlocal body
            if body is None:
                return await receive()
            # the buffer itself (no copy; Starlette and OffLoopBody take bytes-like bodies)
            message = {"type": "http.request", "body": body, "more_body": False}
            body = None  # the app holds it now: not kept twice
            return message

        await self.app(scope, replay, send)

    def _too_big(self, limit: int) -> str:
        if limit == FORM_BYTES:
            return f"request body over {limit} bytes (a login form)"
        return f"request body over {limit} bytes (MAX_REQUEST_BYTES)"


async def refuse(
    send: Any,
    status: int,
    detail: str,
    headers: dict[bytes, bytes] | None = None,
    errors: list[dict[str, Any]] | None = None,
) -> None:
    """Answer ``{"detail": ...}`` (with ``errors`` for a 422) without reading the body."""
    content: dict[str, Any] = {"detail": detail}
    if errors is not None:
        content["errors"] = errors
    payload = json.dumps(content).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *(headers or {}).items(),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


# --- JSON bodies off the event loop ----------------------------------------------------------------


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


def _parse_and_validate(route: APIRoute, body: bytes, plain_numbers: bool) -> Any:
    """``body`` parsed and validated against the route's body model, in a worker thread;
    raises what FastAPI would. A model with ``validate_in_steps`` (a list of many items) is
    validated item by item: one validation of a 10,000-message turn held the GIL, and so
    the event loop, for ~200 ms."""
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
    if hasattr(model, "validate_in_steps"):
        value, errors = model.validate_in_steps(parsed)
    else:
        value, errors = route.body_field.validate(parsed, {}, loc=("body",))
    if errors:
        raise RequestValidationError(errors)
    return value


async def _caller_first(request: Request) -> None:
    """Raise the caller's 401 or 403 (no key, the UI's cookie without its header), which
    FastAPI's dependencies answer before a body's 422: a refused body says nothing to a
    caller who may not send it."""
    from .deps import bearer, principal

    credentials = await bearer(request)
    await run_in_threadpool(principal, request, credentials)


class OffLoopBody(APIRoute):
    """A route whose JSON body is parsed and validated in a worker thread (issue 20, item 1):
    on the event loop, a 30 MB body took 150 ms to parse and a 10,000-message turn 200-400
    ms to validate, during which no other request (``/healthz`` either) was answered. The
    answers are FastAPI's own (422 with the errors, 400 for a body that is not text)."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
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
                    try:
                        value = await run_in_threadpool(_parse_and_validate, self, body, plain)
                    except RequestValidationError:
                        await _caller_first(request)
                        raise
                    del body
                    request = _Parsed(request, value)
                else:
                    request = _Parsed(request, None, has_body=False)
            return await handler(request)

        return off_loop


# --- Host ------------------------------------------------------------------------------------------


class HostCheck:
    """ASGI middleware: requests whose ``Host`` is not one of ``allowed_hosts`` (``*``: any;
    ``*.example.com``: its subdomains) get 400 ``{"detail": ...}`` (against DNS rebinding).
    The check is Starlette's :class:`TrustedHostMiddleware`; only its plain-text answer is
    replaced."""

    DETAIL = "Host header not allowed (ALLOWED_HOSTS)"

    def __init__(self, app: Any, allowed_hosts: list[str]) -> None:
        self.app = app
        self.check = TrustedHostMiddleware(self._allowed, allowed_hosts=allowed_hosts)

    async def _allowed(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope["offpath.host_allowed"] = True
        await self.app(scope, receive, send)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.check(scope, receive, send)
            return

        replaced = False

        async def answer(message: dict[str, Any]) -> None:
            nonlocal replaced
            if scope.get("offpath.host_allowed"):
                await send(message)  # the app's own answer
            elif message["type"] == "http.response.start" and message["status"] == 400:
                replaced = True  # the refusal: ours instead of its plain text
                await refuse(send, 400, self.DETAIL)
            elif not replaced:
                await send(message)  # a www. redirect

        await self.check(scope, receive, answer)
