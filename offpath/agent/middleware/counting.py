"""A thread's tokens as its model counts them: each thread's chars per token
(:class:`ThreadTokens`), and, when the threshold is in tokens
(``SUMMARIZATION_THRESHOLD_TOKENS``), that thread's settings in force while a hook of the
middleware runs for it (:class:`ThreadSettings`): its threshold, keep window and hard limit in
chars scaled by its own ratio (:func:`offpath.compaction.tokens.for_thread`), so that a
thread of Chinese tool output is compacted at the same number of tokens as an English one.

The sources of the ratio, in order: exact counts (quicktok) for an OpenAI model, the
provider's reported ``input_tokens`` over the thread's own calls for any other, an
``o200k_base`` estimate until that is known, ``CHARS_PER_TOKEN`` without quicktok
(:mod:`offpath.compaction.tokens`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

from langchain.agents.middleware.types import ModelRequest
from langchain_core.messages import BaseMessage

from offpath.agent.middleware.state import Places, private_of
from offpath.compaction.accounting import message_chars
from offpath.compaction.settings import Settings
from offpath.compaction.tokens import (
    DEFAULT_ENCODING,
    Calibration,
    TokenCounter,
    encoder,
    encoding_for,
    for_thread,
)
from offpath.compaction.tracking import ThreadSize

#: The settings of the thread a hook runs for: (the :class:`ThreadSettings`' id, its settings).
_IN_FORCE: ContextVar[tuple[int, Settings] | None] = ContextVar("offpath_in_force", default=None)
#: Most threads whose ratio a middleware remembers (the oldest are forgotten first).
MAX_THREADS = 10_000


@dataclass(frozen=True, slots=True)
class Ratio:
    """A thread's chars per token, and how it was found: ``exact (o200k_base)``,
    ``measured`` (its provider's reports), ``estimated (o200k_base)`` or
    ``CHARS_PER_TOKEN``."""

    chars_per_token: float
    how: str


def model_name(model: Any) -> str | None:
    """The model's name as its LangChain class holds it (``model_name``, ``model``, or
    ``model_id``)."""
    for attr in ("model_name", "model", "model_id"):
        value = getattr(model, attr, None)
        if isinstance(value, str) and value:
            return value
    return None


@dataclass(frozen=True, slots=True)
class _Done:
    """The first ``n`` messages of a thread counted (``last``: the id of message n-1): their
    chars and tokens."""

    n: int = 0
    last: str | None = None
    chars: int = 0
    tokens: int = 0


class ThreadTokens:
    """The chars per token of each thread (thread-safe): :meth:`measure` at each model call,
    :meth:`observe` with each answer's ``usage_metadata``."""

    def __init__(self, default: float) -> None:
        self.default = default
        self._counters: dict[str, TokenCounter] = {}
        self._reported: dict[str, Calibration] = {}
        self._last: dict[str, Ratio] = {}
        #: by (thread, encoding): the thread's messages counted so far
        self._done: dict[tuple[str, str], _Done] = {}
        self._guard = threading.Lock()

    def counter(self, encoding: str) -> TokenCounter:
        with self._guard:
            if encoding not in self._counters:
                self._counters[encoding] = TokenCounter(encoding)
            return self._counters[encoding]

    def observe(self, thread: str, chars: int, answer: Any) -> None:
        """Add one of the thread's calls: ``chars`` sent, ``answer`` carrying the provider's
        ``usage_metadata`` (nothing is added without it)."""
        with self._guard:
            reported = self._reported.get(thread)
            if reported is None:
                if len(self._reported) >= MAX_THREADS:
                    self._reported.pop(next(iter(self._reported)))
                reported = self._reported[thread] = Calibration(default=self.default)
        reported.observe(chars, answer)

    def measure(
        self,
        thread: str,
        model: str | None,
        messages: Sequence[BaseMessage],
        system: BaseMessage | None = None,
        counted: tuple[int, int] | None = None,
    ) -> Ratio:
        """The thread's ratio from what a call sends (``messages``, and ``system``: the system
        prompt sent besides them), remembered as its latest. The thread's messages are
        counted once each (those past the prefix counted at its earlier calls; all of them
        again when that prefix is not ``messages``' any more, or when ``counted``, the
        ``(messages, chars)`` of the thread as the agent's state sizes it, disagrees with it:
        see :meth:`replaced`)."""
        encoding = encoding_for(model)
        reported = self._reported.get(thread)
        ratio: Ratio | None = None
        if encoding is not None and encoder(encoding) is not None:
            ratio = self._counted(
                thread, messages, system, encoding, f"exact ({encoding})", counted
            )
        elif reported is not None and reported.calibrated:
            ratio = Ratio(reported.chars_per_token, "measured")
        elif encoder(DEFAULT_ENCODING) is not None:
            how = f"estimated ({DEFAULT_ENCODING})"
            ratio = self._counted(thread, messages, system, DEFAULT_ENCODING, how, counted)
        ratio = ratio or Ratio(self.default, "CHARS_PER_TOKEN")
        with self._guard:
            if thread not in self._last and len(self._last) >= MAX_THREADS:
                self._last.pop(next(iter(self._last)))
            self._last[thread] = ratio
        return ratio

    def _counted(
        self,
        thread: str,
        messages: Sequence[BaseMessage],
        system: BaseMessage | None,
        encoding: str,
        how: str,
        counted: tuple[int, int] | None,
    ) -> Ratio | None:
        key = (thread, encoding)
        with self._guard:
            done = self._done.pop(key, None)
        n = len(messages)
        if (
            done is None
            or done.n > n
            or (done.n and messages[done.n - 1].id != done.last)
            or (counted is not None and counted[0] == done.n and counted[1] != done.chars)
        ):
            done = _Done()
        new = messages[done.n :]
        counter = self.counter(encoding)
        done = _Done(
            n,
            messages[-1].id if messages else None,
            done.chars + sum(message_chars(m) for m in new),
            done.tokens + (counter.count(new) or 0),
        )
        with self._guard:
            while len(self._done) >= MAX_THREADS:
                self._done.pop(next(iter(self._done)))
            self._done[key] = done
        tokens, chars = done.tokens, done.chars
        if system is not None:
            tokens += counter.count([system]) or 0
            chars += message_chars(system)
        return Ratio(chars / tokens, how) if tokens and chars else None

    def replaced(self, thread: str, pairs: Sequence[tuple[BaseMessage, BaseMessage]]) -> None:
        """A model call replaced messages of the thread in place (same ids: ``(before,
        after)`` pairs; results shortened): their counts are taken out of the thread's, and
        the new ones' put in."""
        with self._guard:
            keys = [k for k in self._done if k[0] == thread]
        for key in keys:
            counter = self.counter(key[1])
            with self._guard:
                done = self._done.get(key)
            if done is None:
                continue
            chars = sum(message_chars(b) - message_chars(a) for a, b in pairs)
            before = counter.count([a for a, _ in pairs]) or 0
            after = counter.count([b for _, b in pairs]) or 0
            with self._guard:
                if self._done.get(key) is done:
                    self._done[key] = replace(
                        done, chars=done.chars + chars, tokens=done.tokens + after - before
                    )

    def forget(self, thread: str) -> None:
        """The thread's messages are counted anew at its next call (a compaction applied)."""
        with self._guard:
            for key in [k for k in self._done if k[0] == thread]:
                del self._done[key]

    def last(self, thread: str | None) -> Ratio | None:
        """The thread's latest ratio (None: no call of it measured yet)."""
        if thread is None:
            return None
        with self._guard:
            return self._last.get(thread)


class ThreadSettings:
    """The settings in force for the middleware's parts: :attr:`current` is the run's
    thread's while one of its hooks runs (:meth:`in_force`; scaled by the thread's ratio when
    the threshold is in tokens), :attr:`base` (the agent's) otherwise.

    Requires: the agent's settings, its threads' :class:`ThreadTokens` and the runs'
    :class:`~offpath.agent.middleware.state.Places`. Provides: :attr:`current`,
    :meth:`in_force`, :meth:`ratio`."""

    def __init__(self, base: Settings, tokens: ThreadTokens, places: Places) -> None:
        self.base = base
        self.tokens = tokens
        self.places = places

    @property
    def current(self) -> Settings:
        """The settings in force (see the class doc)."""
        found = _IN_FORCE.get()
        return found[1] if found is not None and found[0] == id(self) else self.base

    @contextlib.contextmanager
    def in_force(self, request: ModelRequest | None = None) -> Iterator[None]:
        """While the block runs, :attr:`current` is the run's thread's: measured from the
        model call's ``request`` (its model, what it sends), or the thread's latest ratio
        (the run's end, which has no request)."""
        base = self.base
        place = self.places.of_run(list(request.messages) if request is not None else None)
        thread = place.session_id if place is not None and place.compacts else None
        if thread is None or not base.active:
            yield
            return
        if request is not None:
            size = ThreadSize.from_state(private_of(request.state).get("size"))
            ratio: Ratio | None = self.tokens.measure(
                thread,
                model_name(request.model),
                request.messages,
                request.system_message,
                (size.n, size.chars) if size.n else None,
            )
        else:
            ratio = self.tokens.last(thread)
        if not base.summarization_threshold_tokens or ratio is None:
            yield
            return
        token = _IN_FORCE.set((id(self), for_thread(base, ratio.chars_per_token)))
        try:
            yield
        finally:
            _IN_FORCE.reset(token)

    def ratio(self, thread: str | None) -> float | None:
        """The thread's latest chars per token, for its jobs (the worker plans with it)."""
        ratio = self.tokens.last(thread)
        return round(ratio.chars_per_token, 4) if ratio is not None else None
