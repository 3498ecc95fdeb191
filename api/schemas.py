"""Request and error bodies of the API, as pydantic models (and so in its OpenAPI document)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from api.limits import lone_surrogate


class _Checked(BaseModel):
    @model_validator(mode="before")
    @classmethod
    def _no_lone_surrogates(cls, data: Any) -> Any:
        if (where := lone_surrogate(data)) is not None:
            raise ValueError(f"{where}: a lone UTF-16 surrogate is not text (send valid UTF-8)")
        return data


class ChatIn(_Checked):
    content: str = Field(min_length=1, description="The user's message")


class TurnIn(_Checked):
    messages: list[dict[str, Any]] = Field(
        min_length=1,
        description="The turn's messages: OpenAI chat format (role/content/tool_calls), "
        "LangChain dicts (type/content/tool_calls/tool_call_id) or serialized LangChain messages",
    )
    state: dict[str, Any] | None = Field(
        default=None,
        description="Other keys of the thread's state to set (kept across compactions)",
    )


class Problem(BaseModel):
    """An error: ``detail`` says what is wrong, in one line."""

    detail: str


class Invalid(Problem):
    """A request that is not valid: ``detail`` in one line, ``errors`` one per field (the
    input is never echoed)."""

    errors: list[dict[str, Any]] = Field(default_factory=list)


#: The error answers every route may give, for the OpenAPI document.
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "No API key, or an unknown or revoked one"},
    404: {"model": Problem, "description": "No such session (or another tenant's)"},
    413: {"model": Problem, "description": "Request body over MAX_REQUEST_BYTES"},
    422: {"model": Invalid, "description": "The request is not valid; nothing was written"},
}
