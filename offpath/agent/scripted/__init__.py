"""``ScriptedChatModel``: the demo's stand-in for an LLM, replaying fixed investigations.

With no LLM configured (``CHAT_MODEL=scripted``), the demo agent still runs a real
tool loop: this LangChain chat model answers each model call with the next step of a
fixed plan -- an ``AIMessage`` with 1-3 calls of the read-only SRE tools
(:mod:`offpath.agent.sre_tools`), or the plan's final answer. Every answer's text starts
with ``[scripted model]`` and its ``response_metadata["model_name"]`` is ``"scripted"``,
so nobody takes it for an LLM.

It keeps no state (one instance serves every thread of the API process): the plan
comes from the text of the latest request (the latest ``HumanMessage`` that is not a
summary), matched by keywords against :data:`DEMO_REQUESTS` (unknown text: a generic
first look), and the step from the number of AI messages after that request. If a
compaction cut the run's own request into the summary, the plan and step come from the
run's kept AI messages (their ``response_metadata`` names both) or from the request the
summary quotes.

:data:`DEMO_REQUESTS` are six requests that together investigate the incident of the
fixtures (checkout-api p99 at 2.4 s after release 2.14.0 cut its DB pool from 50 to 10):
38 tool calls, about 158,000 chars in all (well past the default 60,000-char compaction
threshold); the run comparing the replicas alone adds about 44,000.

This package holds the model and :func:`answer`; the plans are in :mod:`.plan` (their
types and shared queries), :mod:`.triage` and :mod:`.remedy` (the six investigations), and
choosing a plan and step in :mod:`.selection`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from offpath.agent.scripted.plan import (
    CODES,
    EDGE,
    IN_USE,
    P99,
    PG,
    POOL,
    RATIO,
    REDIS,
    RPS,
    SELECTOR,
    SQL,
    WAITING,
    Plan,
    Step,
)
from offpath.agent.scripted.remedy import ACTION, DEPLOY, REPLICAS
from offpath.agent.scripted.selection import DEMO_REQUESTS, PLANS, generic_plan, locate, plan_for
from offpath.agent.scripted.triage import DATABASE, INFRA, TRIAGE
from offpath.compaction.accounting import approx_tokens, message_chars, total_chars

__all__ = [
    "ACTION",
    "CODES",
    "DATABASE",
    "DEMO_REQUESTS",
    "DEPLOY",
    "EDGE",
    "INFRA",
    "IN_USE",
    "LABEL",
    "MODEL_NAME",
    "P99",
    "PG",
    "PLANS",
    "POOL",
    "Plan",
    "RATIO",
    "REDIS",
    "REPLICAS",
    "RPS",
    "SELECTOR",
    "SQL",
    "ScriptedChatModel",
    "Step",
    "TRIAGE",
    "WAITING",
    "answer",
    "generic_plan",
    "locate",
    "plan_for",
]

#: How every scripted answer starts.
LABEL = "[scripted model]"
MODEL_NAME = "scripted"


class ScriptedChatModel(BaseChatModel):
    """A fake chat model that replays the scripted investigations (see the module docstring).

    ``delay_s``: seconds to sleep before each answer (benchmarks).
    """

    delay_s: float = 0.0
    #: ``busy(thread id)``: a compaction job is being queued or is in flight on the thread
    #: (:meth:`offpath.agent.middleware.OffPathCompaction.busy`); each answer waits while it is
    #: true, at most ``busy_wait_s`` (the demo: the same steps at every run, as with an LLM
    #: slower than the summarizer).
    busy: Callable[[str], bool] | None = None
    busy_wait_s: float = 0.0

    @property
    def _llm_type(self) -> str:
        return MODEL_NAME

    def _wait_while_busy(self) -> None:
        """Wait (at most ``busy_wait_s``) while the run's thread has a job in flight."""
        if self.busy is None or self.busy_wait_s <= 0:
            return
        from offpath.agent.recall import thread_of_run

        session_id = thread_of_run()
        deadline = time.monotonic() + self.busy_wait_s
        while session_id is not None and time.monotonic() < deadline and self.busy(session_id):
            time.sleep(0.05)

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": MODEL_NAME, "delay_s": self.delay_s}

    def bind_tools(
        self, tools: Any, *, tool_choice: Any = None, **kwargs: Any
    ) -> ScriptedChatModel:
        """The plans name their tools themselves: binding returns the model unchanged."""
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        self._wait_while_busy()
        return ChatResult(generations=[ChatGeneration(message=answer(messages))])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)
        await asyncio.to_thread(self._wait_while_busy)
        return ChatResult(generations=[ChatGeneration(message=answer(messages))])


def answer(messages: Sequence[BaseMessage]) -> AIMessage:
    """The scripted answer to a model call over ``messages``."""
    plan, step = locate(messages)
    last = len(plan.steps) - 1
    step = min(step, last)
    current = plan.steps[step]
    calls = [
        {
            "name": name,
            "args": dict(args),
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "tool_call",
        }
        for name, args in current.calls
    ]
    message = AIMessage(
        content=f"{LABEL} {current.text}",
        tool_calls=calls,
        response_metadata={
            "model_name": MODEL_NAME,
            "scripted_plan": plan.key,
            "scripted_step": step,
            "scripted_steps": len(plan.steps),
        },
    )
    n_in, n_out = approx_tokens(total_chars(messages)), approx_tokens(message_chars(message))
    message.usage_metadata = {
        "input_tokens": n_in,
        "output_tokens": n_out,
        "total_tokens": n_in + n_out,
    }
    return message
