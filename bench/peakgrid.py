"""Benchmark 17, the peak-context grid (issue 18, "Benchmarks"): live ``create_agent`` runs of
SRE sessions and of every shared transcript over the threshold, side by side in one run:

* modes: no compaction; LangChain's ``SummarizationMiddleware`` with the system prompt in the
  thread (the first input message) and with it given as ``system_prompt=``; offpath's
  ``OffPathCompaction`` with a real worker;
* thresholds / keep windows :data:`THRESHOLDS`, scripted-model delays :data:`DELAYS`, one
  summary latency (:data:`SUMMARY_S`), two summarizers: ``offline`` (offpath's offline
  summarizer, made to take :data:`SUMMARY_S` by :mod:`bench.slow_offline`; for
  ``SummarizationMiddleware`` a model answering the stub LLM's short summary) and ``llm``
  (summaries of about :data:`LLM_SUMMARY_CHARS` chars: offpath's worker calls the stub LLM
  over HTTP, ``SummarizationMiddleware`` a model answering the same padded summary).

The sample (:func:`cells`): the whole grid on the SRE workloads (:func:`sre_workloads`), every
transcript at the middle setting (:data:`MIDDLE`) with both summarizers, and the SRE workloads
with a system prompt of 30-55% of the threshold (:data:`PROMPT_ROWS`, issue 30: the fixed part
counts once) with both summarizers, on time and ``late`` (:data:`LATE_SUMMARY_S`: turns arrive
while the summary is written). Worker settings are
per process, so there is one worker per (threshold, summarizer), each on its own queue; the
middleware publishes to its configuration's queue. Runs of one model delay go at once, each
in its own thread of this process (they mostly sleep), on one PostgreSQL database (offpath's
runs on a connection pool of their own, the baselines on another); the delays run one after
another (``BENCH_PEAKGRID_APART=1``: within a delay, offpath's runs with the no-compaction
runs first, then the ``SummarizationMiddleware`` runs, whose wall time then compares two
phases).

Per row, the targets of issue 18: peak <= :data:`PEAK_TARGET` x threshold (bar
:data:`PEAK_BAR`; where the system prompt is under half the threshold), calls over the
threshold <= :data:`OVER_SHARE`, none over the hard limit, maskings <= :data:`MASK_SHARE` of
calls, wall time <= :data:`WALL_RATIO` x no compaction; and issue 30's: no request kept without
its answer in any call (the whole-turn check of ``tests/shared.py`` ``turn_problems``).
"""

from __future__ import annotations

import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    RUN_ID,
    Context,
    Result,
    create_pg_database,
    drop_pg_database,
    wait,
    wait_for_log,
)
from bench.peak import MASKED, LogLines, job_counts

NAME = "peakgrid"
TITLE = "17. Peak context on the grid (issue 18)"

THRESHOLDS = ((60_000, 20_000), (30_000, 10_000), (20_000, 6_000))
DELAYS = (0.1, 0.5, 1.0)
SUMMARIZERS = ("offline", "llm")
#: Every summarizer's latency (s), and the size of the LLM-shaped summaries (chars).
SUMMARY_S, LLM_SUMMARY_CHARS = 2.0, 4_000
#: Where the transcripts run: the middle threshold and delay.
MIDDLE = ((30_000, 10_000), 0.5)
QUICK_SUMMARY_S = 0.3
#: Rows whose system prompt is 30-55% of the threshold (issue 30): (threshold, keep, prompt
#: chars); the SRE agent issue 30 measured has a 32,547-char prompt.
PROMPT_ROWS = ((60_000, 20_000, 32_547), (30_000, 10_000, 12_000))
#: The ``late`` summarizer (s, whatever the run's summary latency): turns arrive meanwhile.
LATE_SUMMARY_S = 6.0
MODES = ("none", "sm-thread", "sm-system", "offpath")
LABELS = {
    "none": "no compaction",
    "sm-thread": "SummarizationMiddleware, system prompt in the thread",
    "sm-system": "SummarizationMiddleware, system_prompt=",
    "offpath": "offpath",
}
#: Targets (issue 18).
PEAK_TARGET, PEAK_BAR = 1.25, 1.5
OVER_SHARE = 0.05
MASK_SHARE = 0.02
WALL_RATIO = 1.02
#: A missed target's name, by the first word of its phrase (:func:`row_misses`).
KINDS = {
    "ended": "run not finished",
    "peak": "peak",
    "over": "calls over the threshold",
    "maskings": "maskings",
    "wall": "wall time",
    "requests": "requests kept without their answer",
}


@dataclass(frozen=True)
class Workload:
    name: str
    messages: list[Any]
    kind: str  # "sre" | "prompt" | "transcript"
    #: chars of its system message (0: none)
    prompt: int = 0


@dataclass(frozen=True)
class Cell:
    """One run: a workload in a mode at a setting (``summarizer`` "" for no compaction)."""

    workload: str
    threshold: int
    keep: int
    delay: float
    summarizer: str
    mode: str
    #: the summarizer takes :data:`LATE_SUMMARY_S` (its own worker)
    late: bool = False

    @property
    def config(self) -> tuple[int, int, str, bool]:
        return (self.threshold, self.keep, self.summarizer, self.late)


@dataclass
class Run:
    cell: Cell
    session: str
    calls: int = 0
    expected: int = 0
    sent: list[int] = field(default_factory=list)
    seconds: float = 0.0
    masked_calls: int = 0
    summary_chars: list[int] = field(default_factory=list)  # each distinct summary seen
    first_summary_call: int | None = None  # 1-based
    behind: list[int] = field(default_factory=list)  # see bench.peak.job_counts
    error: str = ""
    jobs: Counter[str] = field(default_factory=Counter)
    maskings: int = 0
    reasons: dict[str, str] = field(default_factory=dict)
    #: what the whole-turn check found in any call (``tests/shared.py`` ``turn_problems``:
    #: ``unanswered:<request>``, ``headless:<message>``), the turn in progress aside
    broken_turns: list[str] = field(default_factory=list)

    @property
    def peak(self) -> int:
        return max(self.sent, default=0)

    @property
    def finished(self) -> bool:
        return not self.error and self.calls == self.expected


def sre_workloads() -> list[Workload]:
    """Two SRE investigations of the shape issue 18 measured (``tests/sre_sessions.py``):
    8 human turns each; one with a 75,000-char ``kubectl get pods -A`` output and up to 4
    parallel calls, one with a 62,000-char output and up to 6 parallel calls per step."""
    from sre_sessions import sre_session

    return [
        Workload("sre-75k-dump", sre_session(seed=7, dump_chars=75_000, prefix="g1"), "sre"),
        Workload(
            "sre-6-parallel",
            sre_session(seed=3, dump_chars=62_000, parallel=6, steps_per_turn=(3, 5), prefix="g2"),
            "sre",
        ),
    ]


def long_prompt(chars: int) -> Any:
    """A system prompt of ``chars`` chars: the SRE workloads' own, then a runbook's rules."""
    from langchain_core.messages import SystemMessage
    from sre_sessions import SYSTEM

    text, k = SYSTEM + "\n", 0
    while len(text) < chars:
        k += 1
        text += f"{k}. Before any change, read the runbook's section {k} and say what it allows.\n"
    return SystemMessage(id=f"prompt-{chars}", content=text[:chars])


def prompt_workloads(sre: Sequence[Workload]) -> list[tuple[Workload, int, int]]:
    """Each SRE workload with its system prompt made :data:`PROMPT_ROWS`' size, with the
    threshold and keep window it runs at."""
    out = []
    for threshold, keep, chars in PROMPT_ROWS:
        for w in sre:
            messages = [long_prompt(chars), *w.messages[1:]]
            name = f"{w.name}-prompt{chars // 1000}k"
            out.append((Workload(name, messages, "prompt", chars), threshold, keep))
    return out


def transcript_workloads(threshold: int) -> list[Workload]:
    """Every transcript of ../shared/transcripts whose messages exceed ``threshold`` chars."""
    from shared import TRANSCRIPTS, load, messages_of

    from offpath.compaction.accounting import total_chars

    out = []
    for path in TRANSCRIPTS:
        messages = messages_of(load(path))
        if total_chars(messages) > threshold:
            out.append(Workload(path.stem, messages, "transcript"))
    return out


def cells(
    quick: bool,
    sre: Sequence[Workload],
    transcripts: Sequence[Workload],
    prompts: Sequence[tuple[Workload, int, int]] = (),
) -> list[Cell]:
    """The sample (the whole grid is ~160 runs, over 25 min on a loaded 2-core host): the whole
    grid on the first SRE workload; the second at :data:`MIDDLE` with both summarizers; every
    transcript at :data:`MIDDLE` with the LLM-shaped summarizer (the harder one: issue 18
    measured 1.74x with it); each workload of ``prompts`` at its own setting and the middle
    delay, both summarizers, on time and late. Quick: the first SRE workload at the middle
    threshold, 0.1 s per model call, both summarizers; the first prompt workload of each
    setting the same way, on time and late."""
    out: list[Cell] = []

    def add(
        w: str,
        thresholds: Sequence[tuple[int, int]],
        delays: Sequence[float],
        summarizers: Sequence[str] = SUMMARIZERS,
        lates: Sequence[bool] = (False,),
    ) -> None:
        for delay in delays:
            # no compaction does not depend on the threshold nor on the summarizer
            out.append(Cell(w, *thresholds[0], delay, "", "none"))
            for threshold, keep in thresholds:
                for s in summarizers:
                    for late in lates:
                        for mode in MODES[1:]:
                            out.append(Cell(w, threshold, keep, delay, s, mode, late))

    if quick:
        add(sre[0].name, [MIDDLE[0]], [0.1])
        for w, threshold, keep in prompts:
            if w.name.startswith(sre[0].name):
                add(w.name, [(threshold, keep)], [0.1], lates=(False, True))
        return out
    add(sre[0].name, THRESHOLDS, DELAYS)
    for w in sre[1:]:
        add(w.name, [MIDDLE[0]], [MIDDLE[1]])
    for w in transcripts:
        add(w.name, [MIDDLE[0]], [MIDDLE[1]], ["llm"])
    for w, threshold, keep in prompts:
        add(w.name, [(threshold, keep)], [MIDDLE[1]], lates=(False, True))
    return out


@dataclass(frozen=True)
class Script:
    system: Any
    inputs: list[list[Any]]  # the human messages of each run
    replies: list[Any]
    tools: list[Any]


def script_of(messages: Sequence[Any], end_prefix: str) -> Script:
    """What a live replay needs: one run per group of consecutive human messages, the model's
    replies in order (a run whose last reply still calls a tool gets a closing text reply, so
    that it ends), the scripted tools."""
    from agent_replay import scripted_tools
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    system = messages[0] if isinstance(messages[0], SystemMessage) else None
    inputs: list[list[Any]] = []
    replies: list[Any] = []
    pending: list[Any] = []
    turn: list[Any] = []

    def close() -> None:
        if turn and turn[-1].tool_calls:
            turn.append(AIMessage(id=f"{end_prefix}-{len(inputs)}", content="Noted."))
        replies.extend(turn)
        turn.clear()

    for m in messages:
        if isinstance(m, HumanMessage):
            pending.append(m)
        elif isinstance(m, AIMessage):
            if pending:
                close()
                inputs.append(pending)
                pending = []
            if inputs:
                turn.append(m)
    close()
    return Script(system, inputs, replies, scripted_tools(messages))


def summary_model(chars: int, delay_s: float) -> Any:
    """SummarizationMiddleware's summarizer: answers after ``delay_s`` with the stub LLM's
    summary padded to ``chars`` (0: its short summary), as the stub LLM does for offpath."""
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from stub_llm import SUMMARY, pad_summary

    class StubSummarizer(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "stub-summarizer"

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any):
            time.sleep(delay_s)
            text = pad_summary(SUMMARY.format(first="the incident", n=len(messages)), chars)
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])

    return StubSummarizer()


def chars_per_token(messages: Any) -> int:
    from offpath.compaction.accounting import total_chars

    return total_chars(list(messages)) // 4


class Grid:
    """What the runs share: the agents' checkpointers (offpath's runs, the others'), a client
    per worker configuration."""

    def __init__(
        self,
        saver: Any,
        offpath_saver: Any,
        agent_url: str,
        clients: dict[tuple[int, int, str, bool], Any],
        summary_s: float,
        workloads: dict[str, Workload],
    ) -> None:
        self.saver = saver
        self.offpath_saver = offpath_saver
        self.agent_url = agent_url
        self.clients = clients
        self.summary_s = summary_s
        self.workloads = workloads

    def middleware(self, cell: Cell) -> list[Any]:
        from langchain.agents.middleware import SummarizationMiddleware

        from offpath import OffPathCompaction

        if cell.mode == "none":
            return []
        if cell.mode == "offpath":
            client = self.clients[cell.config]
            return [
                OffPathCompaction(client.settings, checkpointer_url=self.agent_url, client=client)
            ]
        chars = LLM_SUMMARY_CHARS if cell.summarizer == "llm" else 0
        delay = LATE_SUMMARY_S if cell.late else self.summary_s
        return [
            SummarizationMiddleware(
                summary_model(chars, delay),
                trigger=("tokens", cell.threshold // 4),
                keep=("tokens", cell.keep // 4),
                token_counter=chars_per_token,
                trim_tokens_to_summarize=None,  # as benchmark 8: its default keeps nothing
            )
        ]

    def replay(self, cell: Cell) -> Run:
        from agent_replay import TranscriptModel
        from langchain.agents import create_agent
        from langchain_core.messages import ToolMessage
        from shared import marked_summary, turn_problems

        from offpath.compaction.accounting import message_chars, total_chars

        w = self.workloads[cell.workload]
        script = script_of(w.messages, f"{cell.workload}-end")  # each run its own objects
        tag = f"{cell.threshold // 1000}k-{cell.delay:g}-{cell.summarizer or 'x'}"
        tag += "-late" if cell.late else ""
        run = Run(cell, f"pg-{cell.mode}-{cell.workload[:28]}-{tag}-{RUN_ID}")
        run.expected = len(script.replies)
        model = TranscriptModel(replies=script.replies, delay_s=cell.delay)
        in_thread = cell.mode == "sm-thread" and script.system is not None
        agent = create_agent(
            model,
            script.tools,
            system_prompt=None if in_thread else script.system,
            middleware=self.middleware(cell),
            checkpointer=self.offpath_saver if cell.mode == "offpath" else self.saver,
        )
        config = {"configurable": {"thread_id": run.session}, "recursion_limit": 10_000}
        started = time.perf_counter()
        try:
            for k, humans in enumerate(script.inputs):
                first = [script.system] if in_thread and k == 0 else []
                agent.invoke({"messages": [*first, *humans]}, config)
        except Exception as exc:  # reported, the other runs go on
            run.error = f"{type(exc).__name__}: {exc}"[:300]
        run.seconds = time.perf_counter() - started
        run.calls = len(model.calls)
        run.sent = [total_chars(c) for c in model.calls]
        seen: dict[tuple[str, int], int] = {}
        broken: set[str] = set()
        for k, sent in enumerate(model.calls, 1):
            # the turn in progress aside (each call's last turn), a request kept without its
            # answer or an answer without its request (DESIGN.md invariant 17)
            broken |= turn_problems([m for m in sent if m.type != "system"])
            for m in sent:
                if marked_summary(m):
                    if run.first_summary_call is None:
                        run.first_summary_call = k
                    seen.setdefault((str(m.id), hash(str(m.content))), message_chars(m))
            if any(isinstance(m, ToolMessage) and str(m.content).startswith(MASKED) for m in sent):
                run.masked_calls += 1
        run.summary_chars = list(seen.values())
        # what the transcript itself holds (a request followed by another with no answer
        # between, as SWE-agent's demonstration and task) is no compactor's doing
        inherent = turn_problems([m for m in w.messages if m.type != "system"])
        run.broken_turns = sorted(broken - inherent)
        model.calls.clear()
        return run


class TimedLines(LogLines):
    """The middleware's log lines, with their time (UTC), to set beside the workers' logs."""

    def emit(self, record: logging.LogRecord) -> None:
        stamp = time.strftime("%H:%M:%S", time.gmtime(record.created))
        with self._guard:
            self.lines.append(
                f"{stamp}.{int(record.msecs):03d} {record.levelname} {record.getMessage()}"
            )


def start_worker(env: dict[str, str], name: str, out: Any) -> subprocess.Popen[bytes]:
    """A worker of the project's Celery app through :mod:`bench.slow_offline`."""
    cmd = [sys.executable, "-m", "bench.slow_offline", "-A", "offpath.worker.celery_app"]
    cmd += ["worker", "--without-mingle", "--without-gossip", "-l", "info", "-n", name]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def run(ctx: Context) -> Result:
    from offpath.config import EnvironmentSettings, get_settings
    from offpath.coordination.runtime import Client
    from offpath.stores.checkpoints import open_checkpoints_url
    from offpath.stores.db.engine import migrate

    base = get_settings()
    summary_s = QUICK_SUMMARY_S if ctx.quick else SUMMARY_S
    sre = sre_workloads()
    transcripts = [] if ctx.quick else transcript_workloads(MIDDLE[0][0])
    prompts = prompt_workloads(sre)
    workloads = {w.name: w for w in [*sre, *transcripts, *(w for w, _, _ in prompts)]}
    grid = cells(ctx.quick, sre, transcripts, prompts)
    if only := os.environ.get("BENCH_PEAKGRID_ONLY"):  # e.g. "miniswe-django" (to look into a row)
        grid = [c for c in grid if any(w in c.workload for w in only.split(","))]
    configs = sorted({c.config for c in grid if c.mode == "offpath"}, reverse=True)
    ctx.stub.set_delay(summary_s)
    ctx.stub.control(summary_chars=LLM_SUMMARY_CHARS)
    migrate(base)
    agent_url = create_pg_database("offpath_bench_agent")
    lines = TimedLines()
    level = logging.DEBUG if os.environ.get("BENCH_PEAKGRID_DEBUG") else logging.INFO
    lines.setLevel(level)
    mw_log = logging.getLogger("offpath.middleware")
    mw_log.addHandler(lines)
    old_level = mw_log.level
    mw_log.setLevel(level)
    load_before = os.getloadavg()
    workers: list[tuple[subprocess.Popen[bytes], Path]] = []
    shared_client = Client.open(base)
    clients: dict[tuple[int, int, str, bool], Any] = {}
    runs: list[Run] = []
    phases: list[tuple[float, int, float]] = []
    try:
        for threshold, keep, summarizer, late in configs:
            queue = f"{base.celery_queue}-g{threshold // 1000}-{summarizer}"
            queue += "-late" if late else ""
            env = {
                **os.environ,
                "LOG_LEVEL": "INFO",
                "CELERY_QUEUE": queue,
                "SUMMARIZATION_THRESHOLD_CHARS": str(threshold),
                "SUMMARIZATION_KEEP_CHARS": str(keep),
                "WORKER_CONCURRENCY": "16",
                "BENCH_SUMMARY_DELAY_S": str(LATE_SUMMARY_S if late else summary_s),
            }
            if late and summarizer == "llm":  # the stub LLM answers in summary_s: the rest
                env["BENCH_EXTRA_DELAY_S"] = str(max(0.0, LATE_SUMMARY_S - summary_s))
            if summarizer == "offline":
                env.pop("OPENAI_BASE_URL", None)
                env.pop("OPENAI_API_KEY", None)
            log_path = Path(tempfile.gettempdir()) / f"bench-peakgrid-{RUN_ID}-{queue}.log"
            with open(log_path, "ab") as out:
                proc = start_worker(env, f"{queue}@%h", out)
            workers.append((proc, log_path))
            settings = EnvironmentSettings(
                summarization_threshold_chars=threshold,
                summarization_keep_chars=keep,
                celery_queue=queue,
            )
            clients[(threshold, keep, summarizer, late)] = Client(
                settings, shared_client.engine, shared_client.leases
            )
        for proc, log_path in workers:
            wait_for_log(log_path, "ready.", proc, 600)
        # the agents' checkpointers, one database: about a connection per concurrent run
        # (LangGraph writes every step's checkpoint; 4 connections for 54 runs left them
        # seconds behind), offpath's runs on a pool of their own (the baselines write states
        # of up to 16x the threshold at every step: sharing their pool, offpath's run
        # checkpoints lagged 15 s, which the worker waits for, and no deployment shares
        # one process's pool with dozens of uncompacted agents)
        widest = Counter(c.delay for c in grid).most_common(1)[0][0]
        ours = sum(1 for c in grid if c.delay == widest and c.mode == "offpath")
        theirs = sum(1 for c in grid if c.delay == widest) - ours
        with (
            open_checkpoints_url(agent_url, base, pool_size=min(24, theirs)) as checkpoints,
            open_checkpoints_url(agent_url, base, pool_size=min(16, ours)) as offpath_checkpoints,
        ):
            bench = Grid(
                checkpoints.saver,
                offpath_checkpoints.saver,
                agent_url,
                clients,
                summary_s,
                workloads,
            )
            for delay in sorted({c.delay for c in grid}, reverse=True):
                # BENCH_PEAKGRID_APART=1: offpath's runs beside the no-compaction runs they are
                # timed against, then the baselines (whose states, up to 16x the threshold,
                # are serialized at every step in this one process): the no-compaction runs
                # then go at their own pace and offpath's in-run CPU shows in the wall ratio
                groups = [tuple(MODES)]
                if os.environ.get("BENCH_PEAKGRID_APART"):
                    groups = [("none", "offpath"), ("sm-thread", "sm-system")]
                for group in groups:
                    phase = [c for c in grid if c.delay == delay and c.mode in group]
                    if not phase:
                        continue
                    started = time.perf_counter()
                    with ThreadPoolExecutor(len(phase), thread_name_prefix="peakgrid") as pool:
                        runs += list(pool.map(bench.replay, phase))
                    phases.append((delay, len(phase), time.perf_counter() - started))
                    print(
                        f"bench: peakgrid: {len(phase)} runs at {delay:g} s per model call in "
                        f"{phases[-1][2]:.0f} s",
                        flush=True,
                    )
        offpath_runs = [r for r in runs if r.cell.mode == "offpath"]

        def settled() -> bool:
            for r in offpath_runs:
                r.jobs, r.maskings, r.behind, r.reasons = job_counts(
                    shared_client.engine, r.session
                )
            return all(not (r.jobs["queued"] or r.jobs["running"]) for r in offpath_runs)

        try:
            wait(settled, 60, interval=1.0)
        except RuntimeError:
            pass  # reported as they are
    finally:
        load_after = os.getloadavg()
        mw_log.removeHandler(lines)
        mw_log.setLevel(old_level)
        shared_client.close()
        for proc, _ in workers:
            proc.terminate()
        for proc, _ in workers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        drop_pg_database(agent_url)
        ctx.stub.control(summary_chars=0)
        ctx.stub.set_delay(0.0)
    mw_path = Path(tempfile.gettempdir()) / f"bench-peakgrid-{RUN_ID}-middleware.log"
    mw_path.write_text("\n".join(lines.lines))
    print(f"bench: peakgrid: the middleware's log is {mw_path}", flush=True)
    return report(runs, workloads, phases, summary_s, (load_before, load_after), lines.lines)


def fmt_x(value: float) -> str:
    return f"{value:.2f}x"


def peak_counts(threshold: int, prompt: int) -> bool:
    """The peak targets hold for a row: its system prompt is under half the threshold (past
    that the prompt, a summary and the newest turn alone may be over 1.25x; issue 30)."""
    return 2 * prompt < threshold


def row_misses(off: Run, none: Run, threshold: int, hard: int, prompt: int = 0) -> list[str]:
    """The targets ``off`` missed, each as a short phrase (``prompt``: the chars of the
    workload's system prompt)."""
    misses = []
    if not off.finished:
        misses.append(
            f"ended at call {off.calls} of {off.expected}"
            + (f" ({off.error[:80]})" if off.error else "")
        )
    ratio = off.peak / threshold
    if not peak_counts(threshold, prompt):
        pass
    elif ratio > PEAK_BAR:
        misses.append(f"peak {fmt_x(ratio)} > bar {PEAK_BAR:g}x")
    elif ratio > PEAK_TARGET:
        misses.append(f"peak {fmt_x(ratio)} > {PEAK_TARGET:g}x (under the bar)")
    if off.broken_turns:
        misses.append(f"requests kept without their answer: {len(off.broken_turns)}")
    over = sum(c > threshold for c in off.sent)
    if over > OVER_SHARE * max(off.calls, 1):
        misses.append(f"over threshold {over / max(off.calls, 1):.0%}")
    hard_n = sum(c > hard for c in off.sent)
    if hard_n:
        misses.append(f"{hard_n} over hard limit")
    masked = max(off.maskings, off.masked_calls)
    if masked > MASK_SHARE * max(off.calls, 1):
        misses.append(f"maskings {masked / max(off.calls, 1):.0%}")
    if none.seconds and off.seconds / none.seconds > WALL_RATIO:
        misses.append(f"wall x{off.seconds / none.seconds:.3f}")
    return misses


def dump_raw(runs: list[Run]) -> None:
    """Every run's figures as JSON in the temp directory, to look into a row afterwards."""
    import dataclasses
    import json

    path = Path(tempfile.gettempdir()) / f"bench-peakgrid-{RUN_ID}.json"
    rows = [
        {**{f.name: getattr(r, f.name) for f in dataclasses.fields(r)}, "cell": vars(r.cell)}
        for r in runs
    ]
    path.write_text(json.dumps(rows, default=dict))
    print(f"bench: peakgrid: the runs' figures are in {path}", flush=True)


def report(
    runs: list[Run],
    workloads: dict[str, Workload],
    phases: list[tuple[float, int, float]],
    summary_s: float,
    load: tuple[tuple[float, ...], tuple[float, ...]],
    mw_lines: list[str],
) -> Result:
    by = {
        (
            r.cell.workload,
            r.cell.threshold,
            r.cell.delay,
            r.cell.summarizer,
            r.cell.late,
            r.cell.mode,
        ): r
        for r in runs
    }
    nones = {(r.cell.workload, r.cell.delay): r for r in runs if r.cell.mode == "none"}
    kinds = {"sre": 0, "prompt": 1, "transcript": 2}
    rows = sorted(
        {
            (c.workload, c.threshold, c.keep, c.delay, c.summarizer, c.late)
            for c in (r.cell for r in runs)
            if c.mode == "offpath"
        },
        key=lambda k: (kinds[workloads[k[0]].kind], k[0], -k[1], k[3], k[4], k[5]),
    )
    table = [
        "| workload | threshold / keep | prompt / threshold | model s | summarizer | summary s "
        "| no compaction | SM, system in thread | SM, system_prompt= | offpath peak | calls over "
        "threshold | over hard limit | requests kept without their answer | maskings "
        "| wall vs none | wall vs SM (thread / system_prompt=) | targets |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def peak_cell(r: Run, threshold: int, hard: int) -> str:
        over = sum(c > threshold for c in r.sent)
        hard_n = sum(c > hard for c in r.sent)
        text = f"{fmt_x(r.peak / threshold)} ({over})"
        if hard_n:
            text += f", {hard_n} over hard"
        if not r.finished:
            text += f", ended at {r.calls}/{r.expected}"
        return text

    counts: Counter[str] = Counter()
    misses_by_kind: dict[str, list[str]] = {}
    for w, threshold, keep, delay, s, late in rows:
        hard = 3 * threshold
        prompt = workloads[w].prompt
        none = nones[(w, delay)]
        off = by[(w, threshold, delay, s, late, "offpath")]
        smt = by[(w, threshold, delay, s, late, "sm-thread")]
        sms = by[(w, threshold, delay, s, late, "sm-system")]
        misses = row_misses(off, none, threshold, hard, prompt)
        counts["rows"] += 1
        counts["all"] += not misses
        where = f"{w} {threshold // 1000}k {delay:g}s {s}{' late' if late else ''}"
        for m in misses:
            kind = KINDS.get(m.split(" ")[0], "calls over the hard limit")
            misses_by_kind.setdefault(kind, []).append(where)
        over = sum(c > threshold for c in off.sent)
        masked = max(off.maskings, off.masked_calls)
        summary = LATE_SUMMARY_S if late else summary_s
        table.append(
            f"| {w} | {threshold:,} / {keep:,} | {prompt / threshold:.0%} | {delay:g} | {s} "
            f"| {summary:g}{' (late)' if late else ''} | {peak_cell(none, threshold, hard)} "
            f"| {peak_cell(smt, threshold, hard)} | {peak_cell(sms, threshold, hard)} "
            f"| {fmt_x(off.peak / threshold)} | {over} of {off.calls} | "
            f"{sum(c > hard for c in off.sent)} | {len(off.broken_turns)} | {masked} | "
            f"x{off.seconds / none.seconds:.3f} | x{off.seconds / smt.seconds:.3f} / "
            f"x{off.seconds / sms.seconds:.3f} | {'met' if not misses else '; '.join(misses)} |"
        )
        ratio = off.peak / threshold
        counts["turns"] += not off.broken_turns
        counts["peak"] += off.finished and (
            ratio <= PEAK_TARGET or not peak_counts(threshold, prompt)
        )
        counts["bar"] += off.finished and (ratio <= PEAK_BAR or not peak_counts(threshold, prompt))
        counts["over"] += over <= OVER_SHARE * max(off.calls, 1)
        counts["hard"] += not any(c > hard for c in off.sent)
        counts["mask"] += masked <= MASK_SHARE * max(off.calls, 1)
        counts["wall"] += off.seconds <= WALL_RATIO * none.seconds
    n = counts["rows"]
    measured = (
        f"{n} rows, all targets met on {counts['all']}: peak <= {PEAK_TARGET:g}x on "
        f"{counts['peak']} (<= {PEAK_BAR:g}x on {counts['bar']}; rows whose prompt is half the "
        f"threshold or more count as met), calls over the threshold "
        f"<= {OVER_SHARE:.0%} on {counts['over']}, none over the hard limit on {counts['hard']}, "
        f"no request kept without its answer on {counts['turns']}, "
        f"maskings <= {MASK_SHARE:.0%} on {counts['mask']}, wall <= {WALL_RATIO:g}x no "
        f"compaction on {counts['wall']}"
    )

    def overhead(mode: str) -> str:
        per = [
            (r.seconds - r.calls * r.cell.delay) / max(r.calls, 1) * 1000
            for r in runs
            if r.cell.mode == mode and r.finished
        ]
        return f"{LABELS[mode]} {statistics.median(per):.0f} ms" if per else f"{LABELS[mode]} -"

    off_summaries = {
        s: [
            c
            for r in runs
            if r.cell.mode == "offpath" and r.cell.summarizer == s
            for c in r.summary_chars
        ]
        for s in SUMMARIZERS
    }
    reasons: Counter[str] = Counter()
    jobs: Counter[str] = Counter()
    for r in runs:
        jobs.update(r.jobs)
        for code in r.reasons:
            reasons[code] += 1
    sre = [w for w in workloads.values() if w.kind == "sre"]
    transcripts = [w for w in workloads.values() if w.kind == "transcript"]
    from offpath.compaction.accounting import total_chars

    details = [
        (
            f"what ran: the whole grid on {sre[0].name} (thresholds / keep "
            + ", ".join(f"{t:,} / {k:,}" for t, k in THRESHOLDS)
            + f"; model {', '.join(f'{d:g}' for d in DELAYS)} s per call; summarizers offline "
            f"and LLM-shaped); {', '.join(w.name for w in sre[1:])} at {MIDDLE[0][0]:,} / "
            f"{MIDDLE[0][1]:,} and {MIDDLE[1]:g} s per call with both summarizers; every "
            f"transcript over {MIDDLE[0][0]:,} chars at that setting with the LLM-shaped "
            "summarizer (the whole grid on every workload is ~160 runs, too long for this host)"
            if transcripts
            else "what ran (--quick): the first SRE workload at 30,000 / 10,000, 0.1 s per "
            "model call"
        ),
        "rows with a large system prompt (issue 30: it counts once against the threshold): "
        + "; ".join(
            f"{chars:,} chars at {t:,} / {k:,} ({chars / t:.0%} of the threshold)"
            for t, k, chars in PROMPT_ROWS
        )
        + f", given as system_prompt= (SM, system in thread: its first message); each on time "
        f"and late (the summarizer takes {LATE_SUMMARY_S:g} s: turns arrive while it writes); "
        "the peak targets count where the prompt is under half the threshold; 'requests kept "
        "without their answer' counts what tests/shared.py turn_problems finds in any call "
        "(the turn in progress aside) and not in the transcript itself",
        "workloads: "
        + "; ".join(
            f"{w.name} ({total_chars(w.messages):,} chars, {sum(m.type == 'human' for m in w.messages)} "
            f"human turns, largest message {max(len(str(m.content)) for m in w.messages):,} chars)"
            for w in [*sre, *transcripts]
        ),
        f"summaries take {summary_s:g} s everywhere: offpath's offline summarizer is made to sleep "
        f"that long first (bench/slow_offline.py), its LLM summarizer calls the stub LLM over HTTP "
        f"(padded to about {LLM_SUMMARY_CHARS:,} chars); SummarizationMiddleware's model (in the "
        "request path) answers the stub's short summary (offline rows) or the same padded one "
        "(llm rows). Offpath summaries seen in model calls: "
        + ", ".join(
            f"{s} {len(v)}, median {statistics.median(v):,.0f} chars" if v else f"{s} 0"
            for s, v in off_summaries.items()
        ),
        "modes: no compaction (one run per workload and delay, the base of every row), "
        "SummarizationMiddleware (trigger/keep at threshold/keep as chars / 4 tokens, "
        "trim_tokens_to_summarize=None) with the system prompt as the thread's first message and "
        "with it as create_agent(system_prompt=), offpath (system_prompt=) with one real worker "
        "per (threshold, summarizer) on its own queue; hard limit 3x the threshold (the default)",
        "cells: peak / threshold (calls over the threshold); peak counts what one model call is "
        "sent (total_chars, system prompt included); maskings = max(fallback_maskings rows, calls "
        "seen with a masked result)",
        "runs: "
        + ", ".join(f"{n} at {d:g} s per call in {s:.0f} s" for d, n, s in phases)
        + "; all runs of one delay at once, in threads of one process, one PostgreSQL "
        "checkpointer database (offpath's runs on a pool of their own: the baselines write states "
        "of up to 16x the threshold at every step)",
        f"machine load: 1/5/15-min load average {'/'.join(f'{x:.1f}' for x in load[0])} before, "
        f"{'/'.join(f'{x:.1f}' for x in load[1])} after, on {os.cpu_count()} cores shared with "
        "other work (the wall-time ratios carry that noise: every mode of a row ran at the same "
        "time, on the same load)",
        "median time per model call beyond the model's own delay: "
        + ", ".join(overhead(m) for m in MODES),
        f"offpath jobs: {dict(sorted(jobs.items()))}; skip/failure codes (runs): {dict(reasons)}",
        f"middleware log (this process): {len(mw_lines)} lines, "
        f"{sum('applying job' in x for x in mw_lines)} 'applying job', "
        f"{sum(' WARNING ' in x for x in mw_lines)} warnings",
    ]
    diagnosis = []
    for w, threshold, _, delay, sname, late in rows:
        off = by[(w, threshold, delay, sname, late, "offpath")]
        over_calls = [k for k, c in enumerate(off.sent, 1) if c > threshold]
        if (
            len(over_calls) <= OVER_SHARE * max(off.calls, 1)
            and off.peak <= PEAK_TARGET * threshold
        ):
            continue
        crossed = over_calls[0] if over_calls else None
        behind = sorted(off.behind)
        diagnosis.append(
            f"{w} {threshold // 1000}k {delay:g}s {sname}{' late' if late else ''}: over the "
            f"threshold at calls "
            f"{over_calls[:10]}{'...' if len(over_calls) > 10 else ''} of {off.calls} (first "
            f"crossing at call {crossed}, first summary sent at call {off.first_summary_call}); "
            f"jobs {dict(sorted(off.jobs.items()))}"
            + (
                f"; {len(behind)} skipped under_threshold with the worker's read a median "
                f"{behind[len(behind) // 2]:,} chars behind the size the job was queued at"
                if behind
                else ""
            )
        )
    stale = Counter(
        r.reasons["stale"].split(":", 1)[-1].strip()[:70]
        for r in runs
        if r.cell.mode == "offpath" and "stale" in r.reasons
    )
    if stale:
        details.append(
            "first stale reason of each offpath run that had one (runs): "
            + "; ".join(f"{why!r} {n}" for why, n in stale.most_common())
        )
    from offpath.worker.jobs import CHECKPOINT_LAG_S

    behind_all = sorted(b for r in runs if r.cell.mode == "offpath" for b in r.behind)
    details.append(
        f"offpath jobs skipped under_threshold: {len(behind_all)}"
        + (
            f"; the worker read the agent's checkpoint a median {behind_all[len(behind_all) // 2]:,} "
            f"chars (max {behind_all[-1]:,}) behind the size the middleware queued the job at "
            "(LangGraph writes a run's checkpoints in the background; the worker waits up to "
            f"{CHECKPOINT_LAG_S:g} s for them, CHECKPOINT_LAG_S)"
            if behind_all
            else ""
        )
    )
    if diagnosis:
        details.append("rows over the threshold too often or too far: " + " | ".join(diagnosis))
    dump_raw(runs)
    limits = "; ".join(
        f"{kind} missed on {len(where)} rows ({', '.join(where[:6])}{'...' if len(where) > 6 else ''})"
        for kind, where in sorted(misses_by_kind.items())
    )
    return Result(
        TITLE,
        f"every row: offpath's peak <= {PEAK_TARGET:g}x the threshold (bar {PEAK_BAR:g}x), calls "
        f"over the threshold <= {OVER_SHARE:.0%}, 0 over the hard limit, maskings <= "
        f"{MASK_SHARE:.0%} of calls, wall <= {WALL_RATIO:g}x no compaction",
        measured,
        counts["all"] == n and n > 0,
        details,
        limits[:3000],
        table=table,
    )
