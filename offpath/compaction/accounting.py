"""Message size accounting, in chars.

One function, :func:`message_chars`, sizes a message. The post-turn hook (is the
thread over the threshold?) and the worker (where is the cut?) both call it, so
they always agree.

The rule (the transcripts README's "Characters are counted as
len(content) plus the JSON length of each tool call's args"):

* string content counts its length;
* list content counts the text of its text parts (``{"type": "text", ...}``,
  reasoning/thinking parts, bare strings);
* image, audio, video, file and document parts count :data:`MEDIA_BLOCK_CHARS`
  each, never the length of their base64 payload (the ``content-blocks`` case:
  ``str(content)`` counted one screenshot as ~130k chars);
* parts that repeat a tool call (``tool_use``) count 0, since the call is
  counted from ``tool_calls``; any other part (a search result, a document of
  text, a JSON payload) counts its JSON length, the media parts inside it at
  :data:`MEDIA_BLOCK_CHARS` each (what the model is sent: a 20,000-char search
  result is no cheaper than the same text as a string);
* each tool call adds the length of its arguments as compact JSON (the
  ``args-heavy`` case: file-writing calls have empty content and big args).
  Compact (no spaces after ``,`` and ``:``, as orjson writes it, which is ~10x
  faster than ``json.dumps``) so it runs 100,000 messages in a planning
  budget; it is a few chars per call under the transcripts README's count.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
from langchain_core.messages import AIMessage, BaseMessage

#: Fixed cost of one non-text content part (image, audio, video, file), in chars.
#: 1,600 tokens, about the most that OpenAI and Anthropic bill for one image,
#: at the seed's 4 chars per token.
MEDIA_BLOCK_CHARS = 6_400

#: Approximate chars per token, as the seed ("~15K tokens at 4 chars/token").
CHARS_PER_TOKEN = 4

_TEXT_KEYS = {"text": "text", "reasoning": "reasoning", "thinking": "thinking"}
_MEDIA_TYPES = frozenset(
    {
        "image",
        "image_url",
        "input_image",
        "audio",
        "input_audio",
        "video",
        "file",
        "input_file",
        "document",
        "media",
    }
)
_CALL_TYPES = frozenset({"tool_use", "tool_call", "function_call", "server_tool_use"})


def block_chars(block: Any) -> int:
    """Size in chars of one content part (a string or a dict)."""
    if isinstance(block, str):
        return len(block)
    if not isinstance(block, Mapping):
        return len(str(block))
    kind = block.get("type")
    if kind in _TEXT_KEYS:
        value = block.get(_TEXT_KEYS[kind])
        return len(value) if isinstance(value, str) else 0
    if kind in _MEDIA_TYPES:
        return MEDIA_BLOCK_CHARS
    if kind in _CALL_TYPES:
        return 0
    media: list[int] = [0]
    bare = _without_media(block, media)
    try:
        raw = orjson.dumps(bare, default=str)
        size = len(raw) if raw.isascii() else len(raw.decode())
    except TypeError:  # e.g. non-string keys
        size = len(json.dumps(bare, ensure_ascii=False, separators=(",", ":"), default=str))
    return size + media[0] * MEDIA_BLOCK_CHARS


def _without_media(value: Any, media: list[int]) -> Any:
    """``value`` (a content part or what it holds) with each media part inside it left out
    (``None``), counted in ``media[0]``."""
    if isinstance(value, Mapping):
        if value.get("type") in _MEDIA_TYPES:
            media[0] += 1
            return None
        return {k: _without_media(v, media) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_media(v, media) for v in value]
    return value


def _texts_inside(value: Any) -> list[str]:
    """The text parts inside a part that is neither text nor media (a search result's
    ``content``, a ``tool_result``'s): what a model reads of it, in order."""
    if isinstance(value, Mapping):
        kind = value.get("type")
        if kind in _TEXT_KEYS:
            text = value.get(_TEXT_KEYS[kind])
            return [text] if isinstance(text, str) else []
        if kind in _MEDIA_TYPES or kind in _CALL_TYPES:
            return []
        return [t for v in value.values() for t in _texts_inside(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _texts_inside(v)]
    return []


def text_only(content: str | Iterable[Any] | None) -> bool:
    """``content`` holds text alone (a string, or text, reasoning and thinking parts): cutting
    it to its head and tail keeps all that a model reads of it but the cut middle. A request
    with an image or a file is kept whole (a long request is shortened when kept)."""
    if content is None or isinstance(content, str):
        return True
    return all(
        isinstance(b, str) or (isinstance(b, Mapping) and b.get("type") in _TEXT_KEYS)
        for b in content
    )


def content_chars(content: str | Iterable[Any] | None) -> int:
    """Size in chars of a message's ``content`` (a string or a list of parts)."""
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    return sum(block_chars(b) for b in content)


def args_chars(args: Any) -> int:
    """Length in chars of ``args`` as compact JSON (orjson; ``str()`` for what JSON can't hold)."""
    if not args:
        return 2
    try:
        raw = orjson.dumps(args, default=str)
        return len(raw) if raw.isascii() else len(raw.decode())
    except TypeError:  # e.g. non-string keys
        return len(json.dumps(args, ensure_ascii=False, separators=(",", ":"), default=str))


def content_text(content: str | Iterable[Any] | None, placeholders: bool = False) -> str:
    """The text of a message's content: the string, or its text parts joined by newlines
    (and those inside a part that holds them: a search result's, a ``tool_result``'s).

    With ``placeholders``, every other part (but tool-call parts) shows as
    ``[image: 6400 chars not shown]``, never as its payload, or, when its payload lives
    elsewhere, where: ``[image_url: at https://...]`` (for prompts, for shortening, for
    ``recall``: one rendering, so the offsets a shortened result names are ``recall``'s).
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, Mapping):
            kind = block.get("type")
            if kind == "text":
                parts.append(str(block.get("text", "")))
            elif kind not in _TEXT_KEYS and kind not in _MEDIA_TYPES and kind not in _CALL_TYPES:
                inside = _texts_inside(block)
                if inside:
                    parts.extend(inside)
                elif placeholders:
                    parts.append(f"[{kind or 'part'}: {block_chars(block)} chars not shown]")
            elif placeholders and kind not in _CALL_TYPES:
                where = _reference(block)
                shown = f"at {where}" if where else f"{block_chars(block)} chars not shown"
                parts.append(f"[{kind or 'part'}: {shown}]")
    return "\n".join(parts)


#: Longest reference (URL, file id) a placeholder shows, in chars.
MAX_REFERENCE_CHARS = 300


def _reference(block: Mapping[str, Any]) -> str | None:
    """Where a media part's payload lives when it is not inline: its ``http(s)`` URL
    (OpenAI's ``image_url``, a LangChain ``url``, Anthropic's ``source.url``) or its file id;
    None for inline data (base64, ``data:`` URLs)."""
    candidates = [block.get("url"), block.get("file_id")]
    for key in ("image_url", "source", "file", "input_audio"):
        inner = block.get(key)
        if isinstance(inner, Mapping):
            candidates += [inner.get("url"), inner.get("file_id")]
        else:
            candidates.append(inner)
    for value in candidates:
        if not isinstance(value, str) or not value:
            continue
        if value.startswith(("http://", "https://")) or value.startswith("file-"):
            return (
                value if len(value) <= MAX_REFERENCE_CHARS else value[:MAX_REFERENCE_CHARS] + "..."
            )
    return None


def message_chars(message: BaseMessage) -> int:
    """Size of one message in chars: its content's text plus its tool-call arguments.

    Written for speed (the planner sizes 100,000 messages in a fraction of its budget).
    """
    content = message.content
    n = len(content) if type(content) is str else content_chars(content)
    if isinstance(message, AIMessage):
        for call in message.tool_calls:
            n += args_chars(call.get("args"))
    return n


def wire_chars(message: BaseMessage) -> int:
    """Size in chars of everything a message carries, every field counted: its content with
    media at their real (base64) size, tool calls, ``additional_kwargs``, metadata, name,
    id, artifact. What a client's message may weigh (``MAX_MESSAGE_CHARS``);
    :func:`message_chars` stays the size that counts against the threshold."""
    raw = orjson.dumps(message.model_dump(), default=str)
    return len(raw) if raw.isascii() else len(raw.decode())


def total_chars(messages: Iterable[BaseMessage]) -> int:
    """Sum of :func:`message_chars` over ``messages``."""
    return sum(message_chars(m) for m in messages)


def approx_tokens(chars: int) -> int:
    """Chars to approximate tokens, at :data:`CHARS_PER_TOKEN` (the seed's proxy)."""
    return chars // CHARS_PER_TOKEN


def render_content(content: str | Sequence[Any]) -> str:
    """Content as text: strings and text parts; other parts as ``[image]``-style placeholders
    (how the summarizer's prompt and the fact guard read a message)."""
    return content_text(content, placeholders=True)
