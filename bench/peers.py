"""Benchmark 18, peers side by side, in tokens and money as well as chars (issue 22).

Every shared transcript (and, with ``TAU_BENCH_DIR`` set, a sample of tau-bench runs, as
benchmark 14 reads them) replayed as a live LangChain ``create_agent`` run
(``tests/agent_replay.py``'s scripted model and tools: the model answers with the
transcript's AI messages in order after :data:`MODEL_DELAY_S`, one ``invoke`` per human
message), once per compactor, every run of a pass at once in threads of one process on one
PostgreSQL checkpointer (as benchmark 8):

* ``none``: no compaction;
* ``lc``: LangChain's ``SummarizationMiddleware`` at its defaults but the trigger and keep
  (``trim_tokens_to_summarize`` 4,000);
* ``lc-untrimmed``: the same with ``trim_tokens_to_summarize=None``;
* ``context-editing``: LangChain's ``ContextEditingMiddleware`` with
  ``ClearToolUsesEdit(trigger=threshold / 4)`` (its defaults otherwise: keep the last 3
  results, ``[cleared]``);
* ``deepagents``: deepagents' ``SummarizationMiddleware`` with a ``FilesystemBackend``
  (evicted history offloaded to ``/conversation_history/<session>.md``),
  ``trim_tokens_to_summarize=None`` (its factory's default);
* ``langmem``: LangMem's ``summarize_messages`` with a running summary, called before each
  model call (its ``pre_model_hook`` use, as a ``wrap_model_call`` middleware here):
  ``max_tokens = max_tokens_before_summary = threshold / 4``, ``max_summary_tokens=1024``;
* ``masking``: a baseline of our own (a few lines: :class:`MaskOld`), every tool result but
  the last :data:`MASK_KEEP` replaced by a placeholder in what the model is sent ("The
  Complexity Trap", arXiv 2508.21433);
* ``offpath``: ``OffPathCompaction`` with a real worker.

All count tokens as chars / 4 (offpath's chars) against one threshold, :data:`THRESHOLD`
chars (keep :data:`KEEP`): offpath's defaults, which five of the seven shared transcripts
cross.

Two passes, one per summarizer shape, the same for every peer:

* ``offline-shaped``: no LLM. Peers get :class:`StubSummarizer` answering at once with the
  facts offpath's extractor finds in the prompt (an extractive summary, cut at
  :data:`SUMMARY_CHARS`); offpath's worker has no LLM configured and runs its offline
  summarizer;
* ``LLM-shaped``: a summary that names nothing (the seed's template padded with generic
  findings to :data:`SUMMARY_CHARS` chars) after :data:`LLM_DELAY_S`: peers get it from
  :class:`StubSummarizer` in-process, offpath's worker from the stub LLM over HTTP (behind its
  fact guard, as offpath ships).

Columns (per compactor, over all transcripts): peak context / threshold (the largest model
call); model calls over the threshold; seconds waited on compaction (the run's wall time less
its model calls' and the no-compaction run's own overhead); wall time against no compaction;
facts kept (the facts the agent stated, :func:`offpath.compaction.facts.stated_facts`, as
benchmark 10; tau-bench: its ground-truth ids, as benchmark 14) visible to the model at its
last call, kept verbatim or in a rewritten/summary message; recoverable (plus what a tool
can still read: offpath's archive for ``recall``, deepagents' offloaded history file);
tokens, counted exactly (:mod:`bench.tokens`, ``o200k_base``): the agent's input over the
whole run, the part a provider's prompt cache would serve (the prefix shared with the
previous call, when at least :data:`CACHE_MIN_TOKENS`: a compaction rewrites the prefix and
misses), the summarizer's input and output; cost at :data:`PRICES`; checkpoint bytes stored
for the thread at the end (PostgreSQL's ``pg_column_size`` of its rows, every checkpoint the
saver keeps).

Reported too: per transcript, chars / 4 against the exact count (the case for
``SUMMARIZATION_THRESHOLD_TOKENS``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    RUN_ID,
    Context,
    Result,
    create_pg_database,
    drop_pg_database,
    start_worker,
    wait,
    wait_for_log,
)

NAME = "peers"
MODES = (
    "none",
    "lc",
    "lc-untrimmed",
    "context-editing",
    "deepagents",
    "langmem",
    "masking",
    "offpath",
)
LABELS = {
    "none": "no compaction",
    "lc": "LangChain SummarizationMiddleware (defaults)",
    "lc-untrimmed": "LangChain SummarizationMiddleware (trim_tokens_to_summarize=None)",
    "context-editing": "LangChain ContextEditingMiddleware + ClearToolUsesEdit",
    "deepagents": "deepagents SummarizationMiddleware + file offload",
    "langmem": "LangMem summarize_messages (running summary)",
    "masking": "observation masking, last 10 results (baseline, ours)",
    "offpath": "offpath",
}
#: offpath's defaults (as benchmark 8); PEERS_THRESHOLD=20000,6000 reruns at another
THRESHOLD, KEEP = (int(x) for x in os.environ.get("PEERS_THRESHOLD", "60000,20000").split(","))
MODEL_DELAY_S, LLM_DELAY_S = 1.0, 2.0
QUICK_MODEL_DELAY_S, QUICK_LLM_DELAY_S = 0.05, 0.3
SUMMARY_CHARS = 3_000
MASK_KEEP = 10
MASKED = "[tool result omitted]"
CACHE_MIN_TOKENS = 1_024
TAU_SAMPLE = 5
#: $ per million tokens: (input, cached input, output). OpenAI's published API prices
#: (April 2025); the summarizer is priced as the agent's model.
PRICES = {
    "gpt-4.1-mini": (0.40, 0.10, 1.60),
    "gpt-4.1": (2.00, 0.50, 8.00),
}
#: Targets (issue 22), judged on the LLM-shaped pass.
TOKENS_SLACK = 1.10
FACTS_FLOOR = 0.90


# --- the same summarizer for every peer ------------------------------------------------


def _summary_text(prompt: str, shape: str) -> str:
    from stub_llm import pad_summary

    from bench.compacting import NAMES_NOTHING
    from offpath.compaction.facts.patterns import find

    if shape == "llm":
        return pad_summary(NAMES_NOTHING, SUMMARY_CHARS)
    lines, size = ["**Key facts:**"], 16
    for value, kind, _ in find(prompt):
        line = f"- {kind}: {value}"
        if size + len(line) + 1 > SUMMARY_CHARS:
            break
        if line not in lines:
            lines.append(line)
            size += len(line) + 1
    return "\n".join(lines)


def stub_summarizer(shape: str, delay_s: float) -> Any:
    """A chat model that writes summaries: ``offline``, the facts found in its prompt at once;
    ``llm``, a summary naming nothing after ``delay_s``. Records each call (prompt, answer)."""
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    from bench.tokens import message_text

    class StubSummarizer(BaseChatModel):
        shape: str = "offline"
        delay_s: float = 0.0
        records: list[tuple[list[Any], str]] = []

        @property
        def _llm_type(self) -> str:
            return "stub-summarizer"

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any):
            if self.delay_s:
                time.sleep(self.delay_s)
            prompt = "\n".join(message_text(m) for m in messages)
            text = _summary_text(prompt, self.shape)
            self.records.append((list(messages), text))
            return ChatResult(generations=[ChatGeneration(message=AIMessage(text))])

    return StubSummarizer(shape=shape, delay_s=delay_s if shape == "llm" else 0.0)


# --- the peers that are not middleware of their own ------------------------------------


def _masking() -> Any:
    from langchain.agents.middleware import AgentMiddleware

    class MaskOld(AgentMiddleware):
        """Baseline: all tool results but the last ``MASK_KEEP`` masked in the request."""

        def wrap_model_call(self, request: Any, handler: Any) -> Any:
            at = [i for i, m in enumerate(request.messages) if m.type == "tool"][:-MASK_KEEP]
            if not at:
                return handler(request)
            old = set(at)
            messages = [
                m.model_copy(update={"content": MASKED}) if i in old else m
                for i, m in enumerate(request.messages)
            ]
            return handler(request.override(messages=messages))

    return MaskOld()


def _langmem(model: Any) -> Any:
    from langchain.agents.middleware import AgentMiddleware
    from langmem.short_term import summarize_messages

    from bench.peak import chars_per_token

    class LangMemSummary(AgentMiddleware):
        """LangMem's ``summarize_messages`` before each model call, its running summary kept
        between calls (LangMem's ``pre_model_hook`` use keeps it in the graph's context)."""

        def __init__(self) -> None:
            super().__init__()
            self.running: Any = None

        def wrap_model_call(self, request: Any, handler: Any) -> Any:
            result = summarize_messages(
                list(request.messages),
                running_summary=self.running,
                model=model,
                max_tokens=THRESHOLD // 4,
                max_tokens_before_summary=THRESHOLD // 4,
                max_summary_tokens=1_024,
                token_counter=chars_per_token,
            )
            if result.running_summary is not None:
                self.running = result.running_summary
            return handler(request.override(messages=result.messages))

    return LangMemSummary()


# --- runs -------------------------------------------------------------------------------


@dataclass
class Doc:
    """One transcript to replay: its messages and the facts to look for."""

    name: str
    messages: list[Any]
    facts: list[str]


@dataclass
class Run:
    doc: str
    mode: str
    session: str
    calls: list[list[Any]] = field(default_factory=list)
    replies: list[Any] = field(default_factory=list)
    expected: int = 0
    seconds: float = 0.0
    error: str = ""
    summarizer: list[tuple[list[Any], str]] = field(default_factory=list)
    offload_dir: str = ""
    recoverable_text: str = ""  # what a tool can read back (archive, offloaded files)
    checkpoint_bytes: int = 0


def documents(quick: bool) -> list[Doc]:
    from shared import TRANSCRIPTS, load, messages_of

    from offpath.compaction.facts.extraction import stated_facts

    docs = []
    for path in TRANSCRIPTS:
        messages = messages_of(load(path))
        facts = list(dict.fromkeys(f.value for f in stated_facts(messages)))
        docs.append(Doc(path.stem, messages, facts))
    where = os.environ.get("TAU_BENCH_DIR")
    if where:
        from bench.groundtruth import conversation, facts_of, load_runs

        for label, run in load_runs(Path(where), True)[: 2 if quick else TAU_SAMPLE]:
            messages = conversation(run)
            text = "\n".join(str(m.content) for m in messages)
            facts = [f for f in facts_of(run) if f in text]
            if messages and any(m.type == "ai" for m in messages):
                docs.append(Doc(label, messages, facts))
    return docs


class Bench:
    def __init__(self, ctx: Context, saver: Any, agent_url: str, client: Any, shape: str):
        from offpath.config import load_settings

        self.settings = load_settings(
            summarization_threshold_chars=THRESHOLD, summarization_keep_chars=KEEP
        )
        self.saver, self.agent_url, self.client, self.shape = saver, agent_url, client, shape
        self.model_delay_s = QUICK_MODEL_DELAY_S if ctx.quick else MODEL_DELAY_S
        self.llm_delay_s = QUICK_LLM_DELAY_S if ctx.quick else LLM_DELAY_S
        self.tmp = Path(tempfile.mkdtemp(prefix=f"bench-peers-{shape}-"))

    def middleware(self, mode: str, run: Run, summarizer: Any) -> list[Any]:
        from langchain.agents.middleware import (
            ClearToolUsesEdit,
            ContextEditingMiddleware,
            SummarizationMiddleware,
        )

        from bench.peak import chars_per_token
        from offpath import OffPathCompaction

        trigger, keep = ("tokens", THRESHOLD // 4), ("tokens", KEEP // 4)
        if mode == "lc":
            return [
                SummarizationMiddleware(
                    summarizer, trigger=trigger, keep=keep, token_counter=chars_per_token
                )
            ]
        if mode == "lc-untrimmed":
            return [
                SummarizationMiddleware(
                    summarizer,
                    trigger=trigger,
                    keep=keep,
                    token_counter=chars_per_token,
                    trim_tokens_to_summarize=None,
                )
            ]
        if mode == "context-editing":
            return [
                ContextEditingMiddleware(
                    edits=[ClearToolUsesEdit(trigger=THRESHOLD // 4)],
                    token_counter=chars_per_token,
                )
            ]
        if mode == "deepagents":
            from deepagents.backends import FilesystemBackend
            from deepagents.middleware.summarization import SummarizationMiddleware as Deep

            run.offload_dir = str(self.tmp / run.session)
            os.makedirs(run.offload_dir, exist_ok=True)
            return [
                Deep(
                    summarizer,
                    backend=FilesystemBackend(root_dir=run.offload_dir, virtual_mode=True),
                    trigger=trigger,
                    keep=keep,
                    token_counter=chars_per_token,
                    trim_tokens_to_summarize=None,
                )
            ]
        if mode == "langmem":
            return [_langmem(summarizer)]
        if mode == "masking":
            return [_masking()]
        if mode == "offpath":
            return [
                OffPathCompaction(
                    self.settings, checkpointer_url=self.agent_url, client=self.client
                )
            ]
        return []

    def replay(self, doc: Doc, mode: str) -> Run:
        from agent_replay import TranscriptModel, scripted_tools
        from langchain.agents import create_agent
        from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

        # each run its own message objects (as benchmark 8): the runs go at once
        messages = [m.model_copy(deep=True) for m in doc.messages]
        system = messages[0] if isinstance(messages[0], SystemMessage) else None
        humans = [m for m in messages if isinstance(m, HumanMessage)]
        replies = [m for m in messages if isinstance(m, AIMessage)]
        if replies and replies[-1].tool_calls:
            replies.append(AIMessage(id=f"{doc.name}-end", content="Submitted."))
        run = Run(doc.name, mode, f"peers-{self.shape}-{mode}-{doc.name[:24]}-{RUN_ID}")
        run.expected, run.replies = len(replies), replies
        summarizer = stub_summarizer(self.shape, self.llm_delay_s)
        model = TranscriptModel(replies=replies, delay_s=self.model_delay_s)
        try:
            agent = create_agent(
                model,
                scripted_tools(messages),
                system_prompt=system,
                middleware=self.middleware(mode, run, summarizer),
                checkpointer=self.saver,
            )
        except Exception as exc:
            run.error = f"{type(exc).__name__}: {exc}"[:300]
            return run
        config = {"configurable": {"thread_id": run.session}, "recursion_limit": 10_000}
        started = time.perf_counter()
        try:
            for human in humans:
                if model.n_calls >= len(replies):
                    break
                agent.invoke({"messages": [human]}, config)
        except Exception as exc:  # reported, the other runs go on
            run.error = f"{type(exc).__name__}: {exc}"[:300]
        run.seconds = time.perf_counter() - started
        run.calls = list(model.calls)
        run.summarizer = list(summarizer.records)
        if run.offload_dir:
            run.recoverable_text = "\n".join(
                p.read_text(errors="replace")
                for p in Path(run.offload_dir).rglob("*")
                if p.is_file()
            )
        return run


def checkpoint_bytes(url: str, thread: str) -> int:
    import sqlalchemy as sa

    engine = sa.create_engine("postgresql+psycopg://" + url.partition("://")[2])
    try:
        with engine.connect() as conn:
            total = 0
            for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
                total += (
                    conn.execute(
                        sa.text(
                            f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table} t "
                            "WHERE thread_id = :t"
                        ),
                        {"t": thread},
                    ).scalar()
                    or 0
                )
            return int(total)
    finally:
        engine.dispose()


def archive_text(engine: Any, session: str) -> str:
    from offpath.stores import archive

    rows, _ = archive.read(engine, session, limit=100_000)
    return "\n".join(str(r["message"]) for r in rows)


def attribute(requests: list[dict[str, Any]], docs: list[Doc]) -> dict[str, list[dict[str, Any]]]:
    """The stub LLM's summarization requests (offpath's worker's) by transcript: the one whose
    tool results the prompt quotes most."""
    snippets = {
        d.name: [
            str(m.content)[:80]
            for m in d.messages
            if m.type == "tool" and len(str(m.content)) >= 40
        ]
        for d in docs
    }
    out: dict[str, list[dict[str, Any]]] = {d.name: [] for d in docs}
    for req in requests:
        msgs = req.get("messages") or []
        if not str((msgs[0] if msgs else {}).get("content", "")).startswith("You compact"):
            continue
        text = "\n".join(str(m.get("content", "")) for m in msgs)
        best = max(docs, key=lambda d: sum(s in text for s in snippets[d.name][:200]))
        out[best.name].append(req)
    return out


# --- a pass ------------------------------------------------------------------------------


def run_pass(ctx: Context, shape: str, docs: list[Doc]) -> tuple[list[Run], float, dict]:
    from offpath.coordination.runtime import Client
    from offpath.stores.checkpoints import open_checkpoints_url
    from offpath.stores.db.engine import migrate

    llm_delay = QUICK_LLM_DELAY_S if ctx.quick else LLM_DELAY_S
    assert ctx.stub is not None
    ctx.stub.set_delay(llm_delay)
    ctx.stub._http.post(
        "/_control",
        json={"mode": "ok", "delay_s": llm_delay, "summary_chars": SUMMARY_CHARS},
    ).raise_for_status()
    env = {
        **os.environ,
        "LOG_LEVEL": "INFO",
        "SUMMARIZATION_THRESHOLD_CHARS": str(THRESHOLD),
        "SUMMARIZATION_KEEP_CHARS": str(KEEP),
    }
    if shape == "offline":  # no LLM: the worker's offline summarizer
        env["OPENAI_BASE_URL"] = ""
        env["OPENAI_API_KEY"] = ""
    agent_url = create_pg_database(f"offpath_bench_peers_{shape}")
    log_path = Path(tempfile.gettempdir()) / f"bench-peers-{shape}-worker-{RUN_ID}.log"
    with open(log_path, "ab") as out:
        worker = start_worker(env, f"bench-peers-{shape}-{RUN_ID}@%h", out, loglevel="info")
    bench = None
    runs: list[Run] = []
    extra: dict[str, Any] = {"log": str(log_path)}
    try:
        from offpath.config import load_settings

        settings = load_settings(
            summarization_threshold_chars=THRESHOLD, summarization_keep_chars=KEEP
        )
        migrate(settings)
        client = Client.open(settings)
        try:
            wait_for_log(log_path, "ready.", worker, 60)
            with open_checkpoints_url(agent_url, settings) as checkpoints:
                bench = Bench(ctx, checkpoints.saver, agent_url, client, shape)
                started = time.perf_counter()
                with ThreadPoolExecutor(len(docs) * len(MODES), thread_name_prefix="peers") as pool:
                    futures = [pool.submit(bench.replay, d, m) for d in docs for m in MODES]
                    runs = [f.result() for f in futures]
                extra["wall"] = time.perf_counter() - started
            offpath_runs = [r for r in runs if r.mode == "offpath"]

            def settled() -> bool:
                import sqlalchemy as sa

                with client.engine.connect() as conn:
                    n = conn.execute(
                        sa.text(
                            "SELECT count(*) FROM compaction_jobs WHERE session_id = ANY(:s) "
                            "AND status IN ('queued', 'running')"
                        ),
                        {"s": [r.session for r in offpath_runs]},
                    ).scalar()
                return not n

            try:
                wait(settled, 60, interval=0.5)
            except RuntimeError:
                pass
            for r in offpath_runs:
                r.recoverable_text = archive_text(client.engine, r.session)
            for r in runs:
                r.checkpoint_bytes = checkpoint_bytes(agent_url, r.session)
            extra["stub"] = attribute(ctx.stub.requests(), docs) if shape == "llm" else {}
        finally:
            client.close()
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=10)
        drop_pg_database(agent_url)
        ctx.stub._http.post("/_control", json={"mode": "ok", "summary_chars": 0})
        ctx.stub.set_delay(0.0)
        if bench is not None:
            shutil.rmtree(bench.tmp, ignore_errors=True)
    return runs, extra.get("wall", 0.0), extra


# --- figures -----------------------------------------------------------------------------


@dataclass
class Figures:
    peak: int = 0
    over: int = 0
    calls: int = 0
    expected: int = 0
    seconds: float = 0.0
    waited: float = 0.0
    facts: int = 0
    kept: int = 0
    summarized: int = 0
    tool: int = 0
    agent_in: int = 0
    cached: int = 0
    agent_out: int = 0
    sum_in: int = 0
    sum_out: int = 0
    ckpt: int = 0
    errors: list[str] = field(default_factory=list)

    def cost(self, price: tuple[float, float, float]) -> float:
        p_in, p_cached, p_out = price
        return (
            (self.agent_in - self.cached) * p_in
            + self.cached * p_cached
            + (self.agent_out + self.sum_out) * p_out
            + self.sum_in * p_in
        ) / 1e6

    @property
    def tokens(self) -> int:
        return self.agent_in + self.agent_out + self.sum_in + self.sum_out


def measure(runs: list[Run], docs: list[Doc], extra: dict, delay: float) -> dict[str, Figures]:
    from bench.compacting import text_of
    from bench.tokens import Counter, count_text, message_text
    from offpath.compaction.accounting import total_chars

    counter = Counter()
    by_doc = {d.name: d for d in docs}
    none = {r.doc: r for r in runs if r.mode == "none"}
    out = {m: Figures() for m in MODES}
    for r in runs:
        f = out[r.mode]
        doc = by_doc[r.doc]
        if r.error:
            f.errors.append(f"{r.doc}: {r.error}")
        sent = [total_chars(c) for c in r.calls]
        f.peak = max(f.peak, max(sent, default=0))
        f.over += sum(c > THRESHOLD for c in sent)
        f.calls += len(r.calls)
        f.expected += r.expected
        f.seconds += r.seconds
        base = none.get(r.doc)
        overhead = (base.seconds - len(base.calls) * delay) if base else 0.0
        f.waited += max(0.0, r.seconds - len(r.calls) * delay - overhead) if r.mode != "none" else 0
        if os.environ.get("BENCH_PEERS_DEBUG"):
            print(
                f"peers: {r.mode} {r.doc}: {len(r.calls)} calls, {r.seconds:.1f} s, beyond the "
                f"model's delay {r.seconds - len(r.calls) * delay:.1f} s (none: {overhead:.1f} s)",
                flush=True,
            )
        # facts at the last model call
        last = r.calls[-1] if r.calls else []
        originals = {hash(text_of(m)) for m in doc.messages}
        verbatim = "\n".join(text_of(m) for m in last if hash(text_of(m)) in originals)
        rewritten = "\n".join(text_of(m) for m in last if hash(text_of(m)) not in originals)
        for fact in doc.facts:
            f.facts += 1
            if fact in verbatim:
                f.kept += 1
            elif fact in rewritten:
                f.summarized += 1
            elif fact in r.recoverable_text:
                f.tool += 1
            if os.environ.get("BENCH_PEERS_DEBUG") and fact not in verbatim + rewritten:
                print(f"peers: {r.mode} {r.doc}: not visible: {fact!r}", flush=True)
                dump = Path(tempfile.gettempdir()) / f"bench-peers-last-{r.mode}-{r.doc}.txt"
                dump.write_text("\n\n".join(f"[{m.type} {m.id}]\n{text_of(m)}" for m in last))
        # tokens
        previous: list[tuple[str, int]] = []
        for call in r.calls:
            keys = [(str(m.id), hash(message_text(m))) for m in call]
            tokens = [counter.message(m) for m in call]
            n = 0
            while n < min(len(keys), len(previous)) and keys[n] == previous[n]:
                n += 1
            prefix = sum(tokens[:n])
            f.agent_in += sum(tokens)
            f.cached += prefix if prefix >= CACHE_MIN_TOKENS else 0
            previous = keys
        f.agent_out += sum(counter.message(m) for m in r.replies[: len(r.calls)])
        for prompt, answer in r.summarizer:
            f.sum_in += sum(counter.message(m) for m in prompt)
            f.sum_out += count_text(answer)
        if r.mode == "offpath":
            for req in (extra.get("stub") or {}).get(r.doc, []):
                f.sum_in += sum(count_text(str(m.get("content", ""))) for m in req["messages"])
                f.sum_out += count_text(_summary_text("", "llm"))
        f.ckpt += r.checkpoint_bytes
    return out


def token_error(docs: list[Doc]) -> list[str]:
    from bench.tokens import Counter
    from offpath.compaction.accounting import total_chars

    counter = Counter()
    lines = [
        "| transcript | chars | tokens (o200k_base) | chars per token | chars / 4 error |",
        "|---|---|---|---|---|",
    ]
    for d in docs:
        chars, tokens = total_chars(d.messages), counter.messages(d.messages)
        lines.append(
            f"| {d.name} | {chars:,} | {tokens:,} | {chars / tokens:.2f} | "
            f"{(chars / 4 - tokens) / tokens:+.1%} |"
        )
    return lines


def table(figures: dict[str, Figures], shape: str) -> list[str]:
    none = figures["none"]
    names = list(PRICES)
    lines = [
        f"**{'LLM-shaped' if shape == 'llm' else 'offline-shaped'} summarizer**",
        "",
        "| compactor | peak / threshold | calls over threshold | waited s | wall vs none | "
        "facts kept | recoverable (kept / summarized / tool) | agent input tokens (cached) | "
        "summarizer in / out | " + " | ".join(f"$ {n}" for n in names) + " | checkpoint bytes |",
        "|---|---|---|---|---|---|---|---|---|" + "---|" * len(names) + "---|",
    ]
    for mode in MODES:
        f = figures[mode]
        share = lambda n, f=f: n / max(f.facts, 1)  # noqa: E731
        calls = f"{f.over} of {f.calls}" + (
            "" if f.calls == f.expected else f" (of {f.expected} expected)"
        )
        lines.append(
            f"| {LABELS[mode]} | {f.peak / THRESHOLD:.2f} | {calls} | {f.waited:.1f} | "
            f"x{f.seconds / none.seconds if none.seconds else 0:.2f} | "
            f"{share(f.kept + f.summarized):.0%} | "
            f"{share(f.kept + f.summarized + f.tool):.0%} ({share(f.kept):.0%} / "
            f"{share(f.summarized):.0%} / {share(f.tool):.0%}) | "
            f"{f.agent_in:,} ({f.cached / max(f.agent_in, 1):.0%}) | {f.sum_in:,} / {f.sum_out:,} | "
            + " | ".join(f"{f.cost(PRICES[n]):.2f}" for n in names)
            + f" | {f.ckpt:,} |"
        )
    return lines


def run(ctx: Context) -> Result:
    from bench.tokens import exact_available

    global MODES
    docs = documents(ctx.quick)
    # a subset, to look into one compactor or transcript: PEERS_MODES=none,offpath
    # PEERS_DOCS=miniswe-django-11910 (none is always run: the others are measured against it)
    if os.environ.get("PEERS_DOCS"):
        docs = [d for d in docs if d.name in os.environ["PEERS_DOCS"].split(",")]
    if os.environ.get("PEERS_MODES"):
        MODES = tuple(m for m in MODES if m == "none" or m in os.environ["PEERS_MODES"].split(","))
    delay = QUICK_MODEL_DELAY_S if ctx.quick else MODEL_DELAY_S
    passes = {}
    walls = {}
    shapes = os.environ.get("PEERS_SHAPES", "offline,llm").split(",")  # a subset, to look
    # into one; the report needs both
    for shape in ("offline", "llm"):
        if shape not in shapes:
            continue
        runs, wall, extra = run_pass(ctx, shape, docs)
        passes[shape] = measure(runs, docs, extra, delay)
        walls[shape] = wall
        print(
            f"bench: peers: {shape}-shaped pass {wall:.0f} s (worker log {extra['log']})",
            flush=True,
        )
    if len(passes) < 2:
        return Result(NAME, "-", "a subset of the passes (PEERS_SHAPES): not reported", None)
    return report(passes, walls, docs, ctx, exact_available())


def report(passes: dict, walls: dict, docs: list[Doc], ctx: Context, exact: bool) -> Result:
    llm = passes["llm"]
    off = llm["offpath"]
    peers = [m for m in MODES if m not in ("offpath", "none")] or ["none"]
    share = lambda f, n: n / max(f.facts, 1)  # noqa: E731
    visible = {m: share(llm[m], llm[m].kept + llm[m].summarized) for m in MODES}
    recov = {m: share(llm[m], llm[m].kept + llm[m].summarized + llm[m].tool) for m in MODES}
    good = [m for m in peers if visible[m] >= FACTS_FLOOR]
    cheapest = min(good, key=lambda m: llm[m].tokens, default=None)
    checks = {
        "peak": all(off.peak <= llm[m].peak for m in peers),
        "waited": all(off.waited <= llm[m].waited + 0.5 for m in peers),
        "facts": all(visible["offpath"] >= visible[m] for m in peers),
        "recoverable": all(recov["offpath"] >= recov[m] for m in peers),
        "tokens": cheapest is None or off.tokens <= TOKENS_SLACK * llm[cheapest].tokens,
    }
    measured = (
        f"LLM-shaped: offpath peak {off.peak / THRESHOLD:.2f}x threshold (peers "
        f"{min(llm[m].peak for m in peers) / THRESHOLD:.2f}-{max(llm[m].peak for m in peers) / THRESHOLD:.2f}), "
        f"waited {off.waited:.1f} s, facts {visible['offpath']:.0%} / recoverable "
        f"{recov['offpath']:.0%}, {off.tokens:,} tokens"
        + (
            f" vs {llm[cheapest].tokens:,} for {cheapest} (cheapest peer keeping >= "
            f"{FACTS_FLOOR:.0%} of facts)"
            if cheapest
            else f" (no peer keeps >= {FACTS_FLOOR:.0%} of facts)"
        )
    )
    model_delay = QUICK_MODEL_DELAY_S if ctx.quick else MODEL_DELAY_S
    llm_delay = QUICK_LLM_DELAY_S if ctx.quick else LLM_DELAY_S
    details = [
        f"transcripts: {', '.join(d.name for d in docs)}"
        + ("" if os.environ.get("TAU_BENCH_DIR") else " (TAU_BENCH_DIR unset: no tau-bench sample)")
        + f"; facts: {sum(len(d.facts) for d in docs)} (stated by the agent, as benchmark 10)",
        f"settings: threshold {THRESHOLD:,} chars, keep {KEEP:,} (tokens = chars / 4 for every "
        f"peer's trigger and keep: trigger=('tokens', {THRESHOLD // 4}), keep=('tokens', "
        f"{KEEP // 4})); ClearToolUsesEdit(trigger={THRESHOLD // 4}); LangMem max_tokens = "
        f"max_tokens_before_summary = {THRESHOLD // 4}, max_summary_tokens 1024; masking keeps "
        f"the last {MASK_KEEP} tool results; the scripted model answers after {model_delay:g} s; "
        f"the LLM-shaped summarizer after {llm_delay:g} s with {SUMMARY_CHARS:,} chars; all "
        f"{len(docs) * len(MODES)} runs of a pass at once; passes {walls.get('offline', 0):.0f} s "
        f"(offline-shaped) and {walls.get('llm', 0):.0f} s (LLM-shaped)",
        "tokens: "
        + (
            "exact, o200k_base (quicktok-v1, the bench extra)"
            if exact
            else "chars / 4: quicktok-v1 is not installed (`uv sync --extra bench`)"
        )
        + f"; cached = the prefix shared with the previous call when >= {CACHE_MIN_TOKENS:,} "
        "tokens; $ = agent input (cached at the cached price) + agent output + summarizer "
        "input + output, at "
        + ", ".join(
            f"{n} ${a:g} / ${c:g} cached / ${o:g} out per M" for n, (a, c, o) in PRICES.items()
        )
        + " (OpenAI's published prices, April 2025); offpath's offline-shaped summarizer "
        "is no model call (0 tokens)",
        "waited s = the runs' wall time less their model calls' (calls x the model's delay) "
        "less the no-compaction run's own overhead, summed over transcripts; facts kept = "
        "visible at the run's last model call; recoverable adds what a tool can still read "
        "(offpath's archive for recall, deepagents' offloaded history file); offpath's fact "
        "guard pins what its own extractor finds, which is also how these facts are chosen "
        "(the tau-bench sample's ground truth is not)",
        "checkpoint bytes: pg_column_size of the thread's rows in checkpoints, "
        "checkpoint_blobs, checkpoint_writes at the end (every checkpoint the saver keeps)",
        "targets (LLM-shaped pass): "
        + ", ".join(f"{k} {'met' if v else 'missed'}" for k, v in checks.items()),
    ]
    errors = [f"{LABELS[m]}: {e}" for p in passes.values() for m in MODES for e in p[m].errors]
    if errors:
        details.append("errors: " + "; ".join(dict.fromkeys(errors))[:2000])
    lines = [
        *table(passes["llm"], "llm"),
        "",
        *table(passes["offline"], "offline"),
        "",
        "**chars / 4 against exact token counts** (o200k_base"
        + ("" if exact else ", not installed: chars / 4")
        + ")",
        "",
        *token_error(docs),
    ]
    return Result(
        "18. Peers side by side",
        f"offpath <= every peer on peak and waited seconds, highest on facts kept and "
        f"recoverable; total tokens within {TOKENS_SLACK - 1:.0%} of the cheapest peer keeping "
        f">= {FACTS_FLOOR:.0%} of the facts",
        measured,
        all(checks.values()),
        details,
        "; ".join(k for k, v in checks.items() if not v),
        table=lines,
    )
