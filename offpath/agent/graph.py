"""The API's own chat agent: a LangChain v1 ``create_agent`` agent with offpath's middleware.

Compiled once per process by the API (chat runs, imported turns, patches between runs).
A process that only writes threads between runs (the worker) compiles :func:`thread_graph`
instead: the same state channels and node names with nothing to run, so a patch through
either writes the same checkpoint and every key of the thread's state survives it
(DESIGN.md invariant 1: a graph with a narrower state schema would write a checkpoint
without the keys it does not know).

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
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.outputs import ChatResult
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
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
    (:func:`api_graph`): the API's runtime, which runs chat turns and patches through them."""
    return Runtime.open(settings, agent=api_graph, **kwargs)


#: The run metadata ``create_agent`` gives the graph it compiles; LangGraph copies it into the
#: metadata of every checkpoint the graph writes, a patch's included.
AGENT_METADATA = {"ls_integration": "langchain_create_agent"}

#: The middleware hooks ``create_agent`` makes a node of, named ``<middleware>.<hook>``, in
#: the order it adds them (after ``model`` and ``tools``).
NODE_HOOKS = ("before_agent", "before_model", "after_model", "after_agent")


def hook_nodes(middleware: type[AgentMiddleware]) -> list[str]:
    """The nodes ``create_agent`` makes of ``middleware``'s hooks: each hook the class
    defines, sync or async, as ``<class name>.<hook>``."""
    base = AgentMiddleware
    return [
        f"{middleware.__name__}.{hook}"
        for hook in NODE_HOOKS
        if getattr(middleware, hook) is not getattr(base, hook)
        or getattr(middleware, f"a{hook}") is not getattr(base, f"a{hook}")
    ]


def _nothing(state: Any) -> dict[str, Any]:
    return {}


def thread_graph(rt: Runtime) -> tuple[CompiledStateGraph, str]:
    """A graph with the API agent's state channels (its ``messages`` reducer, offpath's private
    key, ``context``), node names and run metadata, on ``rt``'s checkpointer, and its last
    node; its nodes do nothing and it has no chat model, tools or middleware. A patch through
    it (``update_state`` as the last node) writes the checkpoint a patch through
    :func:`api_graph` writes: the :data:`~offpath.coordination.runtime.GraphFactory` of
    :func:`open_thread_writer`."""
    from offpath.agent.middleware.hooks import OffPathCompaction

    class ThreadState(OffPathCompaction.state_schema, AgentState):  # type: ignore[misc]
        """The API agent's state: the middleware's keys, then the agent's (which win)."""

    graph = StateGraph(ThreadState)
    # "tools": the middleware always gives the agent its recall tool (AGENT_TOOLS add to it)
    nodes = ["model", "tools", *hook_nodes(OffPathCompaction)]
    for node in nodes:
        graph.add_node(node, _nothing)
    for source, target in zip([START, *nodes], [*nodes, END], strict=True):
        graph.add_edge(source, target)
    compiled = graph.compile(checkpointer=rt.checkpoints.saver).with_config(metadata=AGENT_METADATA)
    return compiled, end_node(compiled)


def open_thread_writer(settings: Settings, **kwargs: Any) -> Runtime:
    """:meth:`Runtime.open` (same keyword arguments) with :func:`thread_graph`: the runtime of
    a process that writes threads only between runs (the worker), with no chat agent."""
    return Runtime.open(settings, agent=thread_graph, **kwargs)
