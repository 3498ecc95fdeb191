"""Every byte a client sends counts (DESIGN.md invariant 8; issue 10, item 2).

* :class:`BodyLimit`, an ASGI middleware: a request body over ``MAX_REQUEST_BYTES``
  is refused with 413 before it is parsed (by its ``Content-Length``, or while it
  streams in), and one nested deeper than ``MAX_JSON_DEPTH`` with 422, before a
  parser recurses into it.
* :func:`unstorable`: values a JSON parser returns but no store keeps (a lone
  surrogate from the escape ``"\\ud800"``, an integer beyond 64 bits, NaN): refused
  with 422 naming the field.
* :func:`short`: what an error may quote of the input (422 answers never echo it).
* :class:`HostCheck`: Starlette's ``Host`` check (``ALLOWED_HOSTS``), whose 400 is JSON
  like every other error answer.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from starlette.middleware.trustedhost import TrustedHostMiddleware

#: Brackets, and JSON strings (skipped whole: a bracket inside one is text).
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def json_depth(body: bytes) -> int:
    """How deeply the arrays and objects of a JSON ``body`` nest (0 for a scalar)."""
    if body.count(b"[") + body.count(b"{") < 2:
        return body.count(b"[") + body.count(b"{")
    depth = deepest = 0
    for m in _TOKENS.finditer(body):
        token = m.group()
        if token in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in (b"]", b"}"):
            depth -= 1
    return deepest


#: Integers the stores hold exactly (orjson and msgpack: 64 bits, signed or unsigned).
INT_MIN, INT_MAX = -(2**63), 2**64 - 1


def _problem_of(value: Any) -> str | None:
    """What makes a scalar unstorable, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
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
    store keeps as sent: a string (or key) with a lone UTF-16 surrogate (``"\\ud800"``: it
    was stored as ``?``, or answered 500), an integer beyond 64 bits (the checkpoint
    serializers refuse it), NaN or Infinity (no JSON answer can hold it); None if all is
    well."""
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


def short(value: Any, limit: int = 80) -> str:
    """At most ``limit`` chars of ``value``, for an error message."""
    text = value if isinstance(value, str) else repr(value)
    text = text.encode("utf-8", "replace").decode()
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


class BodyLimit:
    """ASGI middleware: 413 for a body over ``max_bytes``, 422 for JSON nested deeper than
    ``max_depth``; the body is read once and handed on unchanged."""

    def __init__(self, app: Any, max_bytes: int, max_depth: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_depth = max_depth

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, 413, self._too_big())
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send, 413, self._too_big())
                return
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        if b"json" in headers.get(b"content-type", b"") and json_depth(body) > self.max_depth:
            detail = f"body: nested deeper than {self.max_depth} levels (MAX_JSON_DEPTH)"
            await self._refuse(send, 422, detail)
            return
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def _too_big(self) -> str:
        return f"request body over {self.max_bytes} bytes (MAX_REQUEST_BYTES)"

    @staticmethod
    async def _refuse(send: Any, status: int, detail: str) -> None:
        payload = json.dumps({"detail": detail}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
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
                await BodyLimit._refuse(send, 400, self.DETAIL)
            elif not replaced:
                await send(message)  # a www. redirect

        await self.check(scope, receive, answer)
