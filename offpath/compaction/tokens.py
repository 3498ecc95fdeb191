"""Tokens against chars: the calibrated ratio behind ``SUMMARIZATION_THRESHOLD_TOKENS``.

Thresholds are counted in chars (the seed's names, and what the middleware and the worker
compare); users think in tokens. ``SUMMARIZATION_THRESHOLD_TOKENS`` is converted to chars at
start-up by ``CHARS_PER_TOKEN`` (:class:`~offpath.compaction.settings.Settings`), so no model
call ever waits for a tokenizer. The ratio to set is measured, not guessed: a
:class:`Calibration` adds up, over model calls, the chars the middleware sent and the input
tokens the provider reported for them (LangChain's ``AIMessage.usage_metadata``:
``{"input_tokens": int, "output_tokens": int, "total_tokens": int}``), per thread or per
deployment. Only arithmetic on the hot path: no tokenizer is loaded here.

Exact offline counts (for reports, never for the trigger) are :mod:`bench.tokens`'.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

#: The usual rule of thumb for English text and code (OpenAI's "about 4 characters").
DEFAULT_CHARS_PER_TOKEN = 4.0


def input_tokens(message: Any) -> int | None:
    """The input tokens the provider reported for the call that produced ``message`` (an
    ``AIMessage``): ``usage_metadata["input_tokens"]``, or None when it reports none (fake
    models, providers without usage) or a non-positive count."""
    usage = getattr(message, "usage_metadata", None) or {}
    tokens = usage.get("input_tokens") if isinstance(usage, dict) else None
    return int(tokens) if isinstance(tokens, int) and tokens > 0 else None


@dataclass
class Calibration:
    """Chars per input token over the calls observed: total chars sent / total input tokens
    the provider reported for them (a sum, so long calls weigh what they cost).

    ``default``: the ratio until ``min_calls`` calls have reported usage. Thread-safe (one per
    deployment is shared by the runs of an agent).
    """

    default: float = DEFAULT_CHARS_PER_TOKEN
    min_calls: int = 3
    chars: int = 0
    tokens: int = 0
    calls: int = 0
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def observe(self, chars: int, message: Any) -> bool:
        """Add one model call: ``chars`` sent, ``message`` its answer. False (nothing added)
        when the answer carries no usage or nothing was sent."""
        tokens = input_tokens(message)
        if tokens is None or chars <= 0:
            return False
        with self._guard:
            self.chars += chars
            self.tokens += tokens
            self.calls += 1
        return True

    @property
    def calibrated(self) -> bool:
        """At least ``min_calls`` calls reported usage."""
        return self.calls >= self.min_calls

    @property
    def chars_per_token(self) -> float:
        """The measured ratio once :attr:`calibrated`, else ``default``."""
        with self._guard:
            if self.calls < self.min_calls or not self.tokens:
                return self.default
            return self.chars / self.tokens

    def to_chars(self, tokens: int) -> int:
        """``tokens`` as chars at the current ratio (rounded)."""
        return round(tokens * self.chars_per_token)


def threshold_chars(tokens: int, chars_per_token: float) -> int:
    """``SUMMARIZATION_THRESHOLD_TOKENS`` in chars: ``round(tokens x chars_per_token)``."""
    return round(tokens * chars_per_token)
