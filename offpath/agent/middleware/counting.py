"""A thread's tokens as its model counts them: each thread's chars per token
(:class:`ThreadTokens`), and, when the threshold is in tokens
(``SUMMARIZATION_THRESHOLD_TOKENS``), that thread's settings in force while a hook of the
middleware runs for it (:class:`CountingMixin`): its threshold, keep window and hard limit in
chars scaled by its own ratio (:func:`offpath.compaction.tokens.for_thread`), so that a
thread of Chinese tool output is compacted at the same number of tokens as an English one.

The sources of the ratio, in order: exact counts (quicktok) for an OpenAI model, the
provider's reported ``input_tokens`` over the thread's own calls for any other, an
``o200k_base`` estimate until that is known, ``CHARS_PER_TOKEN`` without quicktok
(:mod:`offpath.compaction.tokens`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from langchain.agents.middleware.types import ModelRequest
from langchain_core.messages import BaseMessage

from offpath.agent.middleware.place import Places
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

#: The settings of the thread a hook runs for: (the middleware's id, its settings).
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


class ThreadTokens:
    """The chars per token of each thread (thread-safe): :meth:`measure` at each model call,
    :meth:`observe` with each answer's ``usage_metadata``."""

    def __init__(self, default: float) -> None:
        self.default = default
        self._counters: dict[str, TokenCounter] = {}
        self._reported: dict[str, Calibration] = {}
        self._last: dict[str, Ratio] = {}
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

    def measure(self, thread: str, model: str | None, sent: Sequence[BaseMessage]) -> Ratio:
        """The thread's ratio from what a call sends (``sent``: its messages, the system
        prompt included), remembered as its latest."""
        encoding = encoding_for(model)
        reported = self._reported.get(thread)
        ratio: Ratio | None = None
        if encoding is not None and encoder(encoding) is not None:
            ratio = self._counted(sent, encoding, f"exact ({encoding})")
        elif reported is not None and reported.calibrated:
            ratio = Ratio(reported.chars_per_token, "measured")
        elif encoder(DEFAULT_ENCODING) is not None:
            ratio = self._counted(sent, DEFAULT_ENCODING, f"estimated ({DEFAULT_ENCODING})")
        ratio = ratio or Ratio(self.default, "CHARS_PER_TOKEN")
        with self._guard:
            if thread not in self._last and len(self._last) >= MAX_THREADS:
                self._last.pop(next(iter(self._last)))
            self._last[thread] = ratio
        return ratio

    def _counted(self, sent: Sequence[BaseMessage], encoding: str, how: str) -> Ratio | None:
        tokens = self.counter(encoding).count(sent)
        chars = sum(message_chars(m) for m in sent)
        return Ratio(chars / tokens, how) if tokens and chars else None

    def last(self, thread: str | None) -> Ratio | None:
        """The thread's latest ratio (None: no call of it measured yet)."""
        if thread is None:
            return None
        with self._guard:
            return self._last.get(thread)


class CountingMixin:
    """:class:`~offpath.agent.middleware.OffPathCompaction`'s settings per thread:
    :attr:`settings` is the thread's while one of its hooks runs for a thread (scaled by
    the thread's ratio when the threshold is in tokens), the agent's otherwise. Uses
    ``self.tokens`` (a :class:`ThreadTokens`) and ``self.places`` (the runs' sessions), set in
    ``OffPathCompaction.__init__``."""

    _settings: Settings
    tokens: ThreadTokens
    places: Places

    @property
    def settings(self) -> Settings:
        """The settings in force (see the class doc)."""
        found = _IN_FORCE.get()
        return found[1] if found is not None and found[0] == id(self) else self._settings

    @settings.setter
    def settings(self, value: Settings) -> None:
        self._settings = value

    @contextlib.contextmanager
    def _thread_settings(self, request: ModelRequest | None = None) -> Iterator[None]:
        """While the block runs, :attr:`settings` is the run's thread's: measured from the
        model call's ``request`` (its model, what it sends), or the thread's latest ratio
        (the run's end, which has no request)."""
        base = self._settings
        place = self.places.of_run(list(request.messages) if request is not None else None)
        thread = place.session_id if place is not None and place.compacts else None
        if thread is None or not base.active:
            yield
            return
        if request is not None:
            sent = list(request.messages)
            if request.system_message is not None:
                sent.insert(0, request.system_message)
            ratio: Ratio | None = self.tokens.measure(thread, model_name(request.model), sent)
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

    def _thread_ratio(self, thread: str | None) -> float | None:
        """The thread's latest chars per token, for its jobs (the worker plans with it)."""
        ratio = self.tokens.last(thread)
        return round(ratio.chars_per_token, 4) if ratio is not None else None


def per_thread(hook: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``hook`` (a hook of the middleware with no model request: ``after_agent``) with
    its thread's settings in force (:meth:`CountingMixin._thread_settings`)."""

    @functools.wraps(hook)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._thread_settings():
            return hook(self, *args, **kwargs)

    return run
