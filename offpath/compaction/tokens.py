"""Tokens against chars: the ratio behind ``SUMMARIZATION_THRESHOLD_TOKENS``, counted as the
model counts them.

Sizes are kept in chars (the seed's names, and what the planner and the patch compare); users
think in tokens, and a token is not a fixed number of chars: about 4 in English, 2.6 in logs,
1.3-1.5 in Chinese, Japanese or Korean. With the threshold in tokens, each thread's sizes are
scaled by *its own* chars per token (:func:`for_thread`): its threshold in chars is
``round(tokens x ratio)``, and the keep window, the hard limit and the other sizes follow by
``ratio / CHARS_PER_TOKEN``. A thread of CJK tool output is then compacted at the same count
of tokens as an English one, in one deployment. The ratio comes, in this order:

1. **exact**, for an OpenAI model (:func:`encoding_for` knows its encoding): the thread's
   tokens counted offline with quicktok (its wheel ships ``cl100k_base`` and ``o200k_base``;
   the same ids as tiktoken; counted without building the ids), each message once
   (:class:`TokenCounter`);
2. **measured**, for any other model, once the provider has reported ``usage_metadata``
   (``input_tokens``) for the thread's calls: chars sent / tokens reported, over that
   thread's calls (a :class:`Calibration` per thread); tool schemas and chat framing, which
   the provider counts and the chars do not, make it err on the early side;
3. **estimated** with ``o200k_base`` until then (for a model with another vocabulary a
   first guess, corrected as soon as it reports);
4. ``CHARS_PER_TOKEN`` only where quicktok is not installed and no usage was reported.

Only arithmetic and a cached count of each new message on the hot path (quicktok counts
100,000 chars in about 3 ms; an encoding loads once per process).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import orjson

from offpath.compaction.accounting import message_chars, part_text
from offpath.compaction.fields import message_field

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


#: The encoding of an unknown model's first estimate (current OpenAI models').
DEFAULT_ENCODING = "o200k_base"
#: OpenAI model names by prefix, and their encodings (tiktoken's model table).
OPENAI_ENCODINGS = (
    ("gpt-4o", "o200k_base"),
    ("chatgpt-4o", "o200k_base"),
    ("gpt-4.1", "o200k_base"),
    ("gpt-4.5", "o200k_base"),
    ("gpt-5", "o200k_base"),
    ("o1", "o200k_base"),
    ("o3", "o200k_base"),
    ("o4", "o200k_base"),
    ("gpt-4", "cl100k_base"),
    ("gpt-3.5", "cl100k_base"),
)


def encoding_for(model: str | None) -> str | None:
    """The encoding an OpenAI model counts in (``gpt-4o-mini``: ``o200k_base``; ``gpt-4``:
    ``cl100k_base``; a fine-tuned ``ft:gpt-4o-...`` too); None for a model that is not
    OpenAI's (its count is measured from what its provider reports)."""
    name = (model or "").strip().lower().removeprefix("ft:").rsplit("/", 1)[-1]
    for prefix, encoding in OPENAI_ENCODINGS:
        if name == prefix or name.startswith((f"{prefix}-", f"{prefix}.", f"{prefix}:")):
            return encoding
    return None


#: The encodings this process has loaded (:func:`encoder`).
_LOADED: set[str] = set()


@lru_cache(maxsize=4)
def encoder(name: str = DEFAULT_ENCODING) -> Any | None:
    """quicktok's encoding ``name`` (its vocabulary is in its wheel: nothing is downloaded),
    loaded once per process; None when quicktok is not installed."""
    try:
        import quicktok
    except ImportError:
        return None
    enc = quicktok.get_encoding(name)
    _LOADED.add(name)
    return enc


def message_text(message: Any) -> str:
    """The text of ``message`` that :func:`~offpath.compaction.accounting.message_chars`
    counts: string content, or the text parts of list content; each tool call's args as
    compact JSON (so that chars and tokens compare like for like; a chat API's framing
    tokens, 3-4 per message, are left out of both)."""
    content = getattr(message, "content", "")
    if isinstance(content, str):
        parts = [content]
    else:
        parts = []
        for block in content or []:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict):
                value = block.get("text") or block.get("reasoning") or block.get("thinking")
                if isinstance(value, str):
                    parts.append(value)
                elif block.get("type") not in ("reasoning", "thinking"):
                    # a search result's text, a JSON payload, a document's text: as counted
                    parts.append(part_text(block))
    for call in message_field(message, "tool_calls") or []:
        parts.append(orjson.dumps(call.get("args") or {}, default=str).decode())
    return "\n".join(parts)


class TokenCounter:
    """Counts messages in one encoding, each message once: a run sends the same messages call
    after call (cached by id and a hash of its text; at most ``max_cached`` messages).
    Thread-safe. ``exact``: quicktok is installed (else :meth:`count` gives None)."""

    def __init__(self, encoding: str = DEFAULT_ENCODING, max_cached: int = 100_000) -> None:
        self.encoding = encoding
        self.max_cached = max_cached
        self._cache: dict[tuple[str, int], int] = {}
        self._guard = threading.Lock()

    @property
    def exact(self) -> bool:
        return encoder(self.encoding) is not None

    def text(self, text: str) -> int | None:
        """Tokens of ``text`` (special tokens as plain text); None without quicktok."""
        enc = encoder(self.encoding)
        return None if enc is None else enc.count(text)

    def count(self, messages: Iterable[Any]) -> int | None:
        """Tokens of ``messages`` (:func:`message_text` of each); None without quicktok."""
        enc = encoder(self.encoding)
        if enc is None:
            return None
        total = 0
        for m in messages:
            # a message with an id is known by it and its size (no text is built to look it
            # up: a run's calls send the same messages again); one without, by its text
            mid = getattr(m, "id", None)
            text = None if mid else message_text(m)
            key = (str(mid), message_chars(m)) if mid else ("", hash(text))
            with self._guard:
                n = self._cache.get(key)
            if n is None:
                n = enc.count(message_text(m) if text is None else text)
                with self._guard:
                    if len(self._cache) >= self.max_cached:
                        self._cache.clear()
                    self._cache[key] = n
            total += n
        return total


def for_thread(settings: Any, chars_per_token: float | None) -> Any:
    """``settings`` (a :class:`~offpath.compaction.settings.Settings`, which imports this
    module) for a thread whose text runs ``chars_per_token`` chars per token, when the
    threshold is in tokens (``SUMMARIZATION_THRESHOLD_TOKENS``): the threshold in chars is
    ``round(tokens x chars_per_token)``, and the keep window, ``CONTEXT_HARD_LIMIT_CHARS``,
    ``TOOL_RESULT_MAX_CHARS`` and the pinned facts' budget are scaled by
    ``chars_per_token / CHARS_PER_TOKEN`` (those left at 0 follow the threshold as before).
    ``settings`` itself when the threshold is in chars or the ratio is not known."""
    tokens = settings.summarization_threshold_tokens
    if not tokens or not chars_per_token or chars_per_token <= 0:
        return settings
    ratio = round(min(max(chars_per_token, 0.5), 20.0), 2)
    factor = ratio / settings.chars_per_token

    def scaled(value: int) -> int:
        return round(value * factor) if value else 0

    return settings.model_copy(
        update={
            "summarization_threshold_chars": threshold_chars(tokens, ratio),
            "summarization_keep_chars": scaled(settings.summarization_keep_chars),
            "context_hard_limit_chars": scaled(settings.context_hard_limit_chars),
            "tool_result_max_chars": scaled(settings.tool_result_max_chars),
            "summary_pinned_max_chars": scaled(settings.summary_pinned_max_chars),
        }
    )


def message_tokens(
    message: Any, encoding: str = DEFAULT_ENCODING, *, load: bool = True
) -> int | None:
    """Tokens of ``message`` (:func:`message_text`) in ``encoding``; None without quicktok,
    or, with ``load`` False, when this process has not loaded ``encoding`` (its vocabulary
    takes ~64 MiB: a process that counts no tokens otherwise does not load it for this)."""
    if not load and encoding not in _LOADED:
        return None
    enc = encoder(encoding)
    return None if enc is None else int(enc.count(message_text(message)))


def measured_ratio(
    messages: Iterable[Any],
    encoding: str = DEFAULT_ENCODING,
    counted: Sequence[int | None] | None = None,
) -> float | None:
    """Chars per token of ``messages`` counted in ``encoding`` (None: no quicktok, or no
    text). For a thread read whole (the worker's, the API's session page). ``counted``: the
    tokens of each message in :data:`DEFAULT_ENCODING` as :func:`message_tokens` counted them
    before (where it arrived: :class:`offpath.stores.facts.FactStore`), None for one not
    counted; those not given are counted here."""
    enc = encoder(encoding)
    if enc is None:
        return None
    items = list(messages)
    chars = sum(message_chars(m) for m in items)
    if counted is None or encoding != DEFAULT_ENCODING or len(counted) != len(items):
        counted = [None] * len(items)
    # each message counted once, here: no cache to look up or fill
    tokens = sum(
        enc.count(message_text(m)) if n is None else n for m, n in zip(items, counted, strict=True)
    )
    return chars / tokens if tokens and chars else None


def stored_ratio(value: Any) -> float | None:
    """A chars per token read back from a job's row (data, not trusted): the number if it is
    one from 0.5 to 20, else None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and 0.5 <= value <= 20:
        return float(value)
    return None
