"""The API's own chat agent: a LangChain v1 ``create_agent`` agent with offpath's middleware.

Compiled once per process and shared by the API (chat runs, imported turns) and
the worker (the compaction patch between runs), so every key of the thread's
state survives a patch (DESIGN.md invariant 1: a graph with a narrower state
schema would write a checkpoint without the keys it does not know).

* Tools: ``AGENT_TOOLS=package.module:attribute``, a list of LangChain tools (by
  default the read-only SRE demo toolset, ``offpath.agent.sre_tools:SRE_TOOLS``).
* Model: ``ChatOpenAI`` when an LLM is configured; ``CHAT_MODEL=scripted`` gives the
  demo's scripted model; otherwise none (chat runs answer 503).
* State: the agent's (``messages``, ...), offpath's private size key, and
  ``context``, a dict of the thread's other keys (set by ``POST /sessions/{id}/turns``
  with ``"state"``).

Writes from outside a run (an imported turn, a patch) go in as the graph's last
node before its end (:func:`end_node`), so the thread still reads as finished.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NotRequired

from langchain.agents import AgentState as _AgentState
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.outputs import ChatResult
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END
from langgraph.graph.state import CompiledStateGraph

from offpath.compaction.settings import Settings
from offpath.coordination.runtime import Runtime

if TYPE_CHECKING:
    from offpath.agent.middleware import OffPathCompaction

SYSTEM_PROMPT = (
    "You are an SRE assistant investigating incidents. Use the read-only tools to look at "
    "logs, metrics, recent deploys and pod status; be specific (numbers, names, timestamps)."
)


#: Seconds the scripted model (``CHAT_MODEL=scripted``) takes per answer.
SCRIPTED_DELAY_S = 0.25


class AgentState(_AgentState):
    """The API agent's state: the agent's keys and ``context``, the thread's other keys."""

    context: NotRequired[dict[str, Any]]


class NoChatModel(RuntimeError):
    """A chat turn was asked for but no LLM is configured."""


class AgentToolsError(ValueError):
    """``AGENT_TOOLS`` does not name a list of LangChain tools; the message says why."""


class _Unconfigured(BaseChatModel):
    """Stands in for the chat model when none is configured: the graph still compiles (the
    worker patches through it), and a chat run fails with :class:`NoChatModel`."""

    @property
    def _llm_type(self) -> str:
        return "unconfigured"

    def bind_tools(self, tools: Any, **kwargs: Any) -> _Unconfigured:
        return self

    def _generate(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        raise NoChatModel("no LLM configured")


def load_tools(spec: str) -> list[BaseTool]:
    """The tools ``spec`` (``package.module:attribute``) names; empty spec: none.

    Raises :class:`AgentToolsError` naming what is wrong.
    """
    if not spec:
        return []
    module_name, _, attr = spec.partition(":")
    try:
        value: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError) as exc:
        raise AgentToolsError(f"AGENT_TOOLS={spec!r}: {exc}") from None
    tools = list(value) if isinstance(value, Sequence) else None
    if tools is None or not all(isinstance(t, BaseTool) for t in tools):
        raise AgentToolsError(f"AGENT_TOOLS={spec!r} is not a list of LangChain tools")
    return tools


def chat_model(
    settings: Settings, busy: Callable[[str], bool] | None = None
) -> BaseChatModel | None:
    """The chat agent's model: ``CHAT_MODEL=scripted`` (the demo), ``ChatOpenAI`` when an LLM
    is configured, else None. ``busy(thread id)``: a compaction job is being queued or is in
    flight on the thread; the scripted model waits while it is, at most
    ``SCRIPTED_JOB_WAIT_S`` (0: it is not asked)."""
    if settings.chat_model == "scripted":
        from offpath.agent.scripted import ScriptedChatModel

        # paced like a fast LLM, so that compaction has a run to happen in
        wait = settings.scripted_job_wait_s if busy is not None else 0.0
        return ScriptedChatModel(delay_s=SCRIPTED_DELAY_S, busy=busy, busy_wait_s=wait)
    if not settings.llm_configured:
        return None
    from langchain_openai import ChatOpenAI

    from offpath.llm import OPENAI_DEFAULT_BASE_URL

    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    return ChatOpenAI(
        model=settings.chat_model,
        api_key=key or "not-needed",
        base_url=settings.openai_base_url or OPENAI_DEFAULT_BASE_URL,
        # as the client does for OpenAI's own endpoint (many others do not stream usage)
        stream_usage=True if not settings.openai_base_url else None,
        timeout=settings.summarization_timeout_s,
        max_retries=1,
    )


def build_graph(
    checkpointer: BaseCheckpointSaver,
    middleware: OffPathCompaction,
    model: BaseChatModel | None = None,
    tools: Sequence[BaseTool] = (),
) -> CompiledStateGraph:
    """The agent graph: ``create_agent`` with ``middleware`` (offpath's), on ``checkpointer``."""
    return create_agent(
        model or _Unconfigured(),
        list(tools),
        system_prompt=SYSTEM_PROMPT,
        middleware=[middleware],
        state_schema=AgentState,
        checkpointer=checkpointer,
    )


def end_node(graph: CompiledStateGraph) -> str:
    """The node whose edge leads to the graph's end: a write "as" it leaves nothing to run."""
    (node,) = {e.source for e in graph.get_graph().edges if e.target == END and not e.conditional}
    return node


def api_graph(rt: Runtime) -> tuple[CompiledStateGraph, str]:
    """The API's agent graph for ``rt`` (its settings, checkpointer and client, with
    offpath's middleware patching in-run) and its last node: the
    :data:`~offpath.coordination.runtime.GraphFactory` of :func:`open_runtime`."""
    from offpath.agent.middleware import OffPathCompaction

    middleware = OffPathCompaction(rt.settings, client=rt, patch=True)
    graph = build_graph(
        rt.checkpoints.saver,
        middleware,
        chat_model(rt.settings, middleware.busy),
        load_tools(rt.settings.agent_tools),
    )
    return graph, end_node(graph)


def open_runtime(settings: Settings, **kwargs: Any) -> Runtime:
    """:meth:`Runtime.open` (same keyword arguments) with the API's agent graph
    (:func:`api_graph`): the runtime the API, the worker and the CLI open."""
    return Runtime.open(settings, agent=api_graph, **kwargs)
