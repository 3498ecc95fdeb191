"""What the shapes share: a scripted chat model that records every call's input, scripted
tools whose results are big enough to take a small thread over its threshold several times,
and :func:`observe`, which reads a finished run's checkpoints (every namespace, every
branch, the pending writes too) and the archive into a :class:`Run` for the properties.

Nothing here imports the compaction logic it checks: a summary, a request's copy and a
shortened message are recognised by their marks (``additional_kwargs``; a summary and the
request it quotes by :mod:`offpath.compaction.summary`'s readers, which define the format),
as a reader of the thread would, so that a fault in offpath cannot hide in the checker.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import sqlalchemy as sa
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    messages_from_dict,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import InjectedToolCallId, StructuredTool
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.graph.message import add_messages

from offpath.compaction.summary import is_summary
from offpath.stores import archive
from offpath.stores.db.tables import JOBS

#: The system prompt every shape's agent is given (``create_agent(system_prompt=...)``): in
#: every model call, in no checkpoint.
SYSTEM_PROMPT = (
    "You are the on-call SRE agent for the checkout platform. Read logs page by page, name "
    "the pods, deploys and error codes you rely on, and answer each request when it is done. "
    "Never restart a service without the operator's approval."
)
#: Marks offpath writes on messages it changes or copies (a reader's view, not its code).
SHORTENED = "offpath_shortened"
REQUEST_COPY = "offpath_request_of"
#: Longest a model waits for the thread's compaction job to end before answering (s).
GATE_S = 30.0


# --- marks ---------------------------------------------------------------------------------


def is_request_copy(m: BaseMessage) -> bool:
    """A kept request's copy: a human message naming the request it copies."""
    return m.type == "human" and REQUEST_COPY in m.additional_kwargs


def is_shortened(m: BaseMessage) -> bool:
    """A message offpath shortened in place (its original archived)."""
    return isinstance(m.additional_kwargs.get(SHORTENED), dict)


def offpath_made(m: BaseMessage) -> bool:
    """A version offpath wrote (a summary, a request's copy, a shortened message): derived
    from originals, which are what must not be lost."""
    return is_summary(m) or is_request_copy(m) or is_shortened(m)


def is_request(m: BaseMessage) -> bool:
    """A human request: a human message that is neither a summary nor a request's copy."""
    return m.type == "human" and not is_summary(m) and not is_request_copy(m)


def replaced_ids(summary: BaseMessage) -> list[str]:
    meta = summary.additional_kwargs.get("summary")
    return list(meta.get("replaced_ids") or []) if isinstance(meta, dict) else []


def job_of(summary: BaseMessage) -> str | None:
    meta = summary.additional_kwargs.get("summary")
    return meta.get("job_id") if isinstance(meta, dict) else None


def same(a: BaseMessage, b: BaseMessage) -> bool:
    """Byte for byte the same message: type, id, content, tool calls (their ids, names and
    arguments) and, for a tool result, the call it answers."""
    return (
        a.type == b.type
        and a.id == b.id
        and a.content == b.content
        and calls_of(a) == calls_of(b)
        and getattr(a, "tool_call_id", None) == getattr(b, "tool_call_id", None)
    )


def calls_of(m: BaseMessage) -> list[tuple[str, str, Any]]:
    return [(c["id"], c["name"], c["args"]) for c in getattr(m, "tool_calls", None) or []]


def describe(m: BaseMessage) -> str:
    """One line naming a message for a failure report."""
    text = m.content if isinstance(m.content, str) else str(m.content)
    calls = ",".join(c["name"] for c in getattr(m, "tool_calls", None) or [])
    return f"{m.type} {m.id}" + (f" calls {calls}" if calls else "") + f": {text[:50]!r}"


# --- the scripted model and tools ----------------------------------------------------------


class ScriptedModel(BaseChatModel):
    """Answers with ``replies`` in order; records every call's input (the system prompt
    included) in ``calls`` as it is made and every reply it returned in ``produced``.

    ``gate``: called before each answer (e.g. waits for the thread's compaction job, as a
    model slower than the summarizer would); ``delay_s``: how long each answer takes. An
    async call sleeps with ``asyncio.sleep`` before taking its reply, so a cancelled call
    consumes none."""

    name: str = "model"
    replies: list[AIMessage]
    calls: list[list[BaseMessage]] = []
    produced: list[AIMessage] = []
    delay_s: float = 0.0
    gate: Any = None
    on_call: Any = None  # called with each call's input, before the answer
    n: int = 0

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self

    def _take(self) -> ChatResult:
        if self.n >= len(self.replies):
            raise RuntimeError(
                f"{self.name}: the script has {len(self.replies)} replies and call "
                f"{self.n + 1} asks for another (the run took more model calls than scripted)"
            )
        reply = self.replies[self.n]
        self.n += 1
        self.produced.append(reply)
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any):
        self.calls.append(list(messages))
        if self.on_call is not None:
            self.on_call(list(messages))
        if self.gate is not None:
            self.gate()
        time.sleep(self.delay_s)
        return self._take()

    async def _agenerate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any):
        self.calls.append(list(messages))
        if self.on_call is not None:
            self.on_call(list(messages))
        if self.gate is not None:
            await asyncio.to_thread(self.gate)
        await asyncio.sleep(self.delay_s)
        return self._take()


def idle_gate(middleware: Any, session_id: str, timeout: float = GATE_S) -> Callable[[], None]:
    """A :class:`ScriptedModel` gate that waits (up to ``timeout`` s) while the session has
    a compaction job being queued or worked on (``OffPathCompaction.busy``), so that the job
    the model call's own hook queued is prepared before the next call: compactions land at
    the same steps at every run, whatever the machine's load. The session is the one the
    middleware gives the run the call belongs to (a callee's is its own), ``session_id``
    outside a run."""

    def wait() -> None:
        session = middleware.places.session_of_run() or session_id
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and middleware.busy(session):
            time.sleep(0.05)

    return wait


def filler(seed: str, chars: int) -> str:
    """``chars`` chars of log lines, distinct per ``seed`` (a digest, so that no two results
    share their text), each naming a pod, a latency and a status."""
    lines: list[str] = []
    size, i = 0, 0
    while size < chars:
        h = hashlib.sha256(f"{seed}:{i}".encode()).hexdigest()
        line = f"{h[:8]} pod checkout-api-{h[8:13]} p99 {int(h[13:16], 16) % 900} ms status 200"
        lines.append(line)
        size += len(line) + 1
        i += 1
    return "\n".join(lines)[:chars]


class Results:
    """What the scripted tools returned, as tool messages without ids (the tool node gives
    them theirs): ``(tool_call_id, content)`` is what the properties look for."""

    def __init__(self) -> None:
        self.returned: list[ToolMessage] = []

    def record(self, tool_call_id: str, content: Any) -> Any:
        self.returned.append(ToolMessage(content=content, tool_call_id=tool_call_id))
        return content


def logs_tool(results: Results, name: str = "fetch_logs") -> StructuredTool:
    """A tool that returns ``chars`` chars of log lines for ``page`` (the script sets both)."""

    def fetch(page: str, chars: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        return results.record(tool_call_id, filler(page, chars))

    return StructuredTool.from_function(
        fetch, name=name, description="Read one page of a service's logs."
    )


# --- scripts -------------------------------------------------------------------------------


@dataclass
class Script:
    """A model's replies and the requests that drive them, with ids that name the script
    (``tag``): requests ``<tag>-h<k>``, replies ``<tag>-a<n>``, calls ``<tag>-c<n>-<j>``."""

    tag: str
    requests: list[HumanMessage] = field(default_factory=list)
    replies: list[AIMessage] = field(default_factory=list)

    def request(self, text: str) -> HumanMessage:
        k = len(self.requests)
        human = HumanMessage(id=f"{self.tag}-h{k}", content=f"{text} (request {k})")
        self.requests.append(human)
        return human

    def turn(
        self, text: str, steps: Sequence[int | Sequence[int]], tool: str = "fetch_logs"
    ) -> HumanMessage:
        """A request, its steps (each a result size, one call of ``tool``, or a list of
        sizes: parallel calls) and a closing answer; returns the request."""
        human = self.request(text)
        for sizes in steps:
            self.step(tool, [sizes] if isinstance(sizes, int) else list(sizes))
        self.answer(f"{human.id} done: the pages read show nothing new.")
        return human

    def step(self, tool: str, sizes: Sequence[int], **args: Any) -> AIMessage:
        """One reply that calls ``tool`` once per size (arguments ``page`` and ``chars``, and
        ``args``; a size of 0: ``args`` only)."""
        n = len(self.replies)
        calls = [
            {
                "id": f"{self.tag}-c{n}-{j}",
                "name": tool,
                "args": {"page": f"{self.tag}-p{n}-{j}", "chars": size, **args} if size else args,
                "type": "tool_call",
            }
            for j, size in enumerate(sizes)
        ]
        reply = AIMessage(id=f"{self.tag}-a{n}", content="", tool_calls=calls)
        self.replies.append(reply)
        return reply

    def call(self, tool: str, **args: Any) -> AIMessage:
        """One reply with one call of ``tool`` with ``args``."""
        return self.step(tool, [0], **args)

    def answer(self, text: str) -> AIMessage:
        reply = AIMessage(id=f"{self.tag}-a{len(self.replies)}", content=text)
        self.replies.append(reply)
        return reply


# --- a run, read back ----------------------------------------------------------------------


@dataclass
class Thread:
    """One checkpoint namespace of a run's thread ("" is the root graph's; a subgraph or a
    subagent run from a tool has its own)."""

    ns: str
    #: every version of every message written in it, in order of first appearance
    ever: list[BaseMessage]
    #: its messages at its newest checkpoint
    final: list[BaseMessage]
    #: its messages at the head of each branch (one unless a run forked it)
    leaves: list[list[BaseMessage]]
    #: its messages at every checkpoint
    states: list[list[BaseMessage]]
    #: ids of the messages on the newest checkpoint's parent chain
    lineage: set[str]
    #: the newest checkpoint has tasks left (an interrupt waits)
    interrupted: bool = False


@dataclass
class Archived:
    """One archive row the archive's reader shows (``offpath.stores.archive.read``)."""

    session_id: str
    job_id: str
    summary_id: str
    message: BaseMessage


@dataclass
class Run:
    """A finished run of one shape, as the properties see it."""

    shape: str
    thread_id: str
    threads: dict[str, Thread]
    #: replies the fake models returned to a run, and what the tools returned
    produced: list[AIMessage]
    returned: list[ToolMessage]
    #: by message id: the archive's rows of that id, in every session
    archived: dict[str, list[Archived]]
    #: by model name: every call's input, system prompt included
    calls: dict[str, list[list[BaseMessage]]]
    hard_limit: int
    #: the tools through which the root agent (the caller) runs a callee agent
    callee_tools: frozenset[str] = frozenset()
    #: messages of the caller's thread at each checkpoint before a callee ran
    caller_before: list[BaseMessage] = field(default_factory=list)
    #: jobs prepared on another branch of the thread (before a fork)
    other_branch: set[str] = field(default_factory=set)
    #: versions the application itself removed or replaced (``update_state``), as
    #: ``(id, repr((type, content)))``: not offpath's to keep
    dropped: set[tuple[str, str]] = field(default_factory=set)
    #: jobs whose summary reached a thread, and those of them applied
    compactions: set[str] = field(default_factory=set)
    applied: set[str] = field(default_factory=set)

    @property
    def root(self) -> Thread:
        return self.threads[""]


def _messages(value: Any) -> list[BaseMessage]:
    items = value if isinstance(value, list) else [value]
    return [m for m in items if isinstance(m, BaseMessage) and m.type != "remove"]


def messages_at(saver: BaseCheckpointSaver, tup: CheckpointTuple) -> list[BaseMessage]:
    """The thread's messages at checkpoint ``tup``: stored whole (``add_messages``), or, for a
    ``DeltaChannel`` (deepagents' state), its seed and the writes after it, folded."""
    value = tup.checkpoint.get("channel_values", {}).get("messages")
    if isinstance(value, list):
        return list(value)
    if isinstance(getattr(value, "value", None), list):  # a DeltaChannel's snapshot
        return list(value.value)
    history = saver.get_delta_channel_history(config=tup.config, channels=["messages"])
    entry = history["messages"]
    seed = entry.get("seed")
    messages: list[BaseMessage] = list(getattr(seed, "value", seed) or [])
    for write in entry["writes"]:
        messages = add_messages(messages, write[2])
    return messages


def _checkpoint_id(config: dict[str, Any] | None) -> str | None:
    return (config or {}).get("configurable", {}).get("checkpoint_id")


def read_thread(saver: BaseCheckpointSaver, tuples: list[CheckpointTuple], ns: str) -> Thread:
    """A :class:`Thread` from the checkpoints of one namespace (newest first, as ``list``
    gives them)."""
    ordered = list(reversed(tuples))
    states = [messages_at(saver, t) for t in ordered]
    ever: list[BaseMessage] = []
    seen: set[tuple[Any, ...]] = set()

    def add(ms: Iterable[BaseMessage]) -> None:
        for m in ms:
            key = (m.id, m.type, str(m.content), repr(calls_of(m)), repr(m.additional_kwargs))
            if key not in seen:
                seen.add(key)
                ever.append(m)

    for t, state in zip(ordered, states, strict=True):
        add(state)
        for _task, channel, value in t.pending_writes or []:
            if channel == "messages":
                add(_messages(value))
    by_id = {_checkpoint_id(t.config): (t, s) for t, s in zip(ordered, states, strict=True)}
    parents = {_checkpoint_id(t.parent_config) for t in ordered}
    leaves = [s for cid, (_, s) in by_id.items() if cid not in parents]
    head_id = _checkpoint_id(tuples[0].config)
    lineage: set[str] = set()
    cid: str | None = head_id
    while cid in by_id:
        t, s = by_id[cid]
        lineage |= {str(m.id) for m in s}
        lineage |= {
            str(m.id)
            for _, ch, v in t.pending_writes or []
            if ch == "messages"
            for m in _messages(v)
        }
        cid = _checkpoint_id(t.parent_config)
    return Thread(ns, ever, states[-1], leaves, states, lineage)


def read_threads(saver: BaseCheckpointSaver, thread_id: str) -> dict[str, Thread]:
    """Every namespace of the thread, read from the checkpointer (all of them: ``list``
    without a namespace)."""
    by_ns: dict[str, list[CheckpointTuple]] = {}
    for t in saver.list({"configurable": {"thread_id": thread_id}}):
        by_ns.setdefault(t.config["configurable"].get("checkpoint_ns", ""), []).append(t)
    return {ns: read_thread(saver, tuples, ns) for ns, tuples in by_ns.items()}


def settle(engine: sa.Engine, jobs: set[str], timeout: float = 30.0) -> set[str]:
    """Wait (up to ``timeout`` s) until every job in ``jobs`` is applied (a compaction in a
    thread is recorded at the next model call or by the reconciler: its archive rows are
    shown from then on); returns those applied."""
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(JOBS.c.job_id, JOBS.c.status).where(JOBS.c.job_id.in_(sorted(jobs)))
            ).all()
        applied = {r.job_id for r in rows if r.status == "applied"}
        if applied >= jobs or time.monotonic() > deadline:
            return applied
        time.sleep(0.2)


def read_archive(engine: sa.Engine, ids: set[str]) -> dict[str, list[Archived]]:
    """The archive's rows for message ``ids``, in every session that holds one of them (a
    subagent's rows may be kept under a session of its own), as its reader shows them."""
    table = archive.ARCHIVE
    with engine.connect() as conn:
        sessions = {
            r[0]
            for r in conn.execute(
                sa.select(table.c.session_id).where(table.c.message_id.in_(sorted(ids))).distinct()
            )
        }
    out: dict[str, list[Archived]] = {}
    for session in sorted(sessions):
        rows, _ = archive.read(engine, session, limit=1_000_000)
        for row in rows:
            (message,) = messages_from_dict([row["message"]])
            out.setdefault(row["message_id"], []).append(
                Archived(session, row["job_id"], row["summary_id"], message)
            )
    return out


def observe(
    shape: str,
    saver: BaseCheckpointSaver,
    thread_id: str,
    engine: sa.Engine,
    models: Sequence[ScriptedModel],
    results: Results,
    hard_limit: int,
    callee_tools: Iterable[str] = (),
) -> Run:
    """Read a finished run: its thread in every namespace, the archive once the compactions
    in it are recorded, and what its models and tools produced."""
    threads = read_threads(saver, thread_id)
    if "" not in threads:
        raise AssertionError(f"{shape}: the run wrote no checkpoint of thread {thread_id}")
    root_tuple = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
    if root_tuple is not None:
        threads[""].interrupted = any(
            w[1] == "__interrupt__" for w in root_tuple.pending_writes or []
        )
    summaries = [m for t in threads.values() for m in t.ever if is_summary(m)]
    jobs = {j for j in map(job_of, summaries) if j}
    heads = {job_of(m) for t in threads.values() for m in t.final if is_summary(m)} - {None}
    applied = settle(engine, {str(j) for j in heads}) if heads else set()
    ids = {str(m.id) for t in threads.values() for m in t.ever}
    ids |= {str(m.id) for m in (r for model in models for r in model.produced)}
    callees = frozenset(callee_tools)
    before: list[BaseMessage] = []
    if callees:
        for state in threads[""].states:
            last = state[-1] if state else None
            if (
                last is not None
                and {c["name"] for c in getattr(last, "tool_calls", None) or []} & callees
            ):
                before += state
    run = Run(
        shape=shape,
        thread_id=thread_id,
        threads=threads,
        produced=[r for model in models for r in model.produced],
        returned=list(results.returned),
        archived=read_archive(engine, ids),
        calls={model.name: list(model.calls) for model in models},
        hard_limit=hard_limit,
        callee_tools=callees,
        caller_before=before,
        compactions=jobs,
    )
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(JOBS.c.job_id, JOBS.c.status).where(JOBS.c.job_id.in_(sorted(jobs)))
        ).all()
    run.applied = {r.job_id for r in rows if r.status == "applied"} | applied
    return run
