"""Request, answer and error bodies of the API, as pydantic models (and so in its OpenAPI
document, which a schema-driven fuzzer reads: ``tests/integration/test_fuzz.py``).

Requests: :class:`ChatIn`, :class:`TurnIn` (its ``messages`` one of three shapes: OpenAI
chat format, LangChain transcript dicts, serialized LangChain messages, by role or type).
Answers: one model per route (``*Out``); the routes build plain dicts and FastAPI checks
them against these (``response_model_exclude_unset``: a key a route leaves out stays out).
Errors: :class:`Problem` (``{"detail": str}``), :class:`Invalid` for 422 (with ``errors``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from .limits import unstorable


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


# --- the messages of a turn --------------------------------------------------------------------

#: A message's content: text, or a list of content blocks (text, image, file...).
Content = str | list[str | dict[str, Any]]
#: Message ids and tool-call ids: ``/turns`` refuses a call without one.
CallId = Annotated[str, Field(min_length=1)]
ToolName = Annotated[str, Field(min_length=1)]


class _Open(BaseModel):
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


class OpenAIFunction(_Open):
    name: ToolName
    arguments: str | dict[str, Any] = Field(
        description="The call's arguments: a JSON object, as text (OpenAI) or as an object"
    )


class OpenAIToolCall(_Open):
    id: CallId
    type: Literal["function"] = "function"
    function: OpenAIFunction


class LangChainToolCall(_Open):
    model_config = ConfigDict(json_schema_extra=_not_keys("function"))

    id: CallId
    name: ToolName
    args: dict[str, Any]
    type: Literal["tool_call"] | None = None


class OpenAICustom(_Open):
    name: ToolName
    input: str = Field(description="The custom tool's input, as text")


class OpenAICustomToolCall(_Open):
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


class _Fields(_Open):
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


class OpenAIFunctionResult(_Open):
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


class SerializedData(_Open):
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
    def validate_in_steps(cls, data: Any) -> tuple[TurnIn | None, list[dict[str, Any]]]:
        """``(turn, [])`` or ``(None, errors)`` as FastAPI's validation gives them (``loc``
        from ``body``), the same turn and errors, but one message at a time: one validation
        of a 10,000-message turn is one call into pydantic-core that holds the GIL, and so
        the API's event loop, for ~200 ms (issue 20, item 1; :class:`api.limits.OffLoopBody`
        runs this in a worker thread)."""
        messages = data.get("messages") if isinstance(data, Mapping) else None
        if not isinstance(messages, list) or not messages:
            try:  # not a turn's shape: pydantic says how, at once
                return cls.model_validate(data), []
            except ValidationError as exc:
                return None, _located(exc, ("body",))
        kept = {k: v for k, v in data.items() if k in cls.model_fields}
        if (problem := unstorable(kept)) is not None:
            return None, [
                {
                    "type": "value_error",
                    "loc": ("body",),
                    "msg": f"Value error, {problem}",
                    "input": {},
                    "ctx": {"error": ValueError(problem)},
                }
            ]
        items, errors = [], []
        for i, item in enumerate(messages):
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


def _located(exc: ValidationError, where: tuple[Any, ...]) -> list[dict[str, Any]]:
    """pydantic's errors with ``where`` before their ``loc``."""
    return [{**e, "loc": (*where, *e["loc"])} for e in exc.errors(include_url=False)]


_MESSAGE: TypeAdapter[Any] = TypeAdapter(Message)
_STATE: TypeAdapter[Any] = TypeAdapter(dict[str, Any] | None)


# --- answers ----------------------------------------------------------------------------------


class ToolCallOut(BaseModel):
    id: str | None
    name: str
    args: dict[str, Any]


class MessageOut(_Open):
    """A message in the transcript format (``/turns`` reads it back unchanged)."""

    type: str
    id: str | None
    content: Content
    tool_calls: list[ToolCallOut] = Field(default_factory=list, description="AI messages")
    tool_call_id: str = Field(default="", description="Tool messages")
    name: str = ""
    additional_kwargs: dict[str, Any] = Field(default_factory=dict)


class SerializedOut(BaseModel):
    """A message as langchain_core's ``messages_to_dict`` writes it (lossless)."""

    type: str
    data: dict[str, Any]


class RunOut(BaseModel):
    """What a chat turn's run added to the thread."""

    messages: int
    chars: int
    tool_calls: int
    compacted: bool = Field(description="A compaction was applied during the run")


class ChatOut(BaseModel):
    session_id: str
    reply: MessageOut
    messages: int = Field(description="Messages in the thread now")
    chars: int = Field(description="The thread's size now, in chars")
    run: RunOut


class WarningOut(BaseModel):
    code: str = Field(description="orphan_tool_result")
    message: str


class TurnOut(BaseModel):
    session_id: str
    appended: int
    messages: int = Field(description="Messages in the thread now")
    chars: int = Field(description="The thread's size now, in chars")
    warnings: list[WarningOut]


#: A session's kind: ``api`` (a thread of offpath's API, in offpath's checkpointer) or
#: ``own agent`` (a thread of a team's own ``create_agent`` app with ``OffPathCompaction``,
#: in the agent's checkpointer, which offpath reads and never writes; issue 21, item 1).
Kind = Literal["api", "own agent"]
KIND = Field(
    description="api: a thread of offpath's API; own agent: a thread of a team's own agent "
    "(OffPathCompaction), read from the agent's checkpointer, never written by offpath"
)


class SessionOut(BaseModel):
    session_id: str
    kind: Kind = KIND
    messages: list[MessageOut] | list[SerializedOut]
    chars: int
    state: dict[str, Any] = Field(description="The thread's other state keys")


class LostFactOut(BaseModel):
    value: str
    kind: str = Field(description="The fact guard's kind: path, sha, identifier, quantity...")
    message_id: str = Field(description="The message it was first seen in (recall reads it)")


class GroundTruthOut(BaseModel):
    facts: int = Field(description="Ground-truth facts in what left the model's view")
    lost: list[str] = Field(description="Those neither the summary nor the kept part holds")


class LossOut(BaseModel):
    """What an applied compaction took out of the model's view (issue 19): the messages it
    removed, kept tool results it shortened, and the facts of both (the fact guard's
    extractor) that neither its summary nor the kept messages hold."""

    messages_removed: int
    chars_removed: int
    results_shortened: int = Field(description="Kept tool results it shortened in place")
    chars_shortened: int = Field(description="Chars cut from them")
    facts: int = Field(description="Distinct facts in what left the model's view")
    facts_lost: int = Field(description="Of them, in neither the summary nor the kept part")
    lost: list[LostFactOut] = Field(description="The lost facts, most important first (50 at most)")
    ground_truth: GroundTruthOut | None = Field(
        description="Facts chosen independently of the extractor (benchmarks), if given"
    )


class LossErrorOut(BaseModel):
    error: str = Field(description="Why the loss report could not be made")


class JobOut(BaseModel):
    job_id: str
    status: Literal["queued", "running", "prepared", "applied", "skipped", "failed", "reverted"]
    reason: str | None
    reason_code: str | None
    attempts: int
    published: bool
    chars_when_queued: int | None
    chars_at_apply: int | None = Field(
        default=None, description="The thread's size just before its compaction was applied"
    )
    messages_removed: int | None
    chars_removed: int | None
    chars_saved: int | None = Field(
        default=None, description="Its real reduction: the size before less the size after"
    )
    summarizer: str | None
    latency_ms: int | None
    loss: LossOut | LossErrorOut | None = Field(
        default=None, description="Applied (or reverted) compactions: what left the model's view"
    )
    created_at: str
    updated_at: str


class LeaseOut(BaseModel):
    job_id: str
    state: Literal["queued", "running", "prepared", "done", "skipped", "backoff"]


class BackoffOut(BaseModel):
    failures_in_a_row: int
    seconds: float
    until: str


class CompactionsOut(BaseModel):
    session_id: str
    jobs: list[JobOut] = Field(description="Oldest first")
    lease: LeaseOut | None = Field(description="Who holds the thread now")
    backoff: BackoffOut | None = Field(description="The failure backoff, while it runs")


class JobCounts(BaseModel):
    queued: int
    running: int
    prepared: int
    applied: int
    skipped: int
    failed: int
    reverted: int = Field(description="Applied compactions undone (POST .../revert)")


class Spread(BaseModel):
    """Percentiles (nearest rank) over the latest values, in ms; null when there are none."""

    count: int
    p50: float | None
    p99: float | None


class ReasonCounts(BaseModel):
    skipped: dict[str, int] = Field(description="reason code -> jobs")
    failed: dict[str, int] = Field(description="reason code -> jobs")


class LlmTokens(BaseModel):
    """Tokens the summarizer's LLM reported (its prompt holds the removed messages: ``input``
    is the real count beside the chars/4 estimate); ``events``: compactions that reported any
    (the offline summarizer reports none)."""

    input: int
    output: int
    events: int


class FailureOut(BaseModel):
    session_id: str
    job_id: str
    reason_code: str | None
    reason: str | None
    at: str | None = Field(description="When it failed, ISO 8601")


class StatsSummary(_Open):
    total_summarizations: int
    total_chars_compacted: int = Field(
        description="The real reduction: each compaction's thread size before less its size "
        "after (a summary folded into a later one is not saved twice), reverted ones left out"
    )
    sessions_compacted: int
    approx_tokens_saved: int = Field(description="total_chars_compacted / 4")
    jobs: JobCounts = Field(description="Jobs by status (queued since `since`)")
    fallback_maskings: int
    jobs_by_reason: ReasonCounts
    lag_ms: Spread = Field(description="Threshold crossed (or job queued, if later) -> applied")
    summarizer_latency_ms: Spread = Field(description="One summarizer call")
    llm_tokens: LlmTokens
    recent_failures: list[FailureOut] = Field(description="The latest failed jobs, newest first")
    since: str | None = Field(description="The window's start (ISO 8601); null: all time")


class StatsOut(BaseModel):
    summary: StatsSummary


class SessionStatsOut(BaseModel):
    """One session's figures: its thread now, and ``/stats`` for it alone."""

    session_id: str
    messages: int = Field(description="Messages in the thread now")
    chars: int = Field(description="The thread's size now, in chars")
    summary: StatsSummary


# --- session admin ----------------------------------------------------------------------------


class SessionRow(BaseModel):
    session_id: str
    tenant: str
    kind: Kind = KIND
    messages: int | None = Field(
        description="Messages after offpath's last write (null: not known)"
    )
    chars: int | None = Field(description="Size in chars after offpath's last write")
    compactions: int = Field(description="Applied compactions")
    last_activity: str | None = Field(description="The last turn, ISO 8601")
    jobs_in_flight: int = Field(description="Jobs queued or running")


class SessionsOut(BaseModel):
    sessions: list[SessionRow]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null: last")


class CompactOut(BaseModel):
    """``queued``: a new job (follow it at ``/sessions/{id}/compactions``); ``applied``: a
    compaction prepared ahead was applied at once; ``prepared`` (a team's own agent's
    thread): a compaction is prepared and its agent's middleware applies it at the thread's
    next model call. ``detail`` says what happens next."""

    job_id: str
    status: Literal["queued", "applied", "prepared"]
    kind: Kind = KIND
    detail: str = Field(description="What happens next, in words")


class RevertOut(BaseModel):
    """A reverted compaction: its originals are back in the thread in place of its summary."""

    job_id: str
    status: Literal["reverted"]
    messages_restored: int = Field(description="Removed messages put back")
    results_restored: int = Field(description="Kept tool results it had shortened, restored")
    messages: int = Field(description="Messages in the thread now")
    chars: int = Field(description="The thread's size now, in chars")


class ArchivedOut(BaseModel):
    """One original message a compaction removed (transcript format, plus where it was)."""

    message_id: str
    summary_id: str = Field(description="The id of the summary message that replaced it")
    job_id: str
    position: int = Field(description="Its index in the thread when it was removed")
    created_at: str | None = Field(description="When it was archived, ISO 8601")
    type: str
    content: Content
    tool_calls: list[ToolCallOut] = Field(default_factory=list, description="AI messages")
    tool_call_id: str | None = Field(default=None, description="Tool messages")
    name: str | None = None


class ArchiveOut(BaseModel):
    session_id: str
    messages: list[ArchivedOut] = Field(description="Oldest compaction first")
    total: int = Field(description="Archived originals matching, in all")
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null: last")


class HealthOut(BaseModel):
    """``ok`` when the broker, the database and the checkpointer answer; each says ``ok`` or
    ``error: ...``; ``reconciler`` says when it last ran (reported, not required)."""

    ok: bool
    broker: str
    database: str
    checkpointer: str
    reconciler: str


class QueueConsumersOut(BaseModel):
    consumers: int = Field(description="Workers consuming the queue")
    workers: list[str] = Field(description="Their Celery node names")


class ReadyOut(HealthOut):
    """``/healthz``'s checks and the workers consuming each queue offpath publishes to:
    ``ok`` only when every check answers and every queue has a worker; ``workers`` says
    why in one line (naming the queue and the broker)."""

    workers: str = Field(description="`ok: ...`, `unknown: ...` or why not ready")
    queues: dict[str, QueueConsumersOut] = Field(description="By queue; empty when unknown")
    checked_s_ago: float | None = Field(
        description="Age of the workers' answer (cached a few seconds), in seconds"
    )


# --- errors -----------------------------------------------------------------------------------


class Problem(BaseModel):
    """An error: ``detail`` says what is wrong, in one line."""

    detail: str


class FieldError(BaseModel):
    loc: list[str] = Field(description="Where: body, messages, 0, content...")
    msg: str
    type: str | None


class Invalid(Problem):
    """A request that is not valid: ``detail`` in one line, ``errors`` one per field (the
    input is never echoed)."""

    errors: list[FieldError] = Field(default_factory=list)


def _problem(description: str) -> dict[str, Any]:
    return {"model": Problem, "description": description}


#: The error answers of the routes, for the OpenAPI document.
ERRORS: dict[int | str, dict[str, Any]] = {
    400: _problem("The Host header is not in ALLOWED_HOSTS, or the body could not be read"),
    401: _problem("No API key, or an unknown or revoked one"),
    404: _problem("No such session (or another tenant's)"),
    409: _problem("Another turn (or a compaction job) is in progress on the session"),
    413: _problem("Request body over MAX_REQUEST_BYTES"),
    422: {"model": Invalid, "description": "The request is not valid; nothing was written"},
    502: _problem("The chat model failed; the turn was taken back"),
    503: _problem("No LLM is configured"),
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The entries of :data:`ERRORS` for ``codes``."""
    return {code: ERRORS[code] for code in codes}


#: What every keyed route may answer: a bad Host header, no key.
ANY_ROUTE = errors(400, 401)
#: A read of one session.
READ = errors(400, 401, 404, 422)
#: A write to one session (a body: 413; its lock: 409).
WRITE = errors(400, 401, 404, 409, 413, 422)
