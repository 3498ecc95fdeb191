"""Every byte a client sends counts (DESIGN.md invariant 8; issue 10, item 2).

* :class:`BodyLimit`, an ASGI middleware: a request body over ``MAX_REQUEST_BYTES``
  is refused with 413 before it is parsed (by its ``Content-Length``, or while it
  streams in), and one nested deeper than ``MAX_JSON_DEPTH`` with 422, before a
  parser recurses into it.
* :func:`lone_surrogate`: the JSON escape ``"\\ud800"`` parses into a string no
  store can hold (it was stored as ``?``, or answered 500): refused with 422
  naming the field.
* :func:`short`: what an error may quote of the input (422 answers never echo it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

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


def lone_surrogate(value: Any, path: str = "body") -> str | None:
    """The path of the first string (or key) in ``value`` holding a lone UTF-16 surrogate."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, Mapping):
        for k, v in value.items():
            if (found := lone_surrogate(k, f"{path} key")) or (
                found := lone_surrogate(v, f"{path}.{k}")
            ):
                return found
        return None
    if isinstance(value, list):
        for i, v in enumerate(value):
            if found := lone_surrogate(v, f"{path}[{i}]"):
                return found
    return None


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
