"""The importer reads every valid OpenAI chat message shape (issue 19, item 6): built with the
OpenAI SDK's own types (``tests/openai_shapes.py``), checked by the API's request model and
converted by :func:`offpath.compaction.formats.to_messages`, as ``/turns`` does."""

from __future__ import annotations

import copy

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from openai_shapes import catalogue, sdk_check, shapes_in, shapes_in_sdk
from pydantic import ValidationError

from offpath.api.schemas.requests import TurnIn
from offpath.compaction.formats import (
    CUSTOM_CALLS,
    LEGACY_CALL_PREFIX,
    ConversationFormatError,
    to_messages,
)
from offpath.compaction.pairing import new_unpaired
from offpath.compaction.turns import validate_turn


def imported(messages: list[dict]) -> list:
    """What ``/turns`` makes of ``messages``: its request model, then the converter."""
    return to_messages(TurnIn.model_validate({"messages": messages}).message_dicts())


def test_the_catalogue_is_valid_for_the_sdk_and_covers_every_shape_it_defines():
    messages = catalogue()
    for m in messages:
        sdk_check(m)
    assert shapes_in(messages) == shapes_in_sdk()


def test_sdk_check_refuses_what_the_sdk_refuses():
    """The check above can fail: a bad part type, a custom call without input."""
    with pytest.raises(ValidationError):
        sdk_check({"role": "user", "content": [{"type": "video", "video": {}}]})
    with pytest.raises(ValidationError):
        sdk_check(
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "custom", "custom": {}}]}
        )


def test_every_sdk_shape_is_imported_with_its_content_calls_and_names():
    source = catalogue()
    out = imported(copy.deepcopy(source))
    assert [type(m) for m in out] == [
        SystemMessage,  # developer
        SystemMessage,
        HumanMessage,
        AIMessage,  # tool_calls, no content key
        ToolMessage,
        AIMessage,  # content null, function + custom call
        ToolMessage,
        ToolMessage,
        AIMessage,  # function_call
        ToolMessage,  # role function
        AIMessage,
        ToolMessage,
        AIMessage,  # ChatCompletionMessage.model_dump()
        ToolMessage,
        AIMessage,  # refusal
        AIMessage,  # text + refusal parts
        AIMessage,
    ]
    developer, system, ask, call_pods, _, call_two, logs, grep, legacy, result, *rest = out
    assert developer.additional_kwargs["__openai_role__"] == "developer"
    assert developer.content == source[0]["content"]
    assert system.name == "ops-policy" and ask.name == "alice"
    assert ask.content == source[2]["content"]  # every part kept as sent
    assert call_pods.content == "" and call_pods.tool_calls[0]["args"] == {
        "cmd": "get pods -n payments"
    }
    assert call_two.name == "investigator"
    assert [(c["id"], c["name"], c["args"]) for c in call_two.tool_calls] == [
        ("call_logs", "logs", {"pod": "payments-api-7d9f-x2"}),
        ("call_grep", "grep", {"input": "OOMKilled /var/log/payments/*.log"}),
    ]
    assert call_two.additional_kwargs[CUSTOM_CALLS] == ["call_grep"]
    assert logs.content == source[6]["content"] and grep.tool_call_id == "call_grep"
    assert legacy.tool_calls == [
        {
            "name": "get_limits",
            "args": {"deployment": "payments-api"},
            "id": f"{LEGACY_CALL_PREFIX}get_limits",
            "type": "tool_call",
        }
    ]
    assert "function_call" not in legacy.additional_kwargs
    assert result.tool_call_id == f"{LEGACY_CALL_PREFIX}get_limits" and result.name == "get_limits"
    again, empty, echoed, _, refused, parts, answer = rest
    assert again.tool_calls[0]["args"] == {} and empty.content == ""
    assert "audio" not in again.additional_kwargs and "annotations" not in echoed.additional_kwargs
    assert echoed.tool_calls[0]["id"] == "call_rollout"
    assert refused.additional_kwargs["refusal"] == "I can't delete the namespace."
    assert parts.content == source[15]["content"]
    assert parts.additional_kwargs["audio"] == {"id": "audio_abc"}
    assert answer.content == "Roll back to revision 41 (512Mi)."


def test_the_imported_turn_pairs_every_call_with_its_result():
    out = imported(catalogue())
    accepted, warnings = validate_turn(
        [], out, max_messages=100, max_message_chars=100_000, open_calls=None
    )
    assert warnings == []
    assert new_unpaired([], accepted) == set()


def test_a_legacy_function_result_in_a_later_turn_answers_the_call_before_it():
    first = imported([catalogue()[8]])  # the assistant's function_call
    second = imported([catalogue()[9]])  # its role "function" result, posted on its own
    _, warnings = validate_turn(
        first, second, max_messages=10, max_message_chars=10_000, open_calls=None
    )
    assert warnings == []


@pytest.mark.parametrize(
    ("message", "says"),
    [
        ({"role": "user"}, "content"),
        ({"role": "tool", "content": "x"}, "tool_call_id"),
        ({"role": "function", "content": "x"}, "name"),
        (
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}],
            },
            "arguments",
        ),
    ],
)
def test_what_the_sdk_refuses_the_request_model_refuses_too(message, says):
    with pytest.raises(ValidationError):
        sdk_check(message)
    with pytest.raises(ValidationError) as exc:
        TurnIn.model_validate({"messages": [message]})
    assert says in str(exc.value)


def test_a_legacy_call_with_arguments_that_are_not_json_is_refused_by_name():
    bad = {"role": "assistant", "function_call": {"name": "f", "arguments": "{nope"}}
    sdk_check(bad)  # the SDK lets it through; offpath refuses it, saying why
    with pytest.raises(ConversationFormatError, match="not valid JSON"):
        imported([bad])
