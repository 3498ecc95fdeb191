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
* a document part that carries text (Anthropic's ``source`` of type ``text``)
  counts that text;
* parts that repeat a tool call (``tool_use``) count 0, since the call is
  counted from ``tool_calls``; any other part (a search result, a JSON payload,
  a ``tool_result``) counts its JSON length, the media parts inside it at
  :data:`MEDIA_BLOCK_CHARS` each (what the model is sent: a 20,000-char search
  result is no cheaper than the same text as a string). Its text
  (:func:`part_text`) is the text parts inside it, else its JSON: what prompts,
  shortening, ``recall`` and the archive's search read;
* each tool call adds the length of its arguments as compact JSON (the
  ``args-heavy`` case: file-writing calls have empty content and big args).
  Compact (no spaces after ``,`` and ``:``, as orjson writes it, which is ~10x
  faster than ``json.dumps``) so it runs 100,000 messages in a planning
  budget; it is a few chars per call under the transcripts README's count.
"""

from __future__ import annotations

import json
import re
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
    """Size in chars of one content part (a string or a dict): see the module doc."""
    if isinstance(block, str):
        return len(block)
    if not isinstance(block, Mapping):
        return len(str(block))
    kind = block.get("type")
    if kind in _TEXT_KEYS:
        value = block.get(_TEXT_KEYS[kind])
        return len(value) if isinstance(value, str) else 0
    if kind in _MEDIA_TYPES:
        text = _document_text(block)
        return MEDIA_BLOCK_CHARS if text is None else len(text)
    if kind in _CALL_TYPES:
        return 0
    dumped = _json_of(block)
    if dumped is None:  # keys that are no strings, a part that holds itself
        return MEDIA_BLOCK_CHARS
    raw, media = dumped
    return (len(raw) if raw.isascii() else len(raw.decode())) + media * MEDIA_BLOCK_CHARS


def _json_of(block: Mapping[str, Any]) -> tuple[bytes, int] | None:
    """``block`` as compact JSON with each media part inside it as its placeholder, and how
    many there were; dumped once, walked only when a media part is inside (the common case:
    no walk, no copy). None when it cannot be dumped (keys that are no strings, a part that
    holds itself)."""
    try:
        raw = orjson.dumps(block, default=str)
        if not _media_inside(raw):
            return raw, 0
        media = [0]
        return orjson.dumps(_without_media(block, media), default=str), media[0]
    except (TypeError, RecursionError):
        return None


#: A media part inside a part's JSON (as orjson writes it): then its size is walked.
_MEDIA_INSIDE = re.compile(
    rb'"type":"(?:' + b"|".join(t.encode() for t in sorted(_MEDIA_TYPES)) + rb')"'
)


def _media_inside(raw: bytes) -> bool:
    """A part's JSON (its own ``type`` not media) holds a media part: a second ``"type":"``
    first (one fast count), then which."""
    return raw.count(b'"type":"') > 1 and _MEDIA_INSIDE.search(raw) is not None


def _without_media(value: Any, media: list[int]) -> Any:
    """``value`` (a content part or what it holds) with each media part inside it as its
    placeholder (:func:`_placeholder`), counted in ``media[0]``."""
    if isinstance(value, Mapping):
        if value.get("type") in _MEDIA_TYPES:
            media[0] += 1
            return _placeholder(value)
        return {k: _without_media(v, media) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_media(v, media) for v in value]
    return value


def _document_text(block: Mapping[str, Any]) -> str | None:
    """The text a ``document`` part carries (Anthropic's ``source`` of type ``text``, or
    ``content`` of text parts); None for any other media part."""
    if block.get("type") != "document":
        return None
    source = block.get("source")
    if not isinstance(source, Mapping):
        return None
    if source.get("type") == "text" and isinstance(source.get("data"), str):
        return str(source["data"])
    if source.get("type") == "content":
        return "\n".join(_texts_inside(source.get("content"), placeholders=True)) or None
    return None


#: How deep :func:`_texts_inside` looks into a part (the API refuses JSON deeper than 32; a
#: part built in Python may hold itself).
MAX_PART_DEPTH = 64


def _texts_inside(value: Any, placeholders: bool, depth: int = 0) -> list[str]:
    """The text parts inside a part that is neither text nor media (a search result's
    ``content`` after its ``title``, a ``tool_result``'s), media inside it as placeholders
    (``placeholders``): what a model reads of it, in order."""
    if depth > MAX_PART_DEPTH:
        return []
    if isinstance(value, Mapping):
        kind = value.get("type")
        if kind in _TEXT_KEYS:
            text = value.get(_TEXT_KEYS[kind])
            return [text] if isinstance(text, str) else []
        if kind in _MEDIA_TYPES:
            text = _document_text(value)
            if text is not None:
                return [text]
            return [_placeholder(value)] if placeholders else []
        if kind in _CALL_TYPES:
            return []
        inside = [t for v in value.values() for t in _texts_inside(v, placeholders, depth + 1)]
        title = value.get("title")
        return [title, *inside] if inside and isinstance(title, str) and title else inside
    if isinstance(value, list | tuple):
        return [t for v in value for t in _texts_inside(v, placeholders, depth + 1)]
    return []


def _other_text(block: Mapping[str, Any], placeholders: bool) -> str | None:
    """What a model reads of a part that is neither text, media nor a call: the text parts
    inside it (:func:`_texts_inside`), else its compact JSON (a JSON payload, a
    ``tool_result`` of a string), media inside it as placeholders; None for an opaque one
    (``redacted_thinking``: its data is no text)."""
    if str(block.get("type") or "").startswith("redacted"):
        return None
    inside = _texts_inside(block, placeholders)
    if inside:
        return "\n".join(inside)
    dumped = _json_of(block)
    return None if dumped is None else dumped[0].decode()


def _placeholder(block: Mapping[str, Any]) -> str:
    """A part shown without its payload: ``[image: 6400 chars not shown]``, or where the
    payload lives (``[image_url: at https://...]``)."""
    where = _reference(block)
    shown = f"at {where}" if where else f"{block_chars(block)} chars not shown"
    return f"[{block.get('type') or 'part'}: {shown}]"


def part_text(block: Any, placeholders: bool = False) -> str:
    """What a model reads of one content part as text (:func:`content_text` joins them): a
    string, a text part's text; a document's text; the text inside another part, else its
    JSON. With ``placeholders``, a media part (an image, a file) and a part that is no text
    (``redacted_thinking``, reasoning and thinking parts) as their placeholder; without,
    "". Tool-call parts: "" (their calls are counted from ``tool_calls``)."""
    if isinstance(block, str):
        return block
    if not isinstance(block, Mapping):
        return ""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind in _CALL_TYPES:
        return ""
    if kind in _MEDIA_TYPES:
        text = _document_text(block)
        if text is not None:
            return text
    elif kind not in _TEXT_KEYS:
        other = _other_text(block, placeholders)
        if other is not None:
            return other
    return _placeholder(block) if placeholders else ""


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
    """The text of a message's content: the string, or its parts' text (:func:`part_text`:
    text parts, a document's text, the text inside another part or else its JSON) joined by
    newlines.

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
        text = part_text(block, placeholders)
        if (
            text
            or isinstance(block, str)
            or (isinstance(block, Mapping) and block.get("type") == "text")
        ):
            parts.append(text)  # a text part joins even when empty, as it always has
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
