"""Request bodies: :class:`ChatIn` (a chat turn) and :class:`TurnIn` (a turn produced
elsewhere, validated one message at a time off the event loop: :meth:`TurnIn.validate_in_steps`);
a value no store keeps as sent is refused (422).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field, TypeAdapter, ValidationError, model_validator

from offpath.api.limits.inner import JsonBudget, check_message
from offpath.stores.values import unstorable

from .messages import Message


class _Checked(BaseModel):
    """A request body: refused (422) if a value in it cannot be stored as sent."""

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        if isinstance(data, Mapping):  # the fields kept (other keys are ignored)
            kept = {k: v for k, v in data.items() if k in cls.model_fields}
            if (problem := unstorable(kept)) is not None:
                raise ValueError(problem)
        return data


class ChatIn(_Checked):
    content: str = Field(min_length=1, description="The user's message")


class TurnIn(_Checked):
    messages: list[Message] = Field(
        min_length=1,
        description="The turn's messages: OpenAI chat format (role/content/tool_calls), "
        "LangChain dicts (type/content/tool_calls/tool_call_id) or serialized LangChain messages",
    )
    state: dict[str, Any] | None = Field(
        default=None,
        description="Other keys of the thread's state to set (kept across compactions)",
    )

    def message_dicts(self) -> list[dict[str, Any]]:
        """The messages as the client sent them (plain dicts: keys it left out stay out)."""
        return [m.model_dump(exclude_unset=True) for m in self.messages]

    @classmethod
    def validate_in_steps(
        cls, data: Any, budget: JsonBudget
    ) -> tuple[TurnIn | None, list[dict[str, Any]]]:
        """``(turn, [])`` or ``(None, errors)`` as FastAPI's validation gives them (``loc``
        from ``body``), the same turn and errors, but one message at a time: one validation
        of a 10,000-message turn is one call into pydantic-core that holds the GIL, and so
        the API's event loop, for ~200 ms (issue 20, item 1; :class:`api.limits.OffLoopBody`
        runs this in a worker thread). Before a message is validated, the JSON inside its
        strings (an OpenAI tool call's ``arguments``...) is read once with the body's rules,
        within ``budget`` (:func:`api.limits.inner.check_message`): a problem there is one
        ``value_error`` on the body, as for a value of the body itself."""
        messages = data.get("messages") if isinstance(data, Mapping) else None
        if not isinstance(messages, list) or not messages:
            try:  # not a turn's shape: pydantic says how, at once
                return cls.model_validate(data), []
            except ValidationError as exc:
                return None, _located(exc, ("body",))
        kept = {k: v for k, v in data.items() if k in cls.model_fields}
        if (problem := unstorable(kept)) is not None:
            return None, [_refused(problem)]
        items, errors = [], []
        for i, item in enumerate(messages):
            item, problem = check_message(item, f"messages[{i}]", budget)
            if problem is not None:
                return None, [_refused(problem)]
            try:
                items.append(_MESSAGE.validate_python(item))
            except ValidationError as exc:
                errors += _located(exc, ("body", "messages", i))
                if len(errors) >= 20:
                    break
        try:
            state = _STATE.validate_python(data.get("state"))
        except ValidationError as exc:
            errors += _located(exc, ("body", "state"))
        if errors:
            return None, errors
        fields = {"messages": items, **({"state": state} if "state" in data else {})}
        return cls.model_construct(_fields_set=set(fields), **fields), []


def _refused(problem: str) -> dict[str, Any]:
    """The error of a value no store keeps, or of JSON inside a string over a limit: one
    ``value_error`` on the whole body (the field is named in its message)."""
    return {
        "type": "value_error",
        "loc": ("body",),
        "msg": f"Value error, {problem}",
        "input": {},
        "ctx": {"error": ValueError(problem)},
    }


def _located(exc: ValidationError, where: tuple[Any, ...]) -> list[dict[str, Any]]:
    """pydantic's errors with ``where`` before their ``loc``."""
    return [{**e, "loc": (*where, *e["loc"])} for e in exc.errors(include_url=False)]


_MESSAGE: TypeAdapter[Any] = TypeAdapter(Message)
_STATE: TypeAdapter[Any] = TypeAdapter(dict[str, Any] | None)
