"""The ASGI middleware that sees every request before the app does: :class:`BodyLimit` (no
body without a key, no NUL in a query string, the bytes in flight bounded (:class:`InFlight`),
every body within its limits, checked as it arrives by :class:`~.scan.JsonScan`) and
:class:`HostCheck` (``ALLOWED_HOSTS``, its 400 in JSON); :func:`refuse` answers for both
without reading the body.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import Message, Receive, Scope, Send

from .checks import is_json_media, nul_parameter
from .inner import JsonBudget
from .scan import JsonScan, TooMuch

#: How much of a body the streaming check reads before it gives the event loop back.
SLICE_BYTES = 16 * 1024
#: Largest body of a request that needs no key (the web UI's login and logout forms).
FORM_BYTES = 16 * 1024
#: Paths whose body is read without a key (the login form carries the key).
PUBLIC_BODIES = frozenset({"/ui/login", "/ui/logout"})
#: Scope key: the body holds no run of 19 digits, so orjson reads every number exactly.
PLAIN_NUMBERS = "offpath.plain_numbers"
#: Scope key: the :class:`~.inner.JsonBudget` of JSON inside the body's strings.
JSON_BUDGET = "offpath.json_budget"

#: Answers why a request may not send a body (None: it may): the API's key check. Raises
#: :class:`GateUnavailable` when it cannot tell (503 with ``Retry-After``).
Gate = Callable[[dict[str, Any]], Awaitable[str | None]]
#: Names who sends a request (its API key's digest; "" for none): the per-key bounds.
Who = Callable[[dict[str, Any]], str]
#: The bytes of bodies one API process holds at once (being received or handled), in bodies
#: of ``MAX_REQUEST_BYTES``: past it 503; and one API key: past it 429.
IN_FLIGHT_BODIES = 4
IN_FLIGHT_BODIES_PER_KEY = 2
#: ``Retry-After`` (s) of a body refused because too many bytes are in flight.
RETRY_AFTER_S = 1
RETRY_AFTER = {b"retry-after": str(RETRY_AFTER_S).encode()}


class GateUnavailable(Exception):
    """The :data:`Gate` could not tell whether a request may send a body (the store it asks
    did not answer): 503, ``detail`` the message, ``Retry-After`` ``retry_after_s``."""

    def __init__(self, detail: str, retry_after_s: int) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after_s = retry_after_s


class Busy(TooMuch):
    """Too many bytes of bodies are in flight: 503 (this process) or 429 (this key), with
    ``Retry-After``."""


class InFlight:
    """The bytes of request bodies this process holds (being received or handled), in all
    and per key, within ``max_bytes`` and ``max_per_key``. Used on the event loop only."""

    def __init__(self, max_bytes: int, max_per_key: int) -> None:
        self.max_bytes = max_bytes
        self.max_per_key = max_per_key
        self.total = 0
        self.by_key: dict[str, int] = {}

    def take(self, who: str, n: int) -> None:
        """Hold ``n`` more bytes for ``who``; raises :class:`Busy` (nothing held) past a bound."""
        if n <= 0:
            return
        mine = self.by_key.get(who, 0)
        if mine + n > self.max_per_key:
            raise Busy(
                429,
                f"this API key has {mine} bytes of request bodies in flight; at most "
                f"{self.max_per_key} ({IN_FLIGHT_BODIES_PER_KEY} x MAX_REQUEST_BYTES): retry in "
                f"{RETRY_AFTER_S} s",
            )
        if self.total + n > self.max_bytes:
            raise Busy(
                503,
                f"the API holds {self.total} bytes of request bodies; at most {self.max_bytes} "
                f"({IN_FLIGHT_BODIES} x MAX_REQUEST_BYTES): retry in {RETRY_AFTER_S} s",
            )
        self.by_key[who] = mine + n
        self.total += n

    def give(self, who: str, n: int) -> None:
        """Let go of ``n`` bytes ``who`` held."""
        if n <= 0:
            return
        self.total -= n
        left = self.by_key.get(who, 0) - n
        if left > 0:
            self.by_key[who] = left
        else:
            self.by_key.pop(who, None)


class _Hold:
    """The bytes one request holds in :class:`InFlight`, for ``who``."""

    __slots__ = ("who", "bytes")

    def __init__(self, who: str) -> None:
        self.who = who
        self.bytes = 0

    def grow(self, in_flight: InFlight, size: int) -> None:
        """Hold ``size`` bytes in all (the body so far, or its declared size); raises
        :class:`Busy`."""
        if size > self.bytes:
            in_flight.take(self.who, size - self.bytes)
            self.bytes = size


#: The answer to a refused request as a page (an ASGI app: a Starlette ``Response``), for a
#: request's scope and what is wrong; None: answered as JSON.
Page = Callable[[dict[str, Any], str], Any]


class BodyLimit:
    """ASGI middleware: no body without a key, no NUL in a query string, the bytes in flight
    within ``in_flight`` (per process, and per ``who``: the sender's key), and every body
    within its limits (see the module doc); a body that passes is handed on unchanged, and
    its bytes count in flight until the app has answered. ``page``: a NUL in the query of a
    path it answers with a page (the UI's) is refused with that page."""

    def __init__(
        self,
        app: Any,
        max_bytes: int,
        max_depth: int,
        max_values: int = 200_000,
        max_messages: int = 10_000,
        gate: Gate | None = None,
        in_flight: InFlight | None = None,
        who: Who | None = None,
        page: Page | None = None,
    ) -> None:
        self.app = app
        self.page = page
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self.max_values = max_values
        self.max_messages = max_messages
        self.gate = gate
        self.in_flight = in_flight or InFlight(
            IN_FLIGHT_BODIES * max_bytes, IN_FLIGHT_BODIES_PER_KEY * max_bytes
        )
        self.who = who

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
            try:
                refused = await self.gate(scope)
            except GateUnavailable as exc:
                retry = {b"retry-after": str(exc.retry_after_s).encode()}
                await refuse(send, 503, exc.detail, retry)
                return
            if refused is not None:
                await refuse(send, 401, refused, {b"www-authenticate": b"Bearer"})
                return
        if (name := nul_parameter(scope.get("query_string") or b"")) is not None:
            problem = "NUL characters are not accepted (PostgreSQL stores none)"
            shown = self.page(scope, f"{name}: {problem}") if self.page is not None else None
            if shown is not None:  # a page of the UI's: its 422 page
                await shown(scope, receive, send)
                return
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
        size = int(declared) if declared is not None and declared.strip().isdigit() else 0
        if size > limit:
            await refuse(send, 413, self._too_big(limit))
            return
        hold = _Hold(self.who(scope) if self.who is not None else "")
        try:  # the declared size is held before one byte is read; a chunked body as it comes
            hold.grow(self.in_flight, size)
        except Busy as exc:
            await refuse(send, exc.status, exc.detail, RETRY_AFTER)
            return
        try:
            await self._checked(scope, receive, send, limit, headers, public, hold)
        finally:  # the app has answered: the body is gone
            self.in_flight.give(hold.who, hold.bytes)

    async def _checked(
        self,
        scope: dict[str, Any],
        receive: Any,
        send: Any,
        limit: int,
        headers: Headers,
        public: bool,
        hold: _Hold,
    ) -> None:
        """Read the body (held in ``hold`` as it grows past what was declared), check it,
        hand it on."""
        scan = (
            JsonScan(self.max_depth, self.max_values, self.max_messages)
            if not public and is_json_media(headers.get("content-type"))
            else None
        )
        # one buffer, filled as the body arrives (a list of chunks joined at the end held the
        # body twice, and left a heap of freed chunks behind: 4x a 30 MB body)
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
                hold.grow(self.in_flight, size)
                if scan is not None:
                    for at in range(0, len(chunk), SLICE_BYTES):
                        scan.feed(chunk[at : at + SLICE_BYTES])
                        await asyncio.sleep(0)  # the event loop serves others meanwhile
                body += chunk
                if not message.get("more_body"):
                    break
        except TooMuch as exc:
            await refuse(
                send, exc.status, exc.detail, RETRY_AFTER if isinstance(exc, Busy) else None
            )
            return
        if scan is not None:
            if not scan.long_digits:
                scope[PLAIN_NUMBERS] = True  # orjson reads this body exactly (OffLoopBody)
            # what JSON inside the body's strings may still hold (api.limits.inner)
            scope[JSON_BUDGET] = JsonBudget(
                self.max_depth, self.max_values, self.max_values - scan.values
            )

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


class HostCheck:
    """ASGI middleware: requests whose ``Host`` is not one of ``allowed_hosts`` (``*``: any;
    ``*.example.com``: its subdomains) get 400 ``{"detail": ...}`` (against DNS rebinding).
    The check is Starlette's :class:`TrustedHostMiddleware`; only its plain-text answer is
    replaced."""

    DETAIL = "Host header not allowed (ALLOWED_HOSTS)"

    def __init__(self, app: Any, allowed_hosts: list[str]) -> None:
        self.app = app
        self.check = TrustedHostMiddleware(self._allowed, allowed_hosts=allowed_hosts)

    async def _allowed(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["offpath.host_allowed"] = True
        await self.app(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.check(scope, receive, send)
            return

        replaced = False

        async def answer(message: Message) -> None:
            nonlocal replaced
            if scope.get("offpath.host_allowed"):
                await send(message)  # the app's own answer
            elif message["type"] == "http.response.start" and message["status"] == 400:
                replaced = True  # the refusal: ours instead of its plain text
                await refuse(send, 400, self.DETAIL)
            elif not replaced:
                await send(message)  # a www. redirect

        await self.check(scope, receive, answer)
