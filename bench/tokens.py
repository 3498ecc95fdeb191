"""Exact token counts for the reports (issue 22, "Counting tokens"), offline.

``tiktoken`` downloads its encodings at first use (it fails here: no network). quicktok
(PyPI ``quicktok-v1``, one of offpath's dependencies, loaded by
:mod:`offpath.compaction.tokens`) ships ``cl100k_base`` and ``o200k_base`` in its wheel and
gives the same ids as tiktoken (checked on every string of the shared transcripts against
tiktoken with OpenAI's ``cl100k_base.tiktoken``, its published sha256: 3,891 of 3,891
identical). Without it, counts fall back to chars / 4 and say so (:data:`EXACT`).

What a message counts: the text :func:`offpath.compaction.accounting.message_chars` counts
(content text, each tool call's compact JSON args), so chars / tokens compare like for like;
per-message framing tokens of a chat API (3-4 each) are left out of both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from offpath.compaction.tokens import encoder, message_text

#: The encoding of current OpenAI models (gpt-4o, gpt-4.1, o-series); cl100k_base: gpt-4/3.5.
ENCODING = "o200k_base"


def _encoder(name: str) -> Any:
    return encoder(name)


def exact_available(name: str = ENCODING) -> bool:
    """quicktok is installed: counts are exact."""
    return _encoder(name) is not None


def count_text(text: str, name: str = ENCODING) -> int:
    """Tokens of ``text`` in encoding ``name`` (special tokens as plain text); chars / 4
    (rounded up) when no exact tokenizer is installed."""
    enc = _encoder(name)
    if enc is None:
        return -(-len(text) // 4)
    return len(enc.encode_ordinary(text))


class Counter:
    """Counts messages, caching each by (id, content hash): a run sends the same messages
    call after call, so a run of N calls tokenizes each message once, not N times."""

    def __init__(self, name: str = ENCODING) -> None:
        self.name = name
        self._cache: dict[tuple[str, int], int] = {}

    @property
    def exact(self) -> bool:
        return exact_available(self.name)

    def message(self, message: Any) -> int:
        text = message_text(message)
        key = (str(getattr(message, "id", "") or ""), hash(text))
        if key not in self._cache:
            self._cache[key] = count_text(text, self.name)
        return self._cache[key]

    def messages(self, messages: Iterable[Any]) -> int:
        return sum(self.message(m) for m in messages)
