"""A conversation holding every shape of the OpenAI SDK's chat message params (issue 19,
item 6), built with the SDK's own TypedDicts and model classes; shared by the unit test
(``compaction/test_openai_shapes.py``) and the API test (``integration/test_openai_import.py``).

:func:`catalogue` returns it (a list of JSON-ready dicts), :func:`sdk_check` validates one
message against the SDK's ``ChatCompletionMessageParam`` (its iterables consumed, so a bad
content part is caught), and :func:`shapes_in_sdk` lists what the SDK defines (roles,
content part types, tool call types), so that a shape the SDK adds later fails the test
until the catalogue (and the importer) covers it.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionContentPartParam,
    ChatCompletionDeveloperMessageParam,
    ChatCompletionFunctionMessageParam,
    ChatCompletionMessage,
    ChatCompletionMessageParam,
    ChatCompletionMessageToolCallUnionParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionToolMessageParam,
    ChatCompletionUserMessageParam,
)
from openai.types.chat.chat_completion_assistant_message_param import ContentArrayOfContentPart
from pydantic import TypeAdapter

_PARAM = TypeAdapter(ChatCompletionMessageParam)


def _literal(td: Any, key: str) -> str:
    """The one literal value of ``td``'s field ``key`` (``Required[Literal["x"]]``)."""
    hint = typing.get_type_hints(td, include_extras=True)[key]
    while typing.get_origin(hint) is not typing.Literal:
        (hint, *_) = typing.get_args(hint)
    (value,) = typing.get_args(hint)
    return value


def _members(union: Any) -> list[Any]:
    return [t for t in typing.get_args(union) if isinstance(t, type)]


def shapes_in_sdk() -> dict[str, set[str]]:
    """What the installed SDK defines: message roles, content part types (user and assistant)
    and tool call types."""
    return {
        "roles": {_literal(t, "role") for t in _members(ChatCompletionMessageParam)},
        "parts": {
            _literal(t, "type")
            for t in _members(ChatCompletionContentPartParam) + _members(ContentArrayOfContentPart)
        },
        "calls": {_literal(t, "type") for t in _members(ChatCompletionMessageToolCallUnionParam)},
    }


def shapes_in(messages: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """The roles, content part types and tool call types ``messages`` use."""
    out: dict[str, set[str]] = {"roles": set(), "parts": set(), "calls": set()}
    for m in messages:
        out["roles"].add(m["role"])
        if isinstance(m.get("content"), list):
            out["parts"].update(p["type"] for p in m["content"])
        out["calls"].update(c["type"] for c in m.get("tool_calls") or [])
    return out


def sdk_check(message: Mapping[str, Any]) -> None:
    """Raise pydantic's ``ValidationError`` unless ``message`` is a valid
    ``ChatCompletionMessageParam`` (every iterable in it consumed: checked item by item)."""
    valid = _PARAM.validate_python(message)
    for key in ("content", "tool_calls"):
        value = valid.get(key)
        if value is not None and not isinstance(value, str):
            list(value)


def _args(**kw: Any) -> str:
    return json.dumps(kw)


def catalogue() -> list[dict[str, Any]]:
    """One conversation with every role, content part type and tool call type of the SDK, and
    the optional keys absent, null or set (each message a valid SDK param)."""
    developer: ChatCompletionDeveloperMessageParam = {
        "role": "developer",
        "content": [{"type": "text", "text": "You investigate incidents. Be brief."}],
    }
    system: ChatCompletionSystemMessageParam = {
        "role": "system",
        "content": "Tools: kubectl, logs, grep.",
        "name": "ops-policy",
    }
    ask: ChatCompletionUserMessageParam = {
        "role": "user",
        "name": "alice",
        "content": [
            {"type": "text", "text": "payments-api returns 502 since 10:42 UTC; see the graph"},
            {
                "type": "image_url",
                "image_url": {"url": "https://example.com/g.png", "detail": "low"},
            },
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
            {"type": "file", "file": {"file_id": "file-abc123"}},
            {"type": "file", "file": {"file_data": "aGVsbG8=", "filename": "notes.txt"}},
        ],
    }
    # tool_calls and no content key at all (the case)
    call_pods: ChatCompletionAssistantMessageParam = {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "call_pods",
                "type": "function",
                "function": {"name": "kubectl", "arguments": _args(cmd="get pods -n payments")},
            }
        ],
    }
    pods: ChatCompletionToolMessageParam = {
        "role": "tool",
        "tool_call_id": "call_pods",
        "content": "payments-api-7d9f-x2 0/1 CrashLoopBackOff 14 restarts",
    }
    # content null, a function call and a custom tool call side by side, a name
    call_two: ChatCompletionAssistantMessageParam = {
        "role": "assistant",
        "content": None,
        "name": "investigator",
        "tool_calls": [
            {
                "id": "call_logs",
                "type": "function",
                "function": {"name": "logs", "arguments": _args(pod="payments-api-7d9f-x2")},
            },
            {
                "id": "call_grep",
                "type": "custom",
                "custom": {"name": "grep", "input": "OOMKilled /var/log/payments/*.log"},
            },
        ],
    }
    logs: ChatCompletionToolMessageParam = {
        "role": "tool",
        "tool_call_id": "call_logs",
        "content": [
            {"type": "text", "text": "java.lang.OutOfMemoryError: Java heap space"},
            {"type": "text", "text": "Exit Code: 137"},
        ],
    }
    grep: ChatCompletionToolMessageParam = {
        "role": "tool",
        "tool_call_id": "call_grep",
        "content": "/var/log/payments/app.log:812: OOMKilled",
    }
    # OpenAI's deprecated function calling: function_call, then a role "function" result
    legacy_call: ChatCompletionAssistantMessageParam = {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "get_limits", "arguments": _args(deployment="payments-api")},
    }
    legacy_result: ChatCompletionFunctionMessageParam = {
        "role": "function",
        "name": "get_limits",
        "content": "memory limit 512Mi",
    }
    legacy_again: ChatCompletionAssistantMessageParam = {
        "role": "assistant",
        "function_call": {"name": "get_limits", "arguments": ""},
        "audio": None,
        "refusal": None,
    }
    legacy_empty: ChatCompletionFunctionMessageParam = {
        "role": "function",
        "name": "get_limits",
        "content": None,
    }
    # a response message handed back as the SDK's model dumps it (nulls included)
    echoed = ChatCompletionMessage.model_validate(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_rollout",
                    "type": "function",
                    "function": {"name": "kubectl", "arguments": _args(cmd="rollout history")},
                }
            ],
        }
    ).model_dump()
    rollout: ChatCompletionToolMessageParam = {
        "role": "tool",
        "tool_call_id": "call_rollout",
        "content": "REVISION 41 memory 512Mi; REVISION 42 memory 256Mi",
    }
    refused: ChatCompletionAssistantMessageParam = {
        "role": "assistant",
        "content": None,
        "refusal": "I can't delete the namespace.",
    }
    parts: ChatCompletionAssistantMessageParam = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Revision 42 halved the memory limit to 256Mi."},
            {"type": "refusal", "refusal": "I won't roll back without approval."},
        ],
        "audio": {"id": "audio_abc"},
    }
    answer: ChatCompletionAssistantMessageParam = {
        "role": "assistant",
        "content": "Roll back to revision 41 (512Mi).",
    }
    return [
        developer,
        system,
        ask,
        call_pods,
        pods,
        call_two,
        logs,
        grep,
        legacy_call,
        legacy_result,
        legacy_again,
        legacy_empty,
        echoed,
        rollout,
        refused,
        parts,
        answer,
    ]  # type: ignore[list-item]
