"""The worker patches a thread through :func:`offpath.agent.graph.thread_graph` (no chat
model, no tools, no middleware instance), the API through its whole agent graph: a patch
through either writes the same checkpoint, step for step (its channel values and versions,
the versions each node has seen, its metadata, the pending writes and their task ids), and
the API's next turn and reads go on from it alike. The runs are real ``create_agent`` runs
(a fake chat model calling the SRE demo's tools) on LangGraph's in-memory saver, copied
before the patch so that both patches start from the very same checkpoint ids."""

from __future__ import annotations

import copy
import re
import uuid
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, RemoveMessage
from langgraph.checkpoint.memory import InMemorySaver

from offpath.agent.graph import build_graph, end_node, load_tools, thread_graph
from offpath.agent.middleware.hooks import OffPathCompaction
from offpath.config import load_settings
from offpath.stores.checkpoints import Preloaded, thread_config


class Model(GenericFakeChatModel):
    """Answers from its list; a question that says ``fail`` makes the call raise."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Model:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        last = next(m for m in reversed(messages) if isinstance(m, HumanMessage))
        if "fail" in str(last.content):
            raise RuntimeError("the provider is away")
        return super()._generate(messages, *args, **kwargs)


def answers(start: int = 0) -> Model:
    """The model's answers from the ``start``-th on."""
    call = {"id": "c1", "name": "pod_status", "args": {"service": "checkout-api"}}
    said = [
        AIMessage(id="a1", content="", tool_calls=[call]),
        AIMessage(id="a2", content="One pod is not ready."),
        AIMessage(id="a3", content="Still one."),
    ]
    return Model(messages=iter(said[start:]))


class Saver:
    """A holder for the checkpointer :func:`thread_graph` reads off a runtime."""

    def __init__(self, saver: InMemorySaver) -> None:
        self.checkpoints = self
        self.saver = saver


@pytest.fixture
def settings(tmp_path):
    return load_settings(
        data_dir=str(tmp_path),
        redis_key_prefix=f"test-thread-graph-{uuid.uuid4().hex[:8]}",
        summarization_threshold_chars=10**9,  # the middleware never queues a job here
    )


def api_graph_on(saver: InMemorySaver, settings: Any, start: int = 0) -> Any:
    """The API's agent graph (:func:`build_graph` as ``api_graph`` builds it) on ``saver``."""
    middleware = OffPathCompaction(settings, patch=True)
    return build_graph(saver, middleware, answers(start), load_tools(settings.agent_tools))


def shape(graph: Any) -> dict[str, Any]:
    return {
        "channels": {k: type(c).__name__ for k, c in graph.channels.items()},
        "reducers": {k: repr(getattr(c, "operator", None)) for k, c in graph.channels.items()},
        "nodes": {k: list(n.triggers) for k, n in graph.nodes.items()},
        "end": end_node(graph),
        "metadata": graph.config.get("metadata"),
    }


def test_the_thread_graph_has_the_api_graphs_channels_nodes_and_metadata(settings):
    api = api_graph_on(InMemorySaver(), settings)
    writer, last = thread_graph(Saver(InMemorySaver()))
    assert shape(writer) == shape(api)
    assert last == end_node(api)
    assert "tools" in writer.nodes  # the recall tool's, with no AGENT_TOOLS too


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _normalized(text: str) -> str:
    """``text`` with checkpoint versions without their random tail (``<n>.<random>``, the
    random number zero-padded to 16 chars: ``.0.8`` or ``.00.8`` when its repr is short; the
    in-memory saver's, as PostgreSQL's and SQLite's), times as ``TS``, and each id (a
    checkpoint's, a task's: made when it is written) as the order it first appears in."""
    text = re.sub(r"'(\d{32})\.[0-9.e-]+'", r"'\1'", text)
    text = re.sub(r"'ts': '[^']*'", "'ts': TS", text)
    seen: dict[str, str] = {}
    return UUID.sub(lambda m: seen.setdefault(m.group(0), f"ID{len(seen)}"), text)


def history(saver: InMemorySaver, session: str) -> str:
    """Every checkpoint of the thread, newest first, and every pending write, as text."""
    steps = [
        (tup.checkpoint, tup.metadata, tup.pending_writes, tup.config, tup.parent_config)
        for tup in saver.list(thread_config(session))
    ]
    return _normalized(repr(steps))


@pytest.mark.parametrize("last_run", ["finished", "failed"])
@pytest.mark.parametrize("from_read", [False, True], ids=["reads", "preloaded"])
def test_a_patch_through_the_thread_graph_writes_what_the_api_graph_writes(
    settings, last_run, from_read
):
    """``failed``: the thread's last run raised in its model call, leaving the model's
    branch taken and an error write pending. ``preloaded``: the patch starts from the read
    the job made (:class:`Preloaded`), as :meth:`Runtime.patch` writes it."""
    session = "t"
    config = thread_config(session)
    saver = InMemorySaver()
    api = api_graph_on(saver, settings)
    api.invoke({"messages": [HumanMessage(id="h1", content="which pods are not ready?")]}, config)
    api.update_state(config, {"context": {"incident": "INC-7"}}, as_node=end_node(api))
    if last_run == "failed":
        with pytest.raises(RuntimeError, match="provider"):
            api.invoke({"messages": [HumanMessage(id="h2", content="fail")]}, config)
        assert saver.get_tuple(config).pending_writes
    copied = copy.deepcopy(saver)
    writer, last = thread_graph(Saver(copied))
    question, call, result = api.get_state(config).values["messages"][:3]
    summary = HumanMessage(id="summary", content="Summary: one checkout-api pod is not ready.")
    patch = [*(RemoveMessage(id=str(m.id)) for m in (question, call, result)), summary]

    def lent(s: InMemorySaver) -> dict[str, Any]:
        if not from_read:
            return config
        base = s.get_tuple(config)
        preloaded = Preloaded(s, base)
        return {"configurable": {**config["configurable"], "__pregel_checkpointer": preloaded}}

    api.update_state(lent(saver), {"messages": patch}, as_node=end_node(api))
    writer.update_state(lent(copied), {"messages": patch}, as_node=last)
    assert history(copied, session) == history(saver, session)

    # the API reads the patched thread, and its next turn goes on from it, alike
    again = api_graph_on(copied, settings, start=2)  # the answer the API's model gives next
    assert again.get_state(config).values == api.get_state(config).values
    assert again.get_state(config).next == api.get_state(config).next == ()
    for graph in (api, again):
        graph.invoke({"messages": [HumanMessage(id="h3", content="and now?")]}, config)
    values, expected = again.get_state(config).values, api.get_state(config).values
    assert values["messages"] == expected["messages"]
    assert values["context"] == expected["context"] == {"incident": "INC-7"}
    assert values["offpath"].keys() == expected["offpath"].keys()  # the middleware's, each run's
    ids = [m.id for m in values["messages"]]
    assert "summary" in ids and not {"h1", "a1", result.id} & set(ids)
    assert ids[-2:] == ["h3", "a3"]
