"""The agent shapes: each a small driver that builds a real ``create_agent`` (or deepagents'
``create_deep_agent``) with ``OffPathCompaction`` on a real checkpointer, runs a short
script through it against a real worker (the stub LLM its summarizer), and returns the
:class:`~.harness.Run` the properties judge. :data:`SHAPES` lists them by name.

The thresholds are small (:data:`ENV`: 6,000 / 2,000 chars) and the tools' results
big-ish (about 1,000 chars), so each run crosses the threshold several times. Most models
answer only once the thread's compaction job has ended (:func:`~.harness.idle_gate`), so
that compactions land at the same steps at every run, whatever the machine's load: a
property that fails, fails at every run. The slow summarizer is made slow the same way
(:class:`SlowSummarizer`: the stub holds each summary for six model calls). Only the fast
loop's first turn runs against the worker's own pace, and it is the turn in progress while
it does (which a compaction may cut anywhere).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import sqlalchemy as sa
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, StructuredTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Command, Send, interrupt
from stack import Stack, create_pg_database, drop_pg_database, wait_for
from stub_llm import StubServer

from conformance.harness import (
    SYSTEM_PROMPT,
    Results,
    Run,
    Script,
    ScriptedModel,
    filler,
    idle_gate,
    is_summary,
    logs_tool,
    observe,
)
from offpath import OffPathCompaction
from offpath.compaction.settings import Settings
from offpath.stores.checkpoints import open_checkpoints_url
from offpath.stores.db.tables import JOBS

#: The stack's settings: small thresholds (hard limit 18,000), short leases and reconciler
#: passes (a compaction applied by a run's last step is recorded within seconds).
ENV = {
    "SUMMARIZATION_THRESHOLD_CHARS": "6000",
    "SUMMARIZATION_KEEP_CHARS": "2000",
    "JOB_LEASE_S": "3",
    "RECONCILE_INTERVAL_S": "2",
    # a summary held by the slow summarizer (late_apply) must not time out meanwhile
    "SUMMARIZATION_TIMEOUT_S": "20",
}
SUB_PROMPT = "You are a subagent: read the logs you are asked about and report what they show."
RESULT = 1_100  # chars of a typical tool result


@dataclass
class Env:
    """What every shape runs on: a stack (worker and API) of :data:`ENV`, the stub LLM as
    its summarizer, a scratch folder."""

    stacks: Any
    stub: StubServer
    tmp: Path

    def stack(self, backend: str) -> Stack:
        return self.stacks.get(backend, **ENV)


class Case:
    """One shape's run: its thread, the agent's checkpointer (``url`` for the worker), the
    models and the tools' record. :meth:`middleware` and :meth:`model` build the parts;
    :meth:`observe` reads the run back."""

    def __init__(self, shape: str, stack: Stack, url: str, saver: BaseCheckpointSaver) -> None:
        self.shape = shape
        self.stack = stack
        self.settings: Settings = stack.settings()
        self.url = url
        self.saver = saver
        self.thread_id = f"conf-{shape}-{uuid.uuid4().hex[:8]}"
        self.config: dict[str, Any] = {
            "configurable": {"thread_id": self.thread_id},
            "recursion_limit": 500,
        }
        self.results = Results()
        self.models: list[ScriptedModel] = []
        self.tag = uuid.uuid4().hex[:6]
        self.client = stack.client()

    def script(self, name: str) -> Script:
        return Script(f"{self.tag}-{name}")

    def middleware(self, **kw: Any) -> OffPathCompaction:
        return OffPathCompaction(self.settings, checkpointer_url=self.url, client=self.client, **kw)

    def model(
        self,
        script: Script,
        middleware: OffPathCompaction | None,
        name: str = "agent",
        delay_s: float = 0.02,
    ) -> ScriptedModel:
        """A scripted model of ``script`` (whole: its replies are copied); with
        ``middleware``, it answers once the thread's job ended."""
        assert script.replies, "build the script before its model"
        gate = None if middleware is None else idle_gate(middleware, self.thread_id)
        model = ScriptedModel(name=name, replies=script.replies, gate=gate, delay_s=delay_s)
        self.models.append(model)
        return model

    def logs(self) -> StructuredTool:
        return logs_tool(self.results)

    def agent(self, model: ScriptedModel, middleware: OffPathCompaction, tools=(), **kw: Any):
        """``create_agent`` with the logs tool (and ``tools``), the system prompt and the
        middleware, on this case's checkpointer (``checkpointer=None`` to leave it out)."""
        kw.setdefault("checkpointer", self.saver)
        return create_agent(
            model,
            [self.logs(), *tools],
            system_prompt=SYSTEM_PROMPT,
            middleware=[middleware],
            **kw,
        )

    def observe(self, callee_tools: Sequence[str] = ()) -> Run:
        engine = sa.create_engine(self.stack.db_url())
        try:
            return observe(
                self.shape,
                self.saver,
                self.thread_id,
                engine,
                self.models,
                self.results,
                self.settings.hard_limit_chars,
                callee_tools,
            )
        finally:
            engine.dispose()

    def jobs(self, status: str) -> list[str]:
        """The thread's jobs in ``status``, read from the jobs table."""
        engine = sa.create_engine(self.stack.db_url())
        try:
            with engine.connect() as conn:
                return [
                    r[0]
                    for r in conn.execute(
                        sa.select(JOBS.c.job_id).where(
                            JOBS.c.session_id == self.thread_id, JOBS.c.status == status
                        )
                    )
                ]
        finally:
            engine.dispose()


@contextmanager
def case(env: Env, shape: str, backend: str = "sqlite") -> Iterator[Case]:
    """A :class:`Case` on a fresh checkpointer: a SQLite file, or a scratch PostgreSQL
    database (dropped afterwards)."""
    stack = env.stack(backend)
    if backend == "sqlite":
        url = f"sqlite:///{env.tmp / f'{shape}-{uuid.uuid4().hex[:6]}.db'}"
    else:
        url = create_pg_database("offpath_test_conf")
    try:
        with open_checkpoints_url(url, stack.settings()) as checkpoints:
            yield Case(shape, stack, url, checkpoints.saver)
    finally:
        if backend == "postgres":
            drop_pg_database(url)


def _turns(script: Script, n: int, steps: Sequence[int | Sequence[int]], tool: str = "fetch_logs"):
    for k in range(n):
        script.turn(f"Check the checkout latency, part {k}", steps, tool)


# --- the shapes ----------------------------------------------------------------------------


def plain(env: Env, backend: str = "sqlite") -> Run:
    """A plain agent with its own checkpointer: three turns of five steps."""
    with case(env, "plain" if backend == "sqlite" else f"plain-{backend}", backend) as c:
        script = c.script("agent")
        _turns(script, 3, [RESULT] * 5)
        mw = c.middleware()
        agent = c.agent(c.model(script, mw), mw)
        for request in script.requests:
            agent.invoke({"messages": [request]}, c.config)
        return c.observe()


def subgraph(env: Env) -> Run:
    """The agent as a node of a parent ``StateGraph(MessagesState)`` that shares
    ``messages`` and holds the checkpointer; the agent has none of its own."""
    with case(env, "subgraph") as c:
        script = c.script("agent")
        _turns(script, 3, [RESULT] * 5)
        mw = c.middleware()
        agent = c.agent(c.model(script, mw), mw, checkpointer=None)
        parent = StateGraph(MessagesState)
        parent.add_node("agent", agent)
        parent.add_edge(START, "agent")
        graph = parent.compile(checkpointer=c.saver)
        for request in script.requests:
            graph.invoke({"messages": [request]}, c.config)
        return c.observe()


def _delegating_scripts(c: Case, tool: str, **args: Any) -> tuple[Script, Script]:
    """The caller's script and the callee's. The caller: a short turn (one read), a turn that
    hands a long read to the callee through one call of ``tool``, then two turns of five
    reads of its own (its thread compacts). The callee: seven reads and an answer (its
    thread compacts). The callee runs while the caller's thread is far under its prepare
    point: no job of the caller's is in flight or prepared then (they share a session and
    its lease today), so the run takes the same steps at every run."""
    script, sub_script = c.script("agent"), c.script("sub")
    script.turn("Find the slow pods", [RESULT])
    request = script.request("Have the payments logs read")
    script.call(tool, description="Read every page of the payments logs", **args)
    script.answer(f"{request.id} done: the callee found nothing new.")
    _turns(script, 2, [RESULT] * 5)
    for _ in range(7):
        sub_script.step("fetch_logs", [RESULT])
    sub_script.answer("The payments logs show nothing new.")
    return script, sub_script


def subagent_tool(env: Env) -> Run:
    """A parent agent whose ``delegate`` tool runs ``sub.invoke({"messages": [...]})`` on a
    second agent with ``OffPathCompaction`` and no checkpointer of its own (deepagents'
    ``task`` does the same): two turns, each reading logs, then delegating a long read."""
    with case(env, "subagent_tool") as c:
        script, sub_script = _delegating_scripts(c, "delegate")
        sub_mw, mw = c.middleware(), c.middleware()
        sub = create_agent(
            c.model(sub_script, sub_mw, name="subagent"),
            [c.logs()],
            system_prompt=SUB_PROMPT,
            middleware=[sub_mw],
        )

        def delegate(description: str) -> str:
            out = sub.invoke({"messages": [HumanMessage(content=description)]})
            return str(out["messages"][-1].content)

        tool = StructuredTool.from_function(
            delegate, name="delegate", description="Hand a long read to a subagent."
        )
        agent = c.agent(c.model(script, mw), mw, tools=[tool])
        for request in script.requests:
            agent.invoke({"messages": [request]}, c.config)
        return c.observe(callee_tools=["delegate"])


def deep_agent(env: Env) -> Run:
    """deepagents' ``create_deep_agent`` with ``OffPathCompaction``: three turns of five
    steps on the main agent (no subagent), as :func:`plain`."""
    from deepagents import create_deep_agent

    with case(env, "deepagents") as c:
        script = c.script("agent")
        _turns(script, 3, [RESULT] * 5)
        mw = c.middleware()
        agent = create_deep_agent(
            model=c.model(script, mw),
            tools=[c.logs()],
            system_prompt=SYSTEM_PROMPT,
            middleware=[mw],
            checkpointer=c.saver,
        )
        for request in script.requests:
            agent.invoke({"messages": [request]}, c.config)
        return c.observe()


def deep_agent_task(env: Env) -> Run:
    """deepagents' ``create_deep_agent`` with ``OffPathCompaction``, and a declared subagent
    with ``OffPathCompaction`` of its own, run through the ``task`` tool."""
    from deepagents import create_deep_agent

    with case(env, "deepagents_task") as c:
        script, sub_script = _delegating_scripts(c, "task", subagent_type="researcher")
        sub_mw, mw = c.middleware(), c.middleware()
        researcher = {
            "name": "researcher",
            "description": "Reads every page of one service's logs.",
            "system_prompt": SUB_PROMPT,
            "tools": [c.logs()],
            "model": c.model(sub_script, sub_mw, name="subagent"),
            "middleware": [sub_mw],
        }
        agent = create_deep_agent(
            model=c.model(script, mw),
            tools=[c.logs()],
            system_prompt=SYSTEM_PROMPT,
            middleware=[mw],
            subagents=[researcher],
            checkpointer=c.saver,
        )
        for request in script.requests:
            agent.invoke({"messages": [request]}, c.config)
        return c.observe(callee_tools=["task"])


def parallel(env: Env) -> Run:
    """Parallel tool calls: every step calls the logs tool three times at once."""
    with case(env, "parallel") as c:
        script = c.script("agent")
        _turns(script, 3, [[700, 700, 700]] * 3)
        mw = c.middleware()
        agent = c.agent(c.model(script, mw), mw)
        for request in script.requests:
            agent.invoke({"messages": [request]}, c.config)
        return c.observe()


def _approved_restart(c: Case, script: Script) -> Run:
    """Run ``script``'s turns on an agent whose ``restart`` tool waits for the operator's
    approval (``interrupt()``); the operator answers once the thread's compaction job ended
    (a compaction prepared while the run waited), then the later turns run."""
    results = c.results

    def restart(service: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        answer = interrupt({"approve": f"restart {service}?"})
        return results.record(tool_call_id, f"restart of {service}: {answer}")

    tool = StructuredTool.from_function(restart, name="restart", description="Restart pods.")
    mw = c.middleware()
    agent = c.agent(c.model(script, mw), mw, tools=[tool])
    out = agent.invoke({"messages": [script.requests[0]]}, c.config)
    assert "__interrupt__" in out, "the run did not stop at the approval"
    idle_gate(mw, c.thread_id)()  # the operator takes a while: the job ends meanwhile
    assert c.jobs("prepared"), "no compaction was prepared while the run waited"
    agent.invoke(Command(resume="approved"), c.config)
    for request in script.requests[1:]:
        agent.invoke({"messages": [request]}, c.config)
    return c.observe()


def human_in_the_loop(env: Env) -> Run:
    """A tool that asks for approval with ``interrupt()`` once the thread is over its
    prepare point: the run stops with the call open while the compaction is prepared, and
    resumes with ``Command(resume=...)``; the prepared compaction lands after it."""
    with case(env, "interrupt") as c:
        script = c.script("agent")
        request = script.request("Restart the checkout pods if the logs say so")
        for _ in range(4):
            script.step("fetch_logs", [RESULT])
        script.call("restart", service="checkout-api")
        for _ in range(3):
            script.step("fetch_logs", [RESULT])
        script.answer(f"{request.id} done: restarted after approval.")
        _turns(script, 2, [RESULT] * 4)
        return _approved_restart(c, script)


def goto(env: Env) -> Run:
    """A tool that returns ``Command(update=..., goto="model")``: its result arrives as a
    state update, not as the tool's return value."""
    with case(env, "goto") as c:
        script = c.script("agent")
        _turns(script, 3, [RESULT] * 5, tool="read_page")
        results = c.results

        def read_page(
            page: str, chars: int, tool_call_id: Annotated[str, InjectedToolCallId]
        ) -> Command:
            text = results.record(tool_call_id, filler(page, chars))
            return Command(
                update={"messages": [ToolMessage(content=text, tool_call_id=tool_call_id)]},
                goto="model",
            )

        tool = StructuredTool.from_function(read_page, description="Read one page of logs.")
        mw = c.middleware()
        agent = c.agent(c.model(script, mw), mw, tools=[tool])
        for request in script.requests:
            agent.invoke({"messages": [request]}, c.config)
        return c.observe()


def _three_turns(
    env: Env, shape: str, run: Callable[[Case, Script, Callable[..., Any]], None]
) -> Run:
    """A shape of three turns of five steps, run by ``run(case, script, build)``, where
    ``build(checkpointer)`` makes the agent (an async run needs an async checkpointer)."""
    with case(env, shape) as c:
        script = c.script("agent")
        _turns(script, 3, [RESULT] * 5)
        mw = c.middleware()
        model = c.model(script, mw)
        run(c, script, lambda saver: c.agent(model, mw, checkpointer=saver))
        return c.observe()


def _in_loop(c: Case, turns: Callable[[Any], Coroutine[Any, Any, None]]) -> None:
    """``asyncio.run`` of ``turns(checkpointer)`` with an async checkpointer on the case's
    SQLite file (``ainvoke`` and ``astream`` need one)."""
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async def main() -> None:
        async with AsyncSqliteSaver.from_conn_string(c.url.removeprefix("sqlite:///")) as saver:
            await turns(saver)

    asyncio.run(main())


MODES: list[Any] = ["updates", "messages", ["updates", "messages"]]


def stream(env: Env) -> Run:
    """``stream``: one turn in ``updates`` mode, one in ``messages``, one in both."""

    def run(c: Case, script: Script, build: Callable[..., Any]) -> None:
        agent = build(c.saver)
        for request, mode in zip(script.requests, MODES, strict=True):
            chunks = list(agent.stream({"messages": [request]}, c.config, stream_mode=mode))
            assert chunks, f"stream_mode={mode} gave nothing"

    return _three_turns(env, "stream", run)


def astream(env: Env) -> Run:
    """``astream``: one turn in ``updates`` mode, one in ``messages``, one in both."""

    def run(c: Case, script: Script, build: Callable[..., Any]) -> None:
        async def turns(saver: Any) -> None:
            agent = build(saver)
            for request, mode in zip(script.requests, MODES, strict=True):
                stream = agent.astream({"messages": [request]}, c.config, stream_mode=mode)
                chunks = [x async for x in stream]
                assert chunks, f"stream_mode={mode} gave nothing"

        _in_loop(c, turns)

    return _three_turns(env, "astream", run)


def ainvoke(env: Env) -> Run:
    """``ainvoke``, turn after turn."""

    def run(c: Case, script: Script, build: Callable[..., Any]) -> None:
        async def turns(saver: Any) -> None:
            agent = build(saver)
            for request in script.requests:
                await agent.ainvoke({"messages": [request]}, c.config)

        _in_loop(c, turns)

    return _three_turns(env, "ainvoke", run)


class ToolCrash(RuntimeError):
    """What the crashing tool raises."""


def tool_error(env: Env) -> Run:
    """A tool raises right after a compaction is applied in the run (at the model call
    whose input first holds a new summary): the run ends with the error, the applied
    compaction not yet recorded; it is resumed (``invoke(None)``: the failed step again)."""
    with case(env, "tool_error") as c:
        script = c.script("agent")
        _turns(script, 3, [RESULT] * 5)
        armed: dict[str, Any] = {"summaries": set(), "fire": False, "fired": 0}

        def on_call(messages: list) -> None:
            new = {str(m.content) for m in messages if is_summary(m)} - armed["summaries"]
            armed["summaries"] |= new
            if new and not armed["fired"]:
                armed["fire"] = True

        results = c.results

        def fetch_logs(
            page: str, chars: int, tool_call_id: Annotated[str, InjectedToolCallId]
        ) -> str:
            if armed["fire"]:
                armed["fire"], armed["fired"] = False, armed["fired"] + 1
                raise ToolCrash("the logs backend went away")
            return results.record(tool_call_id, filler(page, chars))

        tool = StructuredTool.from_function(fetch_logs, description="Read one page of logs.")
        mw = c.middleware()
        model = c.model(script, mw)
        model.on_call = on_call
        agent = create_agent(
            model, [tool], system_prompt=SYSTEM_PROMPT, middleware=[mw], checkpointer=c.saver
        )
        for request in script.requests:
            try:
                agent.invoke({"messages": [request]}, c.config)
            except ToolCrash:
                agent.invoke(None, c.config)  # resumed: the failed step runs again
        assert armed["fired"], "no compaction was applied during the runs"
        return c.observe()


def cancelled(env: Env) -> Run:
    """An ``ainvoke`` task cancelled while the model answers the call at which a compaction
    was applied (the model node's state update, the compaction in it, not yet written), then
    resumed (``ainvoke(None)``: the model step again)."""
    with case(env, "cancelled") as c:
        script = c.script("agent")
        _turns(script, 3, [RESULT] * 5)
        mw = c.middleware()
        model = c.model(script, mw, delay_s=0.1)
        state: dict[str, Any] = {"summaries": set(), "task": None, "cancelled": 0}

        def on_call(messages: list) -> None:
            new = {str(m.content) for m in messages if is_summary(m)} - state["summaries"]
            state["summaries"] |= new
            if new and not state["cancelled"] and state["task"] is not None:
                state["cancelled"] += 1
                state["task"].cancel()

        model.on_call = on_call

        async def turns(saver: Any) -> None:
            agent = c.agent(model, mw, checkpointer=saver)
            for request in script.requests:
                task = asyncio.ensure_future(agent.ainvoke({"messages": [request]}, c.config))
                state["task"] = task
                try:
                    await task
                except asyncio.CancelledError:
                    state["task"] = None
                    await agent.ainvoke(None, c.config)

        _in_loop(c, turns)
        assert state["cancelled"], "no compaction was applied during the runs"
        return c.observe()


def fork(env: Env) -> Run:
    """Time travel: a turn runs on (its compaction job prepared on that branch), then a new
    turn is run from the checkpoint before it (``checkpoint_id``): the fork crosses its
    threshold with the other branch's compaction prepared, which must not land here."""
    with case(env, "fork") as c:
        script = c.script("agent")
        _turns(script, 3, [RESULT] * 5)
        mw = c.middleware()
        model = c.model(script, mw)
        agent = c.agent(model, mw)
        agent.invoke({"messages": [script.requests[0]]}, c.config)
        idle_gate(mw, c.thread_id)()
        before = c.saver.get_tuple(c.config)
        assert before is not None
        agent.invoke({"messages": [script.requests[1]]}, c.config)
        idle_gate(mw, c.thread_id)()
        other = set(wait_for(lambda: c.jobs("prepared"), timeout=30))
        at = {"configurable": {**before.config["configurable"]}, "recursion_limit": 500}
        agent.invoke({"messages": [script.requests[2]]}, at)
        run = c.observe()
        run.other_branch = other
        return run


class SlowSummarizer:
    """A summarizer slower than the run, deterministically: the stub LLM holds every summary
    request (its ``gate``) and lets the held one finish only at every ``every``-th model
    call, which then waits until the thread's job has ended (prepared). A compaction is so
    planned on the thread as it was ``every`` calls earlier and applied on a thread that grew
    meanwhile, at the same steps at every run."""

    def __init__(self, stub: StubServer, middleware: OffPathCompaction, thread_id: str, every: int):
        self.stub, self.every, self.n = stub, every, 0
        self.idle = idle_gate(middleware, thread_id)

    def __enter__(self) -> SlowSummarizer:
        self.stub.state.gate.clear()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stub.state.gate.set()

    def on_call(self, messages: list) -> None:
        self.n += 1
        if self.n % self.every == 0:
            self.stub.state.gate.set()
            self.idle()
            self.stub.state.gate.clear()


def late_apply(env: Env) -> Run:
    """A slow summarizer (:class:`SlowSummarizer`): each summary is written while six model
    calls (two short turns) go by, so compactions are applied late, on a thread that grew
    by whole turns meanwhile."""
    with case(env, "late_apply") as c:
        script = c.script("agent")
        _turns(script, 8, [1_000, 1_000])
        mw = c.middleware()
        model = c.model(script, None)
        agent = c.agent(model, mw)
        with SlowSummarizer(env.stub, mw, c.thread_id, every=6) as slow:
            model.on_call = slow.on_call
            for request in script.requests:
                agent.invoke({"messages": [request]}, c.config)
        idle_gate(mw, c.thread_id)()
        return c.observe()


def fast_loop(env: Env) -> Run:
    """A fast tool loop: one request of 24 steps, the model answering at once and never
    waiting for a job (the run outpaces the worker: its thread is held by shortening, a
    compaction lands whenever one is ready at a crossing); then, once the thread's job has
    ended, a short request, whose steps cross the threshold with it ready."""
    with case(env, "fast_loop") as c:
        script = c.script("agent")
        script.turn("Read every page of the checkout logs", [RESULT] * 24)
        script.turn("And the last three pages again", [RESULT] * 3)
        mw = c.middleware()
        agent = c.agent(c.model(script, None, delay_s=0.0), mw)
        for request in script.requests:
            agent.invoke({"messages": [request]}, c.config)
            idle_gate(mw, c.thread_id)()
        return c.observe()


class Dispatch(ScriptedModel):
    """One model for an agent run several times at once (a ``Send`` fan-out): each call is
    answered by the :class:`ScriptedModel` whose key is in the call's first request (the
    runs of a superstep take their replies in no fixed order, each from its own script)."""

    name: str = "dispatch"
    replies: list[AIMessage] = []
    by_key: dict[str, ScriptedModel] = {}

    def _pick(self, messages: Any) -> ScriptedModel:
        for m in reversed(messages):
            text = str(m.content) if m.type == "human" else ""
            for key, model in self.by_key.items():
                if key in text:
                    return model
        raise RuntimeError(f"{self.name}: no script for a call of {len(messages)} messages")

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any):
        return self._pick(messages)._generate(messages, stop, run_manager, **kw)

    async def _agenerate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any):
        return await self._pick(messages)._agenerate(messages, stop, run_manager, **kw)


class FanState(MessagesState):
    """A map-reduce graph's state: the thread, and the services to hand out (one ``Send``
    each) before the writer answers."""

    services: list[str]


#: The services a fan-out hands out, one researcher run each.
SERVICES = ("payments", "search", "cart")


def send_fanout(env: Env, context: bool = False) -> Run:
    """Map-reduce with the ``Send`` API (LangGraph's how-to): a parent
    ``StateGraph`` whose first turn sends each of three services to a ``researcher`` node
    (a ``create_agent`` with ``OffPathCompaction`` and no checkpointer of its own), given a
    message list of its own (``Send("researcher", {"messages": [...]})``): the three runs
    share one superstep, their model calls interleave, and each compacts its own thread.
    What each returns is merged into the parent's ``messages`` (its reducer), then the
    ``writer`` node (a ``create_agent`` with ``OffPathCompaction`` sharing the parent's
    messages) answers. Two more turns go to the writer alone (five reads each): the
    parent's thread, which now holds the researchers' work, compacts.

    ``context``: each researcher is given the parent's whole thread and its own ask
    (``Send("researcher", {"messages": [*state["messages"], ask]})``, so that it knows the
    conversation), in the third turn, after two turns of the writer's: three runs sharing
    the parent's messages in one superstep, over its threshold (three reads each)."""
    shape = "send_context" if context else "send_fanout"
    with case(env, shape) as c:
        script = c.script("agent")
        if context:
            _turns(script, 2, [RESULT] * 5)
        request = script.request("Have the payments, search and cart logs read")
        script.answer(f"{request.id} done: the researchers found nothing new.")
        if not context:
            _turns(script, 2, [RESULT] * 5)
        fan_at = len(script.requests) - 1 if context else 0
        sub_mw, mw = c.middleware(), c.middleware()
        by_key: dict[str, ScriptedModel] = {}
        for service in SERVICES:
            sub_script = c.script(f"sub-{service}")
            for _ in range(3 if context else 7):
                sub_script.step("fetch_logs", [RESULT])
            sub_script.answer(f"The {service} logs show nothing new.")
            by_key[f"the {service} logs"] = c.model(sub_script, sub_mw, name=f"sub-{service}")
        researcher = create_agent(
            Dispatch(by_key=by_key),
            [c.logs()],
            system_prompt=SUB_PROMPT,
            middleware=[sub_mw],
        )
        writer = c.agent(c.model(script, mw), mw, checkpointer=None)

        def fan_out(state: FanState) -> list[Send] | str:
            services = state.get("services") or []
            if not services:
                return "writer"
            given = list(state["messages"]) if context else []
            return [
                Send(
                    "researcher",
                    {
                        "messages": [
                            *given,
                            HumanMessage(
                                id=f"{c.tag}-ask-{s}", content=f"Read every page of the {s} logs"
                            ),
                        ]
                    },
                )
                for s in services
            ]

        parent = StateGraph(FanState)
        parent.add_node("researcher", researcher)
        parent.add_node("writer", writer)
        parent.add_conditional_edges(START, fan_out, ["researcher", "writer"])
        parent.add_edge("researcher", "writer")
        graph = parent.compile(checkpointer=c.saver)
        for k, request in enumerate(script.requests):
            services = list(SERVICES) if k == fan_at else []
            idle_gate(mw, c.thread_id)()
            graph.invoke({"messages": [request], "services": services}, c.config)
        run = c.observe(callee_tools=["researcher"])
        # the caller's thread before the researchers ran: up to the fan-out turn's request
        asked = script.requests[fan_at].id
        run.caller_before = next((s for s in run.root.states if s and s[-1].id == asked), [])
        return run


def app_edits(env: Env) -> Run:
    """The application edits the thread between turns (``graph.update_state``) while a
    compaction is prepared on it: it redacts an old tool result in place (same id, new
    content: a PII scrub) and removes a whole old step (``RemoveMessage`` of a call and its
    result, as LangGraph's "delete messages" how-to does). The prepared compaction, planned
    on the thread before the edits, must not land the old version nor remove again what is
    gone; the redacted version is what is kept or archived."""
    with case(env, "app_edits") as c:
        script = c.script("agent")
        script.turn("Find the slow pods", [RESULT] * 4)  # over the prepare point, not the threshold
        _turns(script, 2, [RESULT] * 5)
        mw = c.middleware()
        agent = c.agent(c.model(script, mw), mw)
        agent.invoke({"messages": [script.requests[0]]}, c.config)
        idle_gate(mw, c.thread_id)()
        assert c.jobs("prepared"), "no compaction was prepared before the edits"
        messages = agent.get_state(c.config).values["messages"]
        result, call, gone = messages[2], messages[5], messages[6]
        assert result.type == "tool" and call.type == "ai" and gone.type == "tool"
        redacted = ToolMessage(
            id=result.id, content="[redacted by the operator]", tool_call_id=result.tool_call_id
        )
        agent.update_state(
            c.config,
            {
                "messages": [
                    redacted,
                    RemoveMessage(id=str(call.id)),
                    RemoveMessage(id=str(gone.id)),
                ]
            },
        )
        for request in script.requests[1:]:
            agent.invoke({"messages": [request]}, c.config)
        run = c.observe()
        run.dropped = {(str(m.id), repr((m.type, m.content))) for m in (result, call, gone)}
        return run


def durability(env: Env) -> Run:
    """Checkpoints written only at a run's end (``durability="exit"``), or in the background
    (``"async"``): three turns of five steps, exit, async, exit. The worker reads a thread
    that is a whole run behind the agent's state."""

    def run(c: Case, script: Script, build: Callable[..., Any]) -> None:
        agent = build(c.saver)
        for request, mode in zip(script.requests, ["exit", "async", "exit"], strict=True):
            agent.invoke({"messages": [request]}, c.config, durability=mode)

    return _three_turns(env, "durability", run)


#: A small picture, as a data URL (multimodal requests carry one).
PIXEL = "data:image/png;base64," + "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4" * 20


def multimodal(env: Env) -> Run:
    """Content as lists of blocks, as Anthropic's and OpenAI's v1 messages carry it: each
    request is a text block and an image, each model step a text block beside its tool
    calls (and a ``tool_use`` block naming each), each tool result a list of text blocks
    (an MCP tool's shape)."""
    with case(env, "multimodal") as c:
        script = c.script("agent")
        _turns(script, 3, [RESULT] * 5, tool="read_blocks")
        for h in script.requests:
            h.content = [
                {"type": "text", "text": str(h.content)},
                {"type": "image_url", "image_url": {"url": PIXEL}},
            ]
        for a in script.replies:
            blocks: list[Any] = [{"type": "text", "text": str(a.content) or "Reading on."}]
            blocks += [
                {"type": "tool_use", "id": t["id"], "name": t["name"], "input": t["args"]}
                for t in a.tool_calls
            ]
            a.content = blocks
        results = c.results

        def read_blocks(
            page: str, chars: int, tool_call_id: Annotated[str, InjectedToolCallId]
        ) -> list[dict[str, str]]:
            half = filler(page, chars)
            cut = len(half) // 2
            blocks = [{"type": "text", "text": half[:cut]}, {"type": "text", "text": half[cut:]}]
            return results.record(tool_call_id, blocks)

        tool = StructuredTool.from_function(read_blocks, description="Read one page of logs.")
        mw = c.middleware()
        agent = c.agent(c.model(script, mw), mw, tools=[tool])
        for request in script.requests:
            agent.invoke({"messages": [request]}, c.config)
        return c.observe()


def reused_call_ids(env: Env) -> Run:
    """A provider that numbers tool calls per response (``call_0``, ``call_1`` in every
    response, as some OpenAI-compatible servers do): every step calls the logs tool twice,
    with the same two call ids as every other step."""
    with case(env, "reused_call_ids") as c:
        script = c.script("agent")
        _turns(script, 3, [[600, 600]] * 4)
        for a in script.replies:
            for j, t in enumerate(a.tool_calls):
                t["id"] = f"call_{j}"
        mw = c.middleware()
        agent = c.agent(c.model(script, mw), mw)
        for request in script.requests:
            agent.invoke({"messages": [request]}, c.config)
        return c.observe()


def structured(env: Env) -> Run:
    """``create_agent(response_format=ToolStrategy(Report))``: each turn ends with the model
    calling the structured-output tool, which the agent answers itself (a tool message of
    its own) and returns as ``structured_response``."""
    from langchain.agents.structured_output import ToolStrategy
    from pydantic import BaseModel

    class Report(BaseModel):
        """What the agent found."""

        summary: str

    with case(env, "structured") as c:
        script = c.script("agent")
        for k in range(3):
            request = script.request(f"Check the checkout latency, part {k}")
            for _ in range(5):
                script.step("fetch_logs", [RESULT])
            script.call("Report", summary=f"{request.id} done: nothing new.")
        mw = c.middleware()
        agent = c.agent(c.model(script, mw), mw, response_format=ToolStrategy(Report))
        for request in script.requests:
            out = agent.invoke({"messages": [request]}, c.config)
            assert isinstance(out.get("structured_response"), Report), out.keys()
        return c.observe()


class HandoffState(MessagesState):
    """A handoffs graph's state: the thread, and the agent that answers the next turn."""

    active: str


def handoffs(env: Env) -> Run:
    """Multi-agent handoffs (LangChain's "handoffs" how-to, langgraph-swarm's shape): two
    ``create_agent`` nodes, each with ``OffPathCompaction`` of its own, share the parent's
    ``messages``. ``triage`` answers the first turn by calling ``transfer_to_sre``, a tool
    that returns ``Command(goto="sre", graph=Command.PARENT)`` with its call and result;
    ``sre`` then reads logs and answers, and takes the next turns (``active``): both agents
    compact the one thread, from two namespaces."""
    with case(env, "handoffs") as c:
        triage, sre = c.script("triage"), c.script("agent")
        for k in range(3):
            # the second pastes the logs it saw: the thread is over its threshold at triage's
            # call, where a compaction is applied in a run that ends by a handoff
            paste = f": {filler(f'paste-{k}', 4_500)}" if k == 1 else ""
            request = triage.request(f"The checkout is slow again, part {k}{paste}")
            triage.call("transfer_to_sre")
            for _ in range(5):
                sre.step("fetch_logs", [RESULT])
            sre.answer(f"{request.id} done: the pages read show nothing new.")

        def transfer_to_sre(runtime: ToolRuntime) -> Command:
            last = next(m for m in reversed(runtime.state["messages"]) if m.type == "ai")
            done = ToolMessage(
                content="Transferred to the SRE agent", tool_call_id=runtime.tool_call_id
            )
            return Command(
                goto="sre",
                update={"active": "sre", "messages": [last, done]},
                graph=Command.PARENT,
            )

        handoff = StructuredTool.from_function(
            transfer_to_sre, description="Hand the conversation to the SRE agent."
        )
        triage_mw, mw = c.middleware(), c.middleware()
        triage_agent = create_agent(
            c.model(triage, triage_mw, name="triage"),
            [handoff],
            system_prompt="You are the triage agent: hand incidents to the SRE agent.",
            middleware=[triage_mw],
        )
        sre_agent = c.agent(c.model(sre, mw), mw, checkpointer=None)
        parent = StateGraph(HandoffState)
        parent.add_node("triage", triage_agent, destinations=("sre",))
        parent.add_node("sre", sre_agent)
        parent.add_edge(START, "triage")
        graph = parent.compile(checkpointer=c.saver)
        for human in triage.requests:
            idle_gate(mw, c.thread_id)()  # the job queued at the last run's end is prepared
            graph.invoke({"messages": [human]}, c.config)
        return c.observe()


def parallel_agents(env: Env) -> Run:
    """Two ``create_agent`` nodes run in parallel from ``START`` (``add_edge(START, "logs")``
    and ``add_edge(START, "metrics")``), each with ``OffPathCompaction`` of its own, both
    sharing the parent's ``messages``: every turn both read (five and three steps) in the
    same superstep and their outputs are merged by the parent's reducer; the thread crosses
    its threshold inside both runs. Both are fanned (one's thread handed up whole would wipe
    the other's messages of the step): they compact their own calls and hand the parent
    their messages whole, so the parent's thread itself is never compacted (``compacts`` is
    a known xfail, :data:`~conformance.test_conformance.KNOWN`)."""
    with case(env, "parallel_agents") as c:
        logs, metrics = c.script("agent"), c.script("metrics")
        for k in range(3):
            request = logs.request(f"Check the checkout latency, part {k}")
            for _ in range(5):
                logs.step("fetch_logs", [RESULT])
            logs.answer(f"{request.id} done: the logs show nothing new.")
            for _ in range(3):
                metrics.step("fetch_logs", [RESULT])
            metrics.answer(f"{request.id}: the metrics show nothing new.")
        logs_mw, metrics_mw = c.middleware(), c.middleware()
        parent = StateGraph(MessagesState)
        parent.add_node("logs", c.agent(c.model(logs, logs_mw), logs_mw, checkpointer=None))
        parent.add_node(
            "metrics",
            c.agent(c.model(metrics, metrics_mw, name="metrics"), metrics_mw, checkpointer=None),
        )
        parent.add_edge(START, "logs")
        parent.add_edge(START, "metrics")
        graph = parent.compile(checkpointer=c.saver)
        for request in logs.requests:
            idle_gate(logs_mw, c.thread_id)()
            graph.invoke({"messages": [request]}, c.config)
        return c.observe()


def interrupt_parallel(env: Env) -> Run:
    """``interrupt()`` in one of two parallel tool calls: the step reads a page and asks for
    approval at once, the read's result waits as a pending write while the run stops with
    the thread over its prepare point; the operator takes a while (the compaction is
    prepared meanwhile), then the run resumes (``Command(resume=...)``) and goes on over
    its threshold, where the prepared compaction lands with the resumed step's results."""
    with case(env, "interrupt_parallel") as c:
        script = c.script("agent")
        request = script.request("Restart the checkout pods if the logs say so")
        for _ in range(4):
            script.step("fetch_logs", [RESULT])
        n = len(script.replies)
        both = script.step("fetch_logs", [RESULT])
        both.tool_calls.append(
            {
                "id": f"{script.tag}-c{n}-restart",
                "name": "restart",
                "args": {"service": "checkout-api"},
                "type": "tool_call",
            }
        )
        for _ in range(3):
            script.step("fetch_logs", [RESULT])
        script.answer(f"{request.id} done: restarted after approval.")
        _turns(script, 2, [RESULT] * 4)
        return _approved_restart(c, script)


def app_reset(env: Env) -> Run:
    """The application starts the conversation afresh between turns, keeping its last
    exchange (``update_state`` with ``RemoveMessage(REMOVE_ALL_MESSAGES)``, the first request
    and the last three messages, as LangChain's trimming example keeps) while a compaction is
    prepared on the thread it had; two more turns follow."""
    from langgraph.graph.message import REMOVE_ALL_MESSAGES

    with case(env, "app_reset") as c:
        script = c.script("agent")
        script.turn("Find the slow pods", [RESULT] * 4)  # over the prepare point, not the threshold
        _turns(script, 2, [RESULT] * 5)
        mw = c.middleware()
        agent = c.agent(c.model(script, mw), mw)
        agent.invoke({"messages": [script.requests[0]]}, c.config)
        idle_gate(mw, c.thread_id)()
        assert c.jobs("prepared"), "no compaction was prepared before the reset"
        messages = agent.get_state(c.config).values["messages"]
        kept = [messages[0], *messages[-3:]]  # the request; the last call, its result, the answer
        assert [m.type for m in kept] == ["human", "ai", "tool", "ai"], kept
        agent.update_state(c.config, {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *kept]})
        for request in script.requests[1:]:
            agent.invoke({"messages": [request]}, c.config)
        run = c.observe()
        run.dropped = {(str(m.id), repr((m.type, m.content))) for m in messages[1:-3]}
        return run


@dataclass(frozen=True)
class Shape:
    run: Callable[[Env], Run]
    #: the root agent calls a callee agent (caller_untouched applies; a callee's thread
    #: must compact too)
    caller: bool = False


#: The shapes by name, in the order they run (the PostgreSQL one last: its stack starts once).
SHAPES: dict[str, Shape] = {
    "plain": Shape(plain),
    "subgraph": Shape(subgraph),
    "subagent_tool": Shape(subagent_tool, caller=True),
    "deepagents": Shape(deep_agent),
    "deepagents_task": Shape(deep_agent_task, caller=True),
    "parallel": Shape(parallel),
    "interrupt": Shape(human_in_the_loop),
    "goto": Shape(goto),
    "stream": Shape(stream),
    "astream": Shape(astream),
    "ainvoke": Shape(ainvoke),
    "tool_error": Shape(tool_error),
    "cancelled": Shape(cancelled),
    "fork": Shape(fork),
    "late_apply": Shape(late_apply),
    "fast_loop": Shape(fast_loop),
    "send_fanout": Shape(send_fanout, caller=True),
    "send_context": Shape(lambda env: send_fanout(env, context=True)),
    "app_edits": Shape(app_edits),
    "app_reset": Shape(app_reset),
    "durability": Shape(durability),
    "multimodal": Shape(multimodal),
    "reused_call_ids": Shape(reused_call_ids),
    "structured": Shape(structured),
    "handoffs": Shape(handoffs),
    "interrupt_parallel": Shape(interrupt_parallel),
    "parallel_agents": Shape(parallel_agents),
    "plain_postgres": Shape(lambda env: plain(env, "postgres")),
}


def reset_stub(stub: StubServer) -> None:
    """The stub LLM answering at once with short summaries, as the ``stub`` fixture leaves it."""
    stub.state.reset(requests=False)
