"""A message's optional fields read without pydantic's missing-attribute path give what
``getattr(message, name, None)`` gives."""

from __future__ import annotations

from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)

from offpath.compaction.fields import message_field

NAMES = ("tool_calls", "tool_call_id", "name", "id", "content", "no_such_field")


def test_message_field_is_getattr_for_every_kind_of_message():
    call = {"name": "get_pod", "args": {"name": "checkout-api"}, "id": "c1", "type": "tool_call"}
    messages = [
        AIMessage("", tool_calls=[call], id="a1"),
        AIMessage("no calls", id="a2"),
        AIMessageChunk(content="", id="k1"),
        HumanMessage("why is checkout failing?", id="h1"),
        ToolMessage("OOMKilled", tool_call_id="c1", id="t1", name="get_pod"),
        SystemMessage("You are an SRE agent."),
        RemoveMessage(id="r1"),
        # messages allow extra fields: one named like another kind's field is read too
        HumanMessage("pasted", id="h2", tool_calls=[call]),
    ]
    for m in messages:
        for name in NAMES:
            assert message_field(m, name) == getattr(m, name, None), (type(m).__name__, name)
    assert message_field(messages[-1], "tool_calls") == [call]


def test_message_field_of_other_objects_is_getattr():
    class WithProperty:
        @property
        def tool_calls(self):
            return [{"name": "x"}]

    class WithSlots:
        __slots__ = ("tool_call_id",)

        def __init__(self):
            self.tool_call_id = "c9"

    class WithHook:
        def __getattr__(self, name):
            return f"<{name}>"

    for obj in (WithProperty(), WithSlots(), WithHook(), object(), {"tool_calls": []}):
        for name in NAMES:
            assert message_field(obj, name) == getattr(obj, name, None), (obj, name)
