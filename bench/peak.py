"""Benchmark 8, peak context in single-request runs (issue 9): each single-request transcript
of ../shared/transcripts over 60,000 chars (the mini-swe-agent runs) replayed as a live run
of LangChain's ``create_agent``, three ways side by side in one run:

* no compaction (no middleware);
* LangChain's ``SummarizationMiddleware`` (in the request path), its summarizer a
  ``ChatOpenAI`` on the stub LLM, triggering at the same threshold as offpath
  (``trigger=("tokens", threshold / 4)``, ``keep=("tokens", keep / 4)`` with a chars / 4
  token counter);
* offpath's ``OffPathCompaction``, with a real worker (``celery -A offpath.worker.celery_app
  worker``) whose summarizer is the same stub LLM.

A scripted model answers with the transcript's AI messages in order, after
:data:`MODEL_DELAY_S`; scripted tools answer with its recorded results
(``tests/agent_replay.py``). Every run of every mode goes at once, each in its own thread,
on one PostgreSQL checkpointer of the agent's own (not offpath's database): the wall time
stays near the longest single run, and the modes meet the same machine load.

Measured per transcript and mode: the largest context a model call is sent (chars,
:func:`offpath.compaction.accounting.total_chars`, system prompt included), the model
calls, the run's wall time; for offpath also the compactions applied during the run (job
rows) and the fallback maskings (``fallback_maskings``, ``/stats``).
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import threading
import time
from collections import Counter
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

NAME = "peak"

MODES = ("none", "langchain", "offpath")
LABELS = {"none": "no compaction", "langchain": "SummarizationMiddleware", "offpath": "offpath"}
#: How long the scripted model takes per call, and the stub LLM per summary (seconds).
MODEL_DELAY_S, STUB_DELAY_S = 1.0, 2.0
QUICK_MODEL_DELAY_S, QUICK_STUB_DELAY_S = 0.1, 0.3
#: Targets (issue 9): offpath's peak <= max(PEAK_FACTOR x threshold, threshold + the largest
#: single step); fallback maskings on <= MASKING_SHARE of model calls; offpath's run wall
#: time <= WALL_RATIO x the run without compaction.
PEAK_FACTOR = 1.5
MASKING_SHARE = 0.05
WALL_RATIO = 1.02
#: How a masked tool result starts (offpath.compaction.tracking.MASK).
MASKED = "[offpath: this tool result"


@dataclass
class Run:
    """One transcript replayed in one mode."""

    transcript: str
    mode: str
    session: str
    calls: int = 0
    expected_calls: int = 0
    sent: list[int] = field(default_factory=list)  # chars of each model call
    seconds: float = 0.0
    summaries: int = 0  # distinct summaries seen in the model calls
    summary_sample: str = ""  # the start of the first one
    first_summary_call: int | None = None  # 1-based
    masked_calls: int = 0  # calls with a masked tool result
    error: str = ""
    jobs: Counter[str] = field(default_factory=Counter)  # offpath: job rows by status
    maskings: int = 0  # offpath: rows of fallback_maskings
    behind: list[int] = field(default_factory=list)  # offpath: see job_counts
    reasons: dict[str, str] = field(default_factory=dict)  # offpath: a reason per code

    @property
    def peak(self) -> int:
        return max(self.sent, default=0)

    @property
    def finished(self) -> bool:
        return not self.error and self.calls == self.expected_calls


def single_request_transcripts() -> list[Path]:
    """The transcripts with one human message and over 60,000 chars of content (the rule of
    ``tests/integration/test_middleware_runs.py``)."""
    from shared import TRANSCRIPTS, load

    out = []
    for path in TRANSCRIPTS:
        messages = load(path)["messages"]
        if (
            sum(m["type"] == "human" for m in messages) == 1
            and sum(len(str(m.get("content", ""))) for m in messages) > 60_000
        ):
            out.append(path)
    return out


def largest_step(messages: list[Any]) -> int:
    """The most chars added between two consecutive model calls of the transcript's run: one
    AI message and the tool results that answer it."""
    from langchain_core.messages import AIMessage

    from offpath.compaction.accounting import message_chars

    steps, current = [], None
    for m in messages:
        if isinstance(m, AIMessage):
            if current is not None:
                steps.append(current)
            current = message_chars(m)
        elif current is not None and m.type == "tool":
            current += message_chars(m)
    if current is not None:
        steps.append(current)
    return max(steps, default=0)


def chars_per_token(messages: Any) -> int:
    """The token counter given to SummarizationMiddleware: offpath's chars / 4."""
    from offpath.compaction.accounting import total_chars

    return total_chars(list(messages)) // 4


class Bench:
    """What the runs share: settings, the agent's checkpointer, offpath's client, the
    summarizer model of SummarizationMiddleware, the delays."""

    def __init__(self, ctx: Context, saver: Any, agent_url: str, client: Any) -> None:
        from langchain_openai import ChatOpenAI

        from offpath.config import get_settings

        self.settings = get_settings()
        self.saver = saver
        self.agent_url = agent_url
        self.client = client
        self.model_delay_s = QUICK_MODEL_DELAY_S if ctx.quick else MODEL_DELAY_S
        self.summarizer = ChatOpenAI(
            model=self.settings.summarization_model,
            base_url=ctx.stub.base_url,
            api_key="bench",  # type: ignore[arg-type]
            timeout=60,
            max_retries=0,
        )

    def middleware(self, mode: str) -> list[Any]:
        from langchain.agents.middleware import SummarizationMiddleware

        from offpath import OffPathCompaction

        s = self.settings
        if mode == "none":
            return []
        if mode == "langchain":
            return [
                SummarizationMiddleware(
                    self.summarizer,
                    trigger=("tokens", s.summarization_threshold_chars // 4),
                    keep=("tokens", s.summarization_keep_chars // 4),
                    token_counter=chars_per_token,
                    # its default (4,000 tokens, cut to start at a human message) leaves
                    # nothing of a single-request run: it would write "Previous conversation
                    # was too long to summarize." without calling its model
                    trim_tokens_to_summarize=None,
                )
            ]
        return [OffPathCompaction(s, checkpointer_url=self.agent_url, client=self.client)]

    def replay(self, path: Path, mode: str) -> Run:
        """Run the transcript at ``path`` live in ``mode``; what each model call was sent."""
        from agent_replay import TranscriptModel, replay_script
        from langchain.agents import create_agent
        from langchain_core.messages import ToolMessage
        from shared import load, marked_summary, messages_of

        from offpath.compaction.accounting import total_chars

        # each run its own message objects: the runs go at once
        script = replay_script(messages_of(load(path)), f"{path.stem}-end")
        run = Run(path.stem, mode, f"peak-{mode}-{path.stem[:24]}-{RUN_ID}")
        run.expected_calls = len(script.replies)
        model = TranscriptModel(replies=script.replies, delay_s=self.model_delay_s)
        agent = create_agent(
            model,
            script.tools,
            system_prompt=script.system,
            middleware=self.middleware(mode),
            checkpointer=self.saver,
        )
        config = {"configurable": {"thread_id": run.session}, "recursion_limit": 10_000}
        started = time.perf_counter()
        try:
            agent.invoke({"messages": [script.request]}, config)
        except Exception as exc:  # reported, the other runs go on
            run.error = f"{type(exc).__name__}: {exc}"[:300]
        run.seconds = time.perf_counter() - started
        run.calls = len(model.calls)
        run.sent = [total_chars(c) for c in model.calls]
        seen: set[tuple[str, int, int]] = set()
        for k, sent in enumerate(model.calls, 1):
            for m in sent:
                if marked_summary(m):
                    meta = m.additional_kwargs.get("summary")  # offpath's: job id, count
                    seen.add((str(m.id), hash(str(m.content)), hash(str(meta))))
                    if run.first_summary_call is None:
                        run.first_summary_call = k
                        run.summary_sample = " ".join(str(m.content).split())[:100]
            if any(isinstance(m, ToolMessage) and str(m.content).startswith(MASKED) for m in sent):
                run.masked_calls += 1
        run.summaries = len(seen)
        return run


def job_counts(engine: Any, session: str) -> tuple[Counter[str], int, list[int], dict[str, str]]:
    """The thread's job rows by status (and skip reason), its rows of ``fallback_maskings``,
    and for each job skipped ``under_threshold``: the size the middleware queued it at minus
    the size the worker read (the worker reads the agent's last saved checkpoint); and the
    first reason given for each skip or failure code."""
    import re

    import sqlalchemy as sa

    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT status, reason_code, reason, chars_before FROM compaction_jobs "
                "WHERE session_id = :s ORDER BY created_at"
            ),
            {"s": session},
        ).all()
        maskings = conn.execute(
            sa.text("SELECT count(*) FROM fallback_maskings WHERE session_id = :s"),
            {"s": session},
        ).scalar()
    jobs: Counter[str] = Counter()
    behind = []
    reasons: dict[str, str] = {}
    for status, code, reason, chars_before in rows:
        jobs[f"{status} ({code})" if status == "skipped" and code else str(status)] += 1
        if code and reason:
            reasons.setdefault(str(code), str(reason)[:240])
        seen = re.match(r"under_threshold: (\d+) chars", reason or "")
        if seen and chars_before is not None:
            behind.append(int(chars_before) - int(seen.group(1)))
    return jobs, int(maskings or 0), behind, reasons


def stub_requests(ctx: Context) -> Counter[str]:
    """The summarization requests the stub LLM answered in this benchmark, by who sent them
    (offpath's worker prompts with a system message opening "You compact")."""
    counts: Counter[str] = Counter()
    try:
        requests = ctx.stub.requests()
    except Exception:  # a figure of the report, not the benchmark
        return counts
    for req in requests:
        first = (req.get("messages") or [{}])[0]
        text = str(first.get("content", ""))
        counts["offpath worker" if text.startswith("You compact") else "other"] += 1
    return counts


class LogLines(logging.Handler):
    """Keeps the middleware's log lines (this process), to count and quote them."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._guard:
            self.lines.append(f"{record.levelname} {record.getMessage()}")


def run(ctx: Context) -> Result:
    from shared import load, messages_of

    from offpath.config import get_settings
    from offpath.coordination.runtime import Client
    from offpath.stores.checkpoints import open_checkpoints_url
    from offpath.stores.db.engine import migrate
    from offpath.stores.usage.stats_body import stats

    settings = get_settings()
    threshold = settings.summarization_threshold_chars
    paths = single_request_transcripts()
    steps = {p.stem: largest_step(messages_of(load(p))) for p in paths}
    stub_delay = QUICK_STUB_DELAY_S if ctx.quick else STUB_DELAY_S
    ctx.stub.set_delay(stub_delay)
    migrate(settings)  # the middleware writes job rows before the worker's first job
    agent_url = create_pg_database("offpath_bench_agent")
    log_path = Path(tempfile.gettempdir()) / f"bench-peak-worker-{RUN_ID}.log"
    env = {**os.environ, "LOG_LEVEL": "INFO"}
    lines = LogLines()
    mw_log = logging.getLogger("offpath.middleware")
    mw_log.addHandler(lines)
    old_level = mw_log.level
    mw_log.setLevel(logging.INFO)
    with open(log_path, "ab") as out:
        worker = start_worker(env, f"bench-peak-{RUN_ID}@%h", out, loglevel="info")
    client = Client.open(settings)
    runs: list[Run] = []
    try:
        wait_for_log(log_path, "ready.", worker, 60)
        with open_checkpoints_url(agent_url, settings) as checkpoints:
            bench = Bench(ctx, checkpoints.saver, agent_url, client)
            started = time.perf_counter()
            with ThreadPoolExecutor(len(paths) * len(MODES), thread_name_prefix="peak") as pool:
                futures = [pool.submit(bench.replay, p, mode) for p in paths for mode in MODES]
                runs = [f.result() for f in futures]
            wall = time.perf_counter() - started
        offpath_runs = [r for r in runs if r.mode == "offpath"]

        def settled() -> bool:
            for r in offpath_runs:
                r.jobs, r.maskings, r.behind, r.reasons = job_counts(client.engine, r.session)
            return all(not (r.jobs["queued"] or r.jobs["running"]) for r in offpath_runs)

        try:
            wait(settled, 60, interval=0.5)
        except RuntimeError:
            pass  # reported as they are
        totals = stats(client.engine)["summary"]
        totals["stub_requests"] = stub_requests(ctx)
    finally:
        mw_log.removeHandler(lines)
        mw_log.setLevel(old_level)
        client.close()
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=10)
        drop_pg_database(agent_url)
        ctx.stub.set_delay(0.0)
    return report(runs, steps, threshold, wall, settings, totals, lines.lines, log_path, ctx)


def report(
    runs: list[Run],
    steps: dict[str, int],
    threshold: int,
    wall: float,
    settings: Any,
    totals: dict[str, Any],
    mw_lines: list[str],
    log_path: Path,
    ctx: Context,
) -> Result:
    print(f"bench: peak: the worker's log is {log_path}", flush=True)
    by = {(r.transcript, r.mode): r for r in runs}
    names = sorted({r.transcript for r in runs}, key=lambda n: steps[n])
    model_delay = QUICK_MODEL_DELAY_S if ctx.quick else MODEL_DELAY_S
    stub_delay = QUICK_STUB_DELAY_S if ctx.quick else STUB_DELAY_S
    table = [
        "| transcript | mode | peak chars | model calls | wall s | compactions seen | "
        "offpath jobs | fallback maskings |",
        "|---|---|---|---|---|---|---|---|",
    ]
    peak_ok, mask_ok, wall_ok = True, True, True
    measured, misses = [], []
    for name in names:
        bound = max(int(PEAK_FACTOR * threshold), threshold + steps[name])
        for mode in MODES:
            r = by[(name, mode)]
            jobs = (
                ", ".join(f"{s} {n}" for s, n in sorted(r.jobs.items()))
                if mode == "offpath"
                else ""
            )
            masks = f"{r.maskings} ({r.masked_calls} calls seen)" if mode == "offpath" else ""
            calls = f"{r.calls}" + ("" if r.finished else f" of {r.expected_calls}")
            table.append(
                f"| {name} | {LABELS[mode]} | {r.peak:,} | {calls} | {r.seconds:.1f} | "
                f"{r.summaries} | {jobs} | {masks} |" + (f" error: {r.error}" if r.error else "")
            )
        off, none, lc = by[(name, "offpath")], by[(name, "none")], by[(name, "langchain")]
        ratio = off.seconds / none.seconds if none.seconds else float("inf")
        ratio_lc = off.seconds / lc.seconds if lc.seconds else float("inf")
        share = max(off.maskings, off.masked_calls) / max(off.calls, 1)
        ok_peak = off.finished and off.peak <= bound
        ok_mask = share <= MASKING_SHARE
        ok_wall = ratio <= WALL_RATIO and off.finished and none.finished
        peak_ok &= ok_peak
        mask_ok &= ok_mask
        wall_ok &= ok_wall
        measured.append(
            f"{name.removeprefix('miniswe-')}: peak {off.peak:,} (bound {bound:,}), "
            f"maskings {share:.0%}, wall x{ratio:.3f} (x{ratio_lc:.3f} of SummarizationMiddleware)"
        )
        if not ok_peak:
            over = [k for k, c in enumerate(off.sent, 1) if c > bound]
            crossed = next((k for k, c in enumerate(off.sent, 1) if c > threshold), None)
            misses.append(
                f"{name}: peak {off.peak:,} > bound {bound:,} at calls {over[:8]}"
                f"{'...' if len(over) > 8 else ''}; the thread crossed the threshold at call "
                f"{crossed}, the first summary reached a model call at call "
                f"{off.first_summary_call}; jobs {dict(off.jobs)}"
                + (
                    f"; {len(off.behind)} jobs skipped under_threshold, the worker reading the "
                    f"thread a median {sorted(off.behind)[len(off.behind) // 2]:,} chars behind "
                    "the run"
                    if off.behind
                    else ""
                )
            )
        if not ok_mask:
            misses.append(
                f"{name}: {max(off.maskings, off.masked_calls)} of {off.calls} model calls masked "
                f"({off.maskings} rows in fallback_maskings, {off.masked_calls} calls seen masked)"
            )
        if not ok_wall:
            per_call = {
                m: (by[(name, m)].seconds - by[(name, m)].calls * model_delay)
                / max(by[(name, m)].calls, 1)
                * 1000
                for m in MODES
            }
            misses.append(
                f"{name}: offpath {off.seconds:.1f} s vs {none.seconds:.1f} s without compaction "
                f"(x{ratio:.3f}); time per model call beyond the model's own "
                + ", ".join(f"{LABELS[m]} {v:.0f} ms" for m, v in per_call.items())
            )
    details = [
        f"transcripts: the single-request ones over 60,000 chars ({', '.join(names)}); "
        f"threshold {threshold:,} chars, keep {settings.summarization_keep_chars:,}, prepare at "
        f"{settings.summarization_prepare_at:g} x threshold, hard limit "
        f"{settings.hard_limit_chars:,}; largest single step "
        + ", ".join(f"{n} {steps[n]:,}" for n in names),
        f"scripted model answers each call after {model_delay:g} s; the stub LLM (over HTTP, "
        f"its own process) answers summaries after {stub_delay:g} s, for offpath's worker and "
        "for SummarizationMiddleware's ChatOpenAI alike; all "
        f"{len(runs)} runs at once in threads of one process, one PostgreSQL checkpointer; "
        f"whole run {wall:.0f} s",
        "peak chars = the largest total_chars of what one model call is sent, system prompt "
        "included; compactions seen = distinct summary messages in the model calls",
        "offpath ratios (wall time): "
        + ", ".join(
            f"{n} x{by[(n, 'offpath')].seconds / by[(n, 'none')].seconds:.3f} of no compaction, "
            f"x{by[(n, 'offpath')].seconds / by[(n, 'langchain')].seconds:.3f} of "
            "SummarizationMiddleware"
            for n in names
            if by[(n, "none")].seconds and by[(n, "langchain")].seconds
        ),
        "offpath jobs skipped as under_threshold (the worker reads the agent's last saved "
        "checkpoint; the size it read vs the size the middleware queued the job at): "
        + ", ".join(
            f"{n} {len(b)}"
            + (f", behind by median {sorted(b)[len(b) // 2]:,} / max {max(b):,} chars" if b else "")
            for n in names
            for b in [by[(n, "offpath")].behind]
        ),
        "offpath skip reasons (the first of each): "
        + "; ".join(
            f"{n} {code}: {reason!r}"
            for n in names
            for code, reason in by[(n, "offpath")].reasons.items()
        ),
        f"summarizer calls answered by the stub LLM: {dict(totals.get('stub_requests') or {})} "
        "(other = SummarizationMiddleware's, in the request path); first summary seen: "
        + "; ".join(
            f"{LABELS[m]}: "
            + repr(
                next((by[(n, m)].summary_sample for n in names if by[(n, m)].summary_sample), "")
            )
            for m in ("langchain", "offpath")
        ),
        f"/stats after the run (the whole bench database, other benchmarks' jobs included): "
        f"total_summarizations {totals.get('total_summarizations')}, "
        f"fallback_maskings {totals.get('fallback_maskings')}, jobs {totals.get('jobs')}",
        f"middleware log (this process): {len(mw_lines)} lines, "
        f"{sum('applying job' in x for x in mw_lines)} 'applying job', "
        f"{sum(x.startswith('WARNING') for x in mw_lines)} warnings"
        + (
            "; first warning: " + next(x for x in mw_lines if x.startswith("WARNING"))[:300]
            if any(x.startswith("WARNING") for x in mw_lines)
            else ""
        ),
    ]
    return Result(
        "8. Peak context in single-request runs",
        f"offpath's peak <= max({PEAK_FACTOR:g} x threshold, threshold + largest step); "
        f"fallback maskings <= {MASKING_SHARE:.0%} of model calls; wall time <= "
        f"{WALL_RATIO:g}x no compaction",
        "; ".join(measured),
        peak_ok and mask_ok and wall_ok,
        details,
        "" if not misses else "; ".join(misses)[:3000],
        table=table,
    )
