"""A model call the provider refuses as over its context length: recognised
(:func:`context_refusal`), then retried once, smaller (:class:`Refusals`); a second
refusal ends the run with :class:`ContextRefused`.

A refusal says the model takes less than the thresholds let through (a threshold above the
model's window, a tokenizer that counts more tokens per char than ``CHARS_PER_TOKEN``). It
is a compaction trigger, not the end of the run: the retry applies the compaction the worker
prepared for the thread (under the threshold too), else shortens older messages in the
thread (originals archived, DESIGN.md invariants 12 and 13) and masks what is still over for
that call only, down to the prepare floor, or lower when the provider named its limit, and
always under what was refused. Only that one retry is made.

LangChain's integrations raise :class:`langchain_core.exceptions.ContextOverflowError` for
the shapes they know (``langchain_openai``: OpenAI's ``context_length_exceeded``, Anthropic's
``prompt is too long`` through an OpenAI-compatible endpoint); the raw shapes of providers
and servers that do not convert are recognised too, by status, error code and wording.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from langchain.agents.middleware.types import ModelRequest
from langchain_core.exceptions import ContextOverflowError
from langchain_core.messages import BaseMessage

from offpath.agent.middleware.applying import ARCHIVE_WAIT_S, Applying
from offpath.agent.middleware.claims import Claims
from offpath.agent.middleware.counting import ThreadSettings
from offpath.agent.middleware.pools import Background
from offpath.agent.middleware.reports import log
from offpath.agent.middleware.shaping import Shaping
from offpath.agent.middleware.state import (
    Call,
    Write,
    diff,
    outside_chars,
    sending,
    thread_of,
)
from offpath.compaction.accounting import message_chars
from offpath.compaction.patch import patched
from offpath.compaction.planner import request_cap_chars
from offpath.compaction.settings import Settings
from offpath.compaction.shorten import MIN_OLDER_CHARS, older_caps
from offpath.compaction.tracking import KEY, ThreadSize, mask_observations
from offpath.coordination.logs import tag
from offpath.stores.leases.claims import State

#: HTTP statuses a context-length refusal comes with (400 from most, 413 from some gateways,
#: 422 from input validators). A 429 that talks of tokens is a rate limit, never a refusal.
REFUSAL_STATUSES = frozenset({400, 413, 422})
#: Error codes and types of a refusal (OpenAI and OpenAI-compatible servers; llama.cpp).
REFUSAL_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
#: Wordings of a refusal, lower case: OpenAI and vLLM, Anthropic, OpenAI's Responses API,
#: LiteLLM, Bedrock, Gemini, llama.cpp, Groq.
REFUSAL_PHRASES = (
    "context_length_exceeded",
    "maximum context length",
    "prompt is too long",
    "input is too long",
    "exceeds the context window",
    "contextwindowexceedederror",
    "input tokens exceed the configured limit",
    "exceeds the maximum number of tokens allowed",
    "exceeds the available context size",
    "too many input tokens",
    "reduce the length of the messages",
)
#: The sizes a refusal names: (pattern, which group is the limit, which what was sent).
_SIZES = (
    # OpenAI, vLLM: "maximum context length is 8192 tokens. However, your messages resulted
    # in 9000 tokens" / "you requested 9000 tokens (8000 in the messages, ...)"
    (
        re.compile(
            r"maximum context length is ([\d,]+) tokens.{0,80}?(?:resulted in|requested) "
            r"([\d,]+) tokens",
            re.I | re.S,
        ),
        1,
        2,
    ),
    # Anthropic: "prompt is too long: 210000 tokens > 200000 maximum"
    (re.compile(r"([\d,]+) tokens > ([\d,]+) maximum", re.I), 2, 1),
    # Gemini: "The input token count (1200000) exceeds the maximum number of tokens allowed
    # (1048576)"
    (
        re.compile(
            r"input token count \(([\d,]+)\) exceeds the maximum number of tokens allowed "
            r"\(([\d,]+)\)",
            re.I,
        ),
        2,
        1,
    ),
    # llama.cpp: "request (9000 tokens) exceeds the available context size (8192 tokens)"
    (
        re.compile(
            r"\(([\d,]+) tokens\) exceeds the available context size \(([\d,]+) tokens\)", re.I
        ),
        2,
        1,
    ),
)
#: The retry aims this share under the size the provider's numbers allow (its tokens are
#: not ours: chars per token vary along a thread).
REFUSAL_MARGIN = 0.85
#: With no numbers to go by and a refused call already under the prepare floor, the retry
#: sends at most this share of what was refused.
UNKNOWN_SHRINK = 0.75


class ContextRefused(ContextOverflowError):
    """The model refused a call as over its context length, and refused it again once
    offpath had made it smaller; the message gives both sizes (chars), the provider's words
    and what was tried. Also raised when nothing could be made smaller after the first."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A context-length refusal: the provider's words (at most 300 chars) and, when they name
    them, its limit and what it counted in the refused call, in its tokens."""

    words: str
    limit_tokens: int | None = None
    sent_tokens: int | None = None

    def allowed(self, sent_chars: int) -> int | None:
        """The chars a retry of a call of ``sent_chars`` may send, from the provider's
        numbers (:data:`REFUSAL_MARGIN` under them); None when it named none."""
        if not self.limit_tokens or not self.sent_tokens or self.sent_tokens <= 0:
            return None
        return int(sent_chars * self.limit_tokens / self.sent_tokens * REFUSAL_MARGIN)


def context_refusal(exc: BaseException) -> Refusal | None:
    """The refusal ``exc`` reports (it, or an exception it was raised from), or None when it
    is another error: a :class:`~langchain_core.exceptions.ContextOverflowError`, or an
    error with a status of :data:`REFUSAL_STATUSES` (or none) whose code is one of
    :data:`REFUSAL_CODES` or whose text has one of :data:`REFUSAL_PHRASES`."""
    for e in _chain(exc):
        text = _text(e)
        status = _status(e)
        known = isinstance(e, ContextOverflowError)
        if not known and status is not None and status not in REFUSAL_STATUSES:
            continue
        lowered = text.lower()
        if known or _codes(e) & REFUSAL_CODES or any(p in lowered for p in REFUSAL_PHRASES):
            limit = sent = None
            for pattern, at_limit, at_sent in _SIZES:
                if m := pattern.search(text):
                    limit = int(m.group(at_limit).replace(",", ""))
                    sent = int(m.group(at_sent).replace(",", ""))
                    break
            return Refusal(" ".join(str(e).split())[:300], limit, sent)
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during, each once."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo and len(seen) < 16:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__]


def _status(e: BaseException) -> int | None:
    response = getattr(e, "response", None)
    for status in (getattr(e, "status_code", None), getattr(response, "status_code", None)):
        if isinstance(status, int):
            return status
    return None


def _body(e: BaseException) -> Any:
    body = getattr(e, "body", None)
    if body is None and (response := getattr(e, "response", None)) is not None:
        try:  # httpx.HTTPStatusError and the like: the response's JSON, if it was read
            body = response.json()
        except Exception:
            body = None
    return body


def _text(e: BaseException) -> str:
    body = _body(e)
    extra = json.dumps(body, default=str)[:10_000] if body is not None else ""
    return f"{e} {getattr(e, 'message', '')} {extra}"


def _codes(e: BaseException) -> set[str]:
    """The error's ``code`` and ``type``, as the exception and its body give them."""
    found = {getattr(e, "code", None), getattr(e, "type", None)}
    body = _body(e)
    error = body.get("error") if isinstance(body, dict) else None
    for part in (body, error):
        if isinstance(part, dict):
            found |= {part.get("code"), part.get("type")}
    return {str(c).lower() for c in found if isinstance(c, str | int)}


class Refusals:
    """The answer to a model call the provider refused as over its context length: the call
    made smaller and retried once.

    Requires: the settings in force, the claims (the thread's, read now), the applying (the
    prepared compaction applied), the shaping (older results shortened, the call shaped,
    maskings counted) and the background threads. Provides: :meth:`retry`,
    :meth:`aretry`."""

    def __init__(
        self,
        settings: ThreadSettings,
        claims: Claims,
        applying: Applying,
        shaping: Shaping,
        background: Background,
    ) -> None:
        self.settings = settings
        self.claims = claims
        self.applying = applying
        self.shaping = shaping
        self.background = background

    def retry(
        self, request: ModelRequest, call: Call, handler: Any, exc: Exception
    ) -> tuple[Call, Any]:
        """``(the retried call, its answer)`` after the model refused ``call`` with ``exc``
        (``request``: the call as the agent made it). Raises ``exc`` when it is not a
        context-length refusal (or the thread is not offpath's to shrink), the retry's own
        error when that is not one, and :class:`ContextRefused` on a second refusal."""
        refusal = self._refusal_of(call, exc)
        retry, tried = self._shrunk(request, call, refusal, exc)
        try:
            return retry, handler(retry.request)
        except Exception as again:
            if context_refusal(again) is None:
                raise
            raise self._refused_twice(call, retry, refusal, tried, again) from again

    async def aretry(
        self, request: ModelRequest, call: Call, handler: Any, exc: Exception
    ) -> tuple[Call, Any]:
        """:meth:`retry` for ``awrap_model_call`` (the reads and the shortening on a
        worker thread)."""
        refusal = self._refusal_of(call, exc)
        retry, tried = await asyncio.to_thread(self._shrunk, request, call, refusal, exc)
        try:
            return retry, await handler(retry.request)
        except Exception as again:
            if context_refusal(again) is None:
                raise
            raise self._refused_twice(call, retry, refusal, tried, again) from again

    def _refusal_of(self, call: Call, exc: Exception) -> Refusal:
        refusal = context_refusal(exc)
        if refusal is None or call.session_id is None or not self.settings.current.active:
            raise exc
        return refusal

    def _shrunk(
        self, request: ModelRequest, call: Call, refusal: Refusal, exc: Exception
    ) -> tuple[Call, list[str]]:
        """The retry of a refused ``call``, and what was done to make it smaller: the prepared
        compaction applied (unless the call applied one), older messages shortened in the
        thread (originals archived while the model answers, after the refused call's own
        writes), then what is still over masked for this call; under the prepare floor, or
        the provider's named limit, and under what was refused. Raises
        :class:`ContextRefused` (from ``exc``) when it cannot be made smaller."""
        s = self.settings.current
        session_id = str(call.session_id)
        original, overlay = thread_of(request)  # the state's messages (see Turn.overlay)
        messages = original
        if call.update.get("messages"):
            messages = patched(original, call.update["messages"])
        private = dict(call.update[KEY])
        out = outside_chars(request)
        refused = _sent_chars(call.request)
        target = s.prepare_floor_chars
        if (allowed := refusal.allowed(refused)) is not None:
            target = min(target, allowed)
        if target >= refused:
            target = int(refused * UNKNOWN_SHRINK)
        chars = sum(message_chars(m) for m in messages)
        writes: list[Write] = []
        tried: list[str] = []
        if not private.get("pending"):
            holder = self.claims.now(session_id)
            if holder is not None and holder.state is State.PREPARED:
                before = messages
                messages, chars = self.applying.apply_now(
                    session_id, holder, messages, private, chars, out, writes
                )
                if messages is not before:
                    tried.append(
                        f"applied the compaction the worker prepared (job {holder.job_id})"
                    )
        if chars + out > target:
            caps = older_caps(
                messages,
                s.summarization_keep_chars,
                chars + out - target,
                request_floor=request_cap_chars(s),
            )
            why = "after the model refused the call as too long"
            shortened = self.shaping.shorten(
                session_id, messages, caps, why, MIN_OLDER_CHARS, writes
            )
            if shortened is not messages:
                n = sum(a is not b for a, b in zip(messages, shortened, strict=True))
                tried.append(f"shortened {n} older message(s) in the thread (originals archived)")
                messages = shortened
        size = ThreadSize().advance(messages)
        private["size"] = size.to_state()
        if overlay is not None:  # the call's copy, with the edits made before offpath
            over = overlay.over(messages, original)
            size = ThreadSize().advance(over)  # sized as sent, its orphans too
            shaped = self.shaping.shape(request, over, size, session_id)
        else:
            shaped = self.shaping.shape(request, messages, size, session_id)
        sent: list[BaseMessage] = list(shaped.messages)
        if _sent_chars(shaped) > target:
            sent, masking = mask_observations(sent, max(0, target - out))
            if hid := masking.results + masking.messages:
                tried.append(
                    f"masked {masking.results} tool result(s) and {masking.messages} AI "
                    "message(s) for this call"
                )
                self.background.write(self.shaping.count_masking, session_id, hid, masking.chars)
                shaped = sending(shaped, sent)
        retried = _sent_chars(shaped)
        if retried >= refused:
            raise ContextRefused(
                f"the model refused a call of {refused:,} chars as over its context length "
                f"({refusal.words}), and offpath could make it no smaller (the request, the "
                f"latest step and the system prompt are what is left); {_advice(s)}"
            ) from exc
        log.warning(
            "[%s] the model refused a call of %s chars as over its context length (%s): "
            "retrying once at %s chars, after offpath %s; %s",
            tag(session_id),
            f"{refused:,}",
            refusal.words,
            f"{retried:,}",
            "; ".join(tried) or "changed nothing",
            _advice(s),
        )
        update: dict[str, Any] = {KEY: private}
        if messages is not original:
            update["messages"] = diff(original, messages)
        first = call.stored  # the refused call's archive writes go first
        if first is not None and writes:
            writes.insert(0, (None, partial(first.result, timeout=ARCHIVE_WAIT_S)))
        stored = self.applying.store(writes) if writes else first
        retry = Call(shaped, update, size.chars, session_id, stored, call.size_before)
        return retry, tried

    def _refused_twice(
        self, call: Call, retry: Call, refusal: Refusal, tried: list[str], again: Exception
    ) -> ContextRefused:
        second = context_refusal(again)
        return ContextRefused(
            f"the model refused this call as over its context length twice: at "
            f"{_sent_chars(call.request):,} chars ({refusal.words}), and again at "
            f"{_sent_chars(retry.request):,} chars, after offpath "
            f"{'; '.join(tried) or 'changed nothing'}: "
            f"{second.words if second else again}; {_advice(self.settings.current)}"
        )


def _sent_chars(request: ModelRequest) -> int:
    """What a model call sends, in chars: its messages and its system prompt."""
    return sum(message_chars(m) for m in request.messages) + outside_chars(request)


def _advice(settings: Settings) -> str:
    return (
        f"the model takes less than SUMMARIZATION_THRESHOLD_CHARS "
        f"({settings.summarization_threshold_chars:,}) lets through: set the threshold under "
        "its context window (or SUMMARIZATION_THRESHOLD_TOKENS with CHARS_PER_TOKEN)"
    )
