"""The messages of a turn (``POST /sessions/{id}/turns``), in the three shapes the API reads:
OpenAI chat format (``role``), LangChain transcript dicts (``type``) and serialized LangChain
messages (``type`` and ``data``), told apart by :func:`shape_of` (:data:`Message`); their tool
calls in either format (:data:`ToolCall`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

#: A message's content: text, or a list of content blocks (text, image, file...).
Content = str | list[str | dict[str, Any]]
#: Message ids and tool-call ids: ``/turns`` refuses a call without one.
CallId = Annotated[str, Field(min_length=1)]
ToolName = Annotated[str, Field(min_length=1)]


class OpenModel(BaseModel):
    """Other keys are kept (they land in the message's ``additional_kwargs``)."""

    model_config = ConfigDict(extra="allow")


def _not_keys(*keys: str, object_data: bool = False) -> dict[str, Any]:
    """JSON schema: an object that has none of ``keys`` (and, with ``object_data``, no object
    under ``data``): how the API tells the three shapes apart (:func:`shape_of`)."""
    cases: list[dict[str, Any]] = [{"required": [k]} for k in keys]
    if object_data:
        cases.append({"required": ["type", "data"], "properties": {"data": {"type": "object"}}})
    return {"not": {"anyOf": cases}}


# OpenAI chat format: role / content / tool_calls [{id, type, function {name, arguments}}]


class OpenAIFunction(OpenModel):
    name: ToolName
    arguments: str | dict[str, Any] = Field(
        description="The call's arguments: a JSON object, as text (OpenAI) or as an object"
    )


class OpenAIToolCall(OpenModel):
    id: CallId
    type: Literal["function"] = "function"
    function: OpenAIFunction


class LangChainToolCall(OpenModel):
    model_config = ConfigDict(json_schema_extra=_not_keys("function"))

    id: CallId
    name: ToolName
    args: dict[str, Any]
    type: Literal["tool_call"] | None = None


class OpenAICustom(OpenModel):
    name: ToolName
    input: str = Field(description="The custom tool's input, as text")


class OpenAICustomToolCall(OpenModel):
    """An OpenAI custom tool call (free-text input): read as a call with ``{"input": ...}``."""

    id: CallId
    type: Literal["custom"]
    custom: OpenAICustom


def _call_shape(call: Any) -> str:
    """A tool call with a ``function`` is in OpenAI's format (as langchain_core reads it), one
    with ``custom`` an OpenAI custom tool call."""
    if isinstance(call, BaseModel):
        call = call.model_dump(exclude_unset=True)
    if isinstance(call, Mapping) and "custom" in call and "function" not in call:
        return "custom"
    return "openai" if isinstance(call, Mapping) and "function" in call else "langchain"


#: A tool call in either format (both message shapes accept both).
ToolCall = Annotated[
    Annotated[LangChainToolCall, Tag("langchain")]
    | Annotated[OpenAIToolCall, Tag("openai")]
    | Annotated[OpenAICustomToolCall, Tag("custom")],
    Discriminator(_call_shape),
]


class _Fields(OpenModel):
    """What OpenAI chat format and LangChain dicts share (they differ in ``role``/``type``)."""

    content: Content | None = Field(description="null is read as empty")
    id: str | None = Field(default=None, description="Unique in the session; made up if absent")
    name: str | None = None
    additional_kwargs: dict[str, Any] | None = None
    response_metadata: dict[str, Any] | None = None


class _HumanFields(_Fields):
    example: bool = Field(default=False, strict=True)


class _AIFields(_Fields):
    tool_calls: list[ToolCall] | None = None
    example: bool = Field(default=False, strict=True)


class _ToolFields(_Fields):
    tool_call_id: str = Field(description="The id of the call this result answers")
    artifact: Any = None
    status: Literal["success", "error"] = "success"


#: JSON schema: OpenAI messages are told apart by ``role``, unless serialized (``data``).
_OPENAI = ConfigDict(json_schema_extra=_not_keys(object_data=True))
#: JSON schema: LangChain dicts have a ``type`` and no ``role``.
_LANGCHAIN = ConfigDict(json_schema_extra=_not_keys("role", object_data=True))


class OpenAISystem(_Fields):
    model_config = _OPENAI
    role: Literal["system", "developer"]


class OpenAIUser(_HumanFields):
    model_config = _OPENAI
    role: Literal["user"]


class OpenAIAssistant(_AIFields):
    model_config = _OPENAI
    role: Literal["assistant"]
    content: Content | None = Field(
        default=None, description="Absent or null beside tool_calls or function_call: empty"
    )


class OpenAIFunctionResult(OpenModel):
    """OpenAI's deprecated function result (``role: "function"``): read as the tool result of
    the nearest earlier unanswered ``function_call`` of that name."""

    model_config = _OPENAI
    role: Literal["function"]
    name: ToolName
    content: str | None = Field(description="null is read as empty")


class OpenAITool(_ToolFields):
    model_config = _OPENAI
    role: Literal["tool"]


OpenAIMessage = Annotated[
    OpenAISystem | OpenAIUser | OpenAIAssistant | OpenAITool | OpenAIFunctionResult,
    Field(discriminator="role"),
]


# LangChain transcript dicts: type / content / tool_calls [{id, name, args}] / tool_call_id / id


class LangChainSystem(_Fields):
    model_config = _LANGCHAIN
    type: Literal["system", "developer"]


class LangChainHuman(_HumanFields):
    model_config = _LANGCHAIN
    type: Literal["human", "user"]


class LangChainAI(_AIFields):
    model_config = _LANGCHAIN
    type: Literal["ai", "assistant"]


class LangChainTool(_ToolFields):
    model_config = _LANGCHAIN
    type: Literal["tool"]


LangChainMessage = Annotated[
    LangChainSystem | LangChainHuman | LangChainAI | LangChainTool, Field(discriminator="type")
]


# serialized LangChain messages (langchain_core's messages_to_dict): {type, data}


class SerializedData(OpenModel):
    content: Content
    id: str | None = None
    name: str | None = None
    additional_kwargs: dict[str, Any] = Field(default_factory=dict)
    response_metadata: dict[str, Any] = Field(default_factory=dict)


class AIData(SerializedData):
    tool_calls: list[LangChainToolCall] = Field(default_factory=list)


class ToolData(SerializedData):
    tool_call_id: str
    artifact: Any = None
    status: Literal["success", "error"] = "success"


class SerializedSystem(BaseModel):
    type: Literal["system", "SystemMessageChunk"]
    data: SerializedData


class SerializedHuman(BaseModel):
    type: Literal["human", "HumanMessageChunk"]
    data: SerializedData


class SerializedAI(BaseModel):
    type: Literal["ai", "AIMessageChunk"]
    data: AIData


class SerializedTool(BaseModel):
    type: Literal["tool", "ToolMessageChunk"]
    data: ToolData


SerializedMessage = Annotated[
    SerializedSystem | SerializedHuman | SerializedAI | SerializedTool,
    Field(discriminator="type"),
]


#: The tags of the message (and tool call) shapes: a validation error's location names the
#: one it was read as (``messages.0.openai.content``), which a person sending the body never
#: wrote (the 422's one line leaves them out).
SHAPE_TAGS = frozenset({"openai", "langchain", "serialized"})


def shape_of(item: Any) -> str | None:
    """Which shape a message dict is, as :func:`offpath.compaction.formats.to_messages` reads
    it: ``type`` with an object ``data``: serialized; else ``role``: OpenAI; else ``type``:
    LangChain; anything else: None (refused)."""
    if isinstance(item, BaseModel):
        item = item.model_dump(exclude_unset=True)
    if not isinstance(item, Mapping):
        return None
    if "type" in item and isinstance(item.get("data"), Mapping):
        return "serialized"
    if "role" in item:
        return "openai"
    if "type" in item:
        return "langchain"
    return None


Message = Annotated[
    Annotated[OpenAIMessage, Tag("openai")]
    | Annotated[LangChainMessage, Tag("langchain")]
    | Annotated[SerializedMessage, Tag("serialized")],
    Discriminator(
        shape_of,
        custom_error_type="message_shape",
        custom_error_message='a message is an object with "role" (OpenAI chat format), '
        '"type" (LangChain) or "type" and "data" (serialized LangChain)',
    ),
]
