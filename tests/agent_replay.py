"""A recorded agent transcript replayed as a live LangChain ``create_agent`` run.

Shared by the middleware tests (``tests/integration/test_middleware_runs.py``) and the
benchmarks (``bench/peak.py``, ``bench/middleware.py``):

* :class:`TranscriptModel`: a chat model that answers with the transcript's AI messages in
  order (optionally after a delay) and records what each call was sent;
* :func:`scripted_tools`: one tool per name the transcript calls, answering each call with
  its recorded result;
* :func:`replay_script`: the parts of a single-request transcript a run needs (system
  prompt, request, the model's replies, the tools).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import InjectedToolCallId, StructuredTool
from pydantic import BaseModel, ConfigDict

__all__ = ["AnyArgs", "ReplayScript", "TranscriptModel", "replay_script", "scripted_tools"]


class TranscriptModel(BaseChatModel):
    """Answers with the transcript's AI messages in order; records what each call was sent.

    ``delay_s``: how long each call takes. ``record``: keep each call's messages in
    ``calls`` (False: keep only their count, for runs on very long threads).
    """

    replies: list[AIMessage]
    calls: list[list[BaseMessage]] = []
    delay_s: float = 0.0
    record: bool = True
    n_calls: int = 0

    @property
    def _llm_type(self) -> str:
        return "transcript"

    def bind_tools(self, tools: Any, **kwargs: Any) -> TranscriptModel:
        return self

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any):
        if self.record:
            self.calls.append(list(messages))
        self.n_calls += 1
        time.sleep(self.delay_s)
        reply = self.replies[self.n_calls - 1]
        return ChatResult(generations=[ChatGeneration(message=reply)])


class AnyArgs(BaseModel):
    model_config = ConfigDict(extra="allow")
    tool_call_id: Annotated[str, InjectedToolCallId]


def scripted_tools(messages: Sequence[BaseMessage]) -> list[StructuredTool]:
    """One tool per name the transcript calls, answering each call with its recorded result."""
    results = {m.tool_call_id: m.content for m in messages if m.type == "tool"}
    names = {c["name"] for m in messages for c in getattr(m, "tool_calls", None) or []}

    def answer(tool_call_id: str, **_: Any) -> str:
        return results.get(tool_call_id, "(no recorded result)")

    return [
        StructuredTool.from_function(
            answer, name=name, description=f"replays {name}", args_schema=AnyArgs
        )
        for name in sorted(names)
    ]


@dataclass(frozen=True)
class ReplayScript:
    """What a live run of a single-request transcript needs."""

    system: SystemMessage | None
    request: HumanMessage
    replies: list[AIMessage]
    tools: list[StructuredTool]


def replay_script(messages: Sequence[BaseMessage], end_id: str) -> ReplayScript:
    """The system prompt, the (first) request, the model's replies and the scripted tools of
    ``messages``. A transcript whose last AI message still calls a tool (a ``submit``
    command) gets a closing text reply with id ``end_id``, so the run ends."""
    system = messages[0] if isinstance(messages[0], SystemMessage) else None
    request = next(m for m in messages if isinstance(m, HumanMessage))
    replies = [m for m in messages if isinstance(m, AIMessage)]
    if replies[-1].tool_calls:
        replies.append(AIMessage(id=end_id, content="Submitted."))
    return ReplayScript(system, request, replies, scripted_tools(messages))
