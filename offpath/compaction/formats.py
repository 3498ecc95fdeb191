"""Conversation files and turns: the transcript format, OpenAI chat format, LangChain dicts.

Pure data handling (no file or network access): :func:`to_messages` converts a
list of message dicts with langchain_core's own converter, and
:func:`split_turns` cuts a conversation into turns (a human message and
everything the agent did until the next one).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ToolMessage,
    convert_to_messages,
    messages_from_dict,
)

from offpath.compaction.summary import is_summary


class ConversationFormatError(ValueError):
    """The data is not a conversation in a format we read; the message says what is wrong."""


def extract_messages(doc: Any) -> list[Mapping[str, Any]]:
    """The message dicts of a document: ``{"messages": [...]}`` or a bare list.

    Raises :class:`ConversationFormatError` for anything else.
    """
    if isinstance(doc, Mapping):
        doc = doc.get("messages")
        if doc is None:
            raise ConversationFormatError('expected an object with a "messages" list')
    if not isinstance(doc, list):
        raise ConversationFormatError("expected a list of messages")
    for i, m in enumerate(doc):
        if not isinstance(m, Mapping):
            raise ConversationFormatError(f"message {i} is not an object")
    return doc


def to_messages(items: Sequence[Mapping[str, Any]]) -> list[BaseMessage]:
    """Convert message dicts to LangChain messages.

    Accepts the transcript format (``type``/``content``/``tool_calls``/
    ``tool_call_id``/``id``, plus ``additional_kwargs`` as the API returns it;
    other keys such as ``summary: true`` land in ``additional_kwargs``), OpenAI
    chat format (``role``, ``tool_calls`` with ``function``; every shape of the OpenAI SDK's
    ``ChatCompletionMessageParam``, read by :func:`from_openai`) and LangChain's
    serialized dicts (``{"type": ..., "data": {...}}``).
    Raises :class:`ConversationFormatError` naming the first bad message.
    """
    out: list[BaseMessage] = []
    for i, item in enumerate(items):
        if not ("data" in item and "type" in item):
            item = from_openai(item)
        _check_shape(i, item)
        try:
            if "data" in item and "type" in item and isinstance(item["data"], Mapping):
                out.extend(messages_from_dict([dict(item)]))
            else:
                if "role" not in item and "type" not in item:
                    raise ValueError('it has neither "role" nor "type"')
                flat = dict(item)
                extra = flat.pop("additional_kwargs", None) or {}
                if not isinstance(extra, Mapping):
                    raise ValueError('"additional_kwargs" must be an object')
                out.extend(convert_to_messages([_blank_arguments_as_empty({**extra, **flat})]))
        except (ValueError, TypeError, KeyError, NotImplementedError) as exc:
            raise ConversationFormatError(f"message {i}: {_first_line(exc)}") from None
    return out


#: The id given to a call of OpenAI's deprecated function calling (an assistant message's
#: ``function_call``, answered by a ``role: "function"`` message, neither of which has an id):
#: the prefix, then the function's name. A result answers the nearest earlier unanswered call
#: with its id (:mod:`compaction.pairing`), so calls of one function in turn pair in order.
LEGACY_CALL_PREFIX = "function_call_"
#: ``additional_kwargs`` key of an AI message listing the ids of its calls that were OpenAI
#: *custom* tool calls (``{"type": "custom", "custom": {"name", "input"}}``): each reads as a
#: call with ``args = {"input": <its text input>}``.
CUSTOM_CALLS = "openai_custom_tool_calls"
#: Optional keys of OpenAI messages that may be sent as null: null means absent.
_NULLABLE = ("audio", "refusal", "function_call", "name", "tool_calls", "annotations")


def from_openai(item: Mapping[str, Any]) -> Mapping[str, Any]:
    """``item`` with the valid OpenAI chat shapes langchain_core's converter does not read
    made into ones it does (the shapes are the OpenAI SDK's
    ``ChatCompletionMessageParam`` TypedDicts): an assistant message with ``tool_calls`` (or
    ``function_call``) and no ``content`` key gets empty content; optional keys sent as null
    are dropped; a custom tool call reads as a call with ``args = {"input": ...}`` (its id
    listed under :data:`CUSTOM_CALLS`); the deprecated ``function_call`` reads as a tool
    call and a ``role: "function"`` message as its tool result (ids:
    :data:`LEGACY_CALL_PREFIX` + name). Content parts (text, image_url, input_audio, file,
    refusal) are kept as they are. Anything else is returned unchanged (the converter
    checks it)."""
    role = item.get("role", item.get("type"))
    if role == "function" and "role" in item:
        name = item.get("name")
        out: dict[str, Any] = {k: v for k, v in item.items() if k != "role"}
        out.update(
            role="tool",
            content=item.get("content") or "",
            tool_call_id=f"{LEGACY_CALL_PREFIX}{name}" if isinstance(name, str) else None,
        )
        return out
    if role not in ("assistant", "ai"):
        return item
    out = {k: v for k, v in item.items() if not (k in _NULLABLE and v is None)}
    if "content" not in out and "role" in out:  # optional beside tool_calls or function_call
        out["content"] = ""
    calls = out.get("tool_calls")
    legacy = out.pop("function_call", None) if "role" in out else None
    if isinstance(legacy, Mapping) and isinstance(legacy.get("name"), str):
        call = {"id": f"{LEGACY_CALL_PREFIX}{legacy['name']}", "type": "function"}
        calls = [*(calls if isinstance(calls, list) else []), {**call, "function": legacy}]
    elif legacy is not None:
        out["function_call"] = legacy  # not a call: the converter's check says what is wrong
    if not isinstance(calls, list):
        return out
    custom: list[str] = []
    fixed: list[Any] = []
    for call in calls:
        spec = call.get("custom") if isinstance(call, Mapping) else None
        if isinstance(spec, Mapping) and call.get("type") == "custom":
            custom.append(str(call.get("id")))
            args = {"input": spec.get("input")}
            call = {"id": call.get("id"), "name": spec.get("name"), "args": args}
        fixed.append(call)
    out["tool_calls"] = fixed
    if custom:
        extra = out.get("additional_kwargs")
        extra = dict(extra) if isinstance(extra, Mapping) else {}
        out["additional_kwargs"] = {**extra, CUSTOM_CALLS: custom}
    return out


#: Message types we read, by ``type`` or OpenAI ``role``.
KNOWN_TYPES = {"system", "developer", "human", "user", "ai", "assistant", "tool"}


def _check_shape(i: int, item: Mapping[str, Any]) -> None:
    """Say in our words what langchain_core's converter would say in its own."""
    if "data" in item and "type" in item:
        return  # serialized LangChain message: its converter checks it
    kind = item.get("role", item.get("type"))
    if kind is None:
        raise ConversationFormatError(f'message {i}: it has neither "role" nor "type"')
    if kind not in KNOWN_TYPES:
        raise ConversationFormatError(
            f"message {i}: type {kind!r} is not accepted (system, human/user, ai/assistant or tool)"
        )
    calls = item.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise ConversationFormatError(f"message {i}: tool_calls must be a list")
    for k, call in enumerate(calls):
        if not isinstance(call, Mapping):
            raise ConversationFormatError(f"message {i}: tool call {k} is not an object")
        fn = call.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else call.get("name")
        if not name:
            raise ConversationFormatError(f"message {i}: tool call {k} has no name")
        if isinstance(fn, Mapping) and isinstance(fn.get("arguments"), str):
            try:
                args = json.loads(fn["arguments"].strip() or "{}")
            except ValueError as exc:
                raise ConversationFormatError(
                    f"message {i}: the arguments of tool call {call.get('id') or k} are not valid JSON ({exc})"
                ) from None
            if not isinstance(args, Mapping):
                raise ConversationFormatError(
                    f"message {i}: the arguments of tool call {call.get('id') or k} must be a JSON object"
                )
        elif "args" in call and not isinstance(call["args"], Mapping):
            raise ConversationFormatError(
                f"message {i}: the args of tool call {call.get('id') or k} must be an object"
            )


def _blank_arguments_as_empty(item: dict[str, Any]) -> dict[str, Any]:
    """``item`` with OpenAI tool calls whose ``arguments`` are blank (``""``, as some
    OpenAI-compatible servers send for a tool without parameters) given ``"{}"``: no
    arguments, as :func:`_check_shape` reads them (langchain_core's parser refuses ``""``)."""
    calls = item.get("tool_calls")
    if not isinstance(calls, list):
        return item
    fixed = []
    for call in calls:
        fn = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(fn, Mapping) and isinstance(fn.get("arguments"), str):
            if not fn["arguments"].strip():
                call = {**call, "function": {**fn, "arguments": "{}"}}
        fixed.append(call)
    return {**item, "tool_calls": fixed}


def message_json(m: BaseMessage) -> dict[str, Any]:
    """A message as a JSON-ready dict in the transcript/LangChain dict format, which
    :func:`to_messages` reads back unchanged (``additional_kwargs`` included)."""
    out: dict[str, Any] = {"type": m.type, "id": m.id, "content": m.content}
    if isinstance(m, AIMessage) and m.tool_calls:
        out["tool_calls"] = [
            {"id": c["id"], "name": c["name"], "args": c["args"]} for c in m.tool_calls
        ]
    if m.type == "tool" and isinstance(m, ToolMessage):
        out["tool_call_id"] = m.tool_call_id
    if m.name:
        out["name"] = m.name
    if m.additional_kwargs:
        out["additional_kwargs"] = m.additional_kwargs
    return out


def split_turns(messages: Sequence[BaseMessage]) -> list[list[BaseMessage]]:
    """Cut ``messages`` into turns: each starts at a human message that is not a summary;
    whatever comes before the first one (system prompt, summaries) joins the first turn."""
    turns: list[list[BaseMessage]] = []
    current: list[BaseMessage] = []
    for m in messages:
        if (
            m.type == "human"
            and not is_summary(m)
            and any(x.type == "human" and not is_summary(x) for x in current)
        ):
            turns.append(current)
            current = []
        current.append(m)
    if current:
        turns.append(current)
    return turns


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
