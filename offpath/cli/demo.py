"""``offpath demo``: the whole loop on embedded defaults, in about a minute.

SQLite for checkpoints and usage tables under ``data/demo``; the broker is Redis
at ``REDIS_URL`` when one answers there, otherwise kombu's SQLAlchemy transport
on a SQLite file, with thread locks and job leases in the usage database (no
server to install). It starts a real Celery worker (with the reconciler's beat)
and the API as processes, then runs the example investigation as chat turns of
the API's own agent: a real tool loop over the read-only SRE toolset (the
scripted model when no LLM is configured), compacted during the runs by the
middleware. ``--file`` replays a conversation file through ``/turns`` instead.
It waits for the jobs, prints what changed, ``/stats``, the summary and the web UI's
dashboard URL, and stops every process it started, also on Ctrl-C; with ``--serve``
the worker and the API stay up (the dashboard with them) until Ctrl-C.

It holds the demo's run (:func:`run_demo`, which the ``demo`` command of
:mod:`offpath.cli.demo_command` calls) and its report; the processes it starts are
:mod:`offpath.cli.demo_stack`'s.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from rich.panel import Panel
from rich.table import Table

from offpath.cli.common import (
    CliError,
    console,
    counted,
    print_stats,
    read_conversation,
    replay_file,
    session_name,
)
from offpath.cli.demo_stack import (
    ROOT,
    Processes,
    forget_redis_keys,
    free_port,
    port_free,
    redis_answers,
    wait_healthy,
)
from offpath.compaction.accounting import total_chars
from offpath.compaction.settings import Settings

#: The demo's last lines: where to go from here (README sections), each under 80 columns.
NEXT_STEPS = (
    "next: use it in your own agent (README: Use it in your own agent;\n"
    "      examples/own_agent.py adds OffPathCompaction in one line)\n"
    "      run it for real (README: Running it for real: PostgreSQL, Redis,\n"
    "      offpath migrate, worker, beat, api; or docker compose up)"
)


def run_demo(
    settings: Settings, file: Path | None, timeout: float, serve: bool = False, port: int = 0
) -> int:
    """Run the demo (see the module doc); ``serve``: keep the worker and the API up after the
    report until Ctrl-C or SIGTERM; ``port``: the API's (0: a free one). Returns the exit code
    (0; 130 when interrupted before the report). Raises :class:`CliError` for a port in use
    or a ``file`` it cannot read (before anything starts)."""
    if not 0 <= port <= 65_535:
        raise CliError(f"--port {port}: a port is 1 to 65535 (0: a free one)")
    if port and not port_free(port):
        raise CliError(f"port {port} is in use: choose another with --port (0: a free one)")
    # the file is read before anything starts or the last demo's data goes
    produced = read_conversation(file) if file is not None else []
    data = ROOT / "data" / "demo"
    shutil.rmtree(data, ignore_errors=True)
    (data / "logs").mkdir(parents=True)
    port = port or free_port()
    run_id = uuid.uuid4().hex[:6]
    env = {
        **os.environ,
        "DATA_DIR": str(data),
        "DATABASE_URL": "",
        "CELERY_QUEUE": f"demo-{run_id}",
        "REDIS_KEY_PREFIX": f"demo-{run_id}",
        "WORKER_POOL": "threads",
        "WORKER_CONCURRENCY": "4",
        "LOG_LEVEL": "INFO",
        # the embedded demo answers on 127.0.0.1 only, with no API keys to set up
        "AUTH_DISABLED": "true",
        # the demo's tool loop: the scripted model stands in when no LLM is configured
        "CHAT_MODEL": settings.chat_model if settings.llm_configured else "scripted",
        # the scripted model answers once its thread's compaction job is done, as an LLM
        # slower than the summarizer would: the same steps at every run, whatever the load
        "SCRIPTED_JOB_WAIT_S": "60",
    }
    prepare_at = fixed_prepare_at(settings)
    if prepare_at is not None:
        env["SUMMARIZATION_PREPARE_AT"] = f"{prepare_at:.2f}"
    if redis_answers(settings.redis_url):
        broker = f"Redis at {settings.redis_url}"
        env.update({"LOCK_BACKEND": "redis", "CELERY_BROKER_URL": ""})
    else:
        broker = f"embedded (SQLite file {data / 'broker.db'}; no Redis at {settings.redis_url})"
        env.update(
            {
                "LOCK_BACKEND": "database",
                "CELERY_BROKER_URL": f"sqla+sqlite:///{data / 'broker.db'}",
            }
        )
    summarizer = (
        f"LLM {settings.summarization_model} at {settings.openai_base_url or 'api.openai.com'}"
        if settings.llm_configured
        else "offline (no LLM configured: set OPENAI_API_KEY / OPENAI_BASE_URL to use one)"
    )
    agent = (
        f"LLM {settings.chat_model}"
        if settings.llm_configured
        else "the scripted model (no LLM configured; its answers say \\[scripted model])"
    )
    console.print(
        Panel.fit(
            f"broker      {broker}\nstorage     SQLite under {data}\nsummarizer  {summarizer}\n"
            f"agent       {agent}\n"
            f"threshold   {settings.summarization_threshold_chars:,} chars, keep {settings.summarization_keep_chars:,}"
            + (
                f", prepare from {int(settings.summarization_threshold_chars * prepare_at):,}"
                if prepare_at is not None
                else ""
            ),
            title="offpath demo",
        )
    )
    procs = Processes(env, data / "logs")
    previous = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        procs.start(
            "worker",
            [
                "celery",
                "-A",
                "offpath.worker.celery_app",
                "worker",
                "--loglevel=INFO",
                "--without-mingle",
                "--without-gossip",
                "-B",  # the reconciler's schedule, in the worker (one process fewer)
                f"--schedule={data / 'celerybeat-schedule'}",
                "-n",
                f"demo-{run_id}@%h",
            ],
        )
        procs.start(
            "api", ["uvicorn", "offpath.api.app:app", "--port", str(port), "--log-level", "warning"]
        )
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            wait_healthy(client, procs)
            console.print(f"worker and API are up (API on port {port}; logs in {data / 'logs'})")
            if file is not None:
                session = f"demo-{session_name(file)}"[:128]
                replay_file(client, file, session)
                before = (len(produced), total_chars(produced))
            else:
                session = "demo-incident"
                _investigate(client, session, procs)
            jobs = _wait_jobs(client, session, procs, timeout)
            if any(j["status"] == "prepared" for j in jobs):
                # the demo has no next turn to apply it (a re-prepared compaction, after the
                # check before the swap, can end ready only after the last turn): "compact
                # now" applies a prepared compaction at once, as that turn would have
                done = client.post(f"/sessions/{session}/compact")
                if done.status_code == 202 and done.json().get("status") == "applied":
                    console.print(
                        "applied the compaction the worker prepared after the last turn "
                        "(the next turn would have; `offpath compact` does the same)"
                    )
                    jobs = _wait_jobs(client, session, procs, timeout)
            if file is None:  # the runs' messages as they were produced, archive included
                before = _produced(client, session)
            _report(client, session, before, jobs, data / "logs", settings)
        dashboard = f"http://127.0.0.1:{port}/ui"
        if not serve:
            console.print(
                "the web UI was up while the demo ran; `offpath demo --serve` keeps it up "
                f"until Ctrl-C\ndashboard: {dashboard}\n{NEXT_STEPS}"
            )
            return 0
        console.print(
            f"dashboard: {dashboard}  (session: {dashboard}/sessions/{session})\n{NEXT_STEPS}\n"
            "the worker and the API stay up; press Ctrl-C to stop them"
        )
        try:
            while True:
                procs.check()
                time.sleep(1)
        except KeyboardInterrupt:
            console.print("stopping the worker and the API")
            return 0
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; stopping the worker and the API[/yellow]")
        return 130
    finally:
        procs.stop()
        signal.signal(signal.SIGTERM, previous)
        if env["LOCK_BACKEND"] == "redis":
            forget_redis_keys(settings.redis_url, f"demo-{run_id}")


def fixed_prepare_at(settings: Settings) -> float | None:
    """The ``SUMMARIZATION_PREPARE_AT`` the demo runs with, or None to keep the configured one:
    at most the share of the threshold from which a compaction is worth it
    (:func:`offpath.compaction.planner.earliest_worth`), so that the middleware's prepare point,
    which moves between the two with the run's growth rate per second, is that one figure
    at every run (0.6 at the defaults: 36,000 of 60,000 chars)."""
    from offpath.compaction.planner import earliest_worth

    threshold = settings.summarization_threshold_chars
    if not threshold:
        return None
    share = math.floor(earliest_worth(settings) / threshold * 100) / 100
    if share <= 0 or share >= settings.summarization_prepare_at:
        return None
    return share


def _investigate(client: httpx.Client, session: str, procs: Processes) -> None:
    """Ask the agent the demo's requests, one chat turn each, waiting after each until the
    session's jobs are done (:func:`_settle`)."""
    from offpath.agent.scripted import DEMO_REQUESTS

    for i, request in enumerate(DEMO_REQUESTS, 1):
        procs.check()
        try:
            r = client.post(f"/sessions/{session}/messages", json={"content": request}, timeout=300)
        except httpx.HTTPError as exc:
            raise CliError(f"the chat turn failed: {exc}") from None
        if r.status_code != 200:
            raise CliError(f"the chat turn failed ({r.status_code}): {r.text[:300]}")
        body = r.json()
        run = body["run"]
        note = "  [green](compacted during the run)[/green]" if run["compacted"] else ""
        console.print(
            f"{i}. {request[:58]}{'...' if len(request) > 58 else ''}\n"
            f"   {counted(run['tool_calls'], 'tool call')}, +{run['chars']:,} chars; "
            f"the thread is {body['chars']:,} chars{note}"
        )
        _settle(client, session, procs)
        now = client.get(f"/sessions/{session}/messages").json()["chars"]
        if now != body["chars"]:  # the job the run's end queued, written between the turns
            console.print(f"   then the worker compacted it between the turns: {now:,} chars")


def _produced(client: httpx.Client, session: str) -> tuple[int, int]:
    """How many messages the runs produced and their chars as produced: for each message, its
    first archived copy (the original of a result shortened, or of a message a compaction
    removed; a later copy can be a shortened one), else the message as the thread has it
    now. Summaries are offpath's, not the runs'."""
    from offpath.compaction.formats import to_messages
    from offpath.compaction.summary import SUMMARY_PREFIX

    keep = ("type", "content", "tool_calls", "tool_call_id", "name")
    by_id: dict[str, dict[str, Any]] = {}
    cursor: str | None = None
    while True:
        params: dict[str, str | int] = {"limit": 500, **({"cursor": cursor} if cursor else {})}
        page = client.get(f"/sessions/{session}/archive", params=params).json()
        for row in page["messages"]:
            text = row["content"] if isinstance(row["content"], str) else ""
            if not text.startswith(SUMMARY_PREFIX):
                copy = {"id": row["message_id"]} | {k: row[k] for k in keep if row.get(k)}
                by_id.setdefault(row["message_id"], copy)
        cursor = page["next_cursor"]
        if not cursor:
            break
    for m in client.get(f"/sessions/{session}/messages").json()["messages"]:
        if m.get("additional_kwargs", {}).get("lc_source") != "summarization":
            by_id.setdefault(m["id"], m)
    messages = to_messages(list(by_id.values()))
    return len(messages), total_chars(messages)


def _settle(client: httpx.Client, session: str, procs: Processes, timeout: float = 60) -> None:
    """Wait, as a user reading the answer would, until no job of the session is queued or
    running (the job the run's end queued, if any, is written between the turns, not
    during the next one, whatever the machine's load). The run's end queues it in the
    background: a job list that stays the same for 1.5 s is taken as final."""
    deadline = time.monotonic() + timeout
    seen: list[tuple[str, str]] | None = None
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        procs.check()
        jobs = client.get(f"/sessions/{session}/compactions").json()["jobs"]
        now = [(j["job_id"], j["status"]) for j in jobs]
        if now != seen:
            seen, stable_since = now, time.monotonic()
        busy = any(status in ("queued", "running") for _, status in now)
        if not busy and time.monotonic() - stable_since >= 1.5:
            return
        time.sleep(0.1)


def _wait_jobs(
    client: httpx.Client, session: str, procs: Processes, timeout: float
) -> list[dict[str, Any]]:
    """Wait until the session's jobs are all finished (and the last turn's hook has run)."""
    time.sleep(0.5)
    deadline = time.monotonic() + timeout
    with console.status("waiting for the compaction jobs..."):
        while time.monotonic() < deadline:
            procs.check()
            jobs = client.get(f"/sessions/{session}/compactions").json()["jobs"]
            if all(j["status"] in ("applied", "skipped", "failed", "prepared") for j in jobs):
                return jobs
            time.sleep(0.3)
    raise CliError(
        f"the compaction jobs did not finish within {timeout:.0f} s (see data/demo/logs/worker.log)"
    )


def _report(
    client: httpx.Client,
    session: str,
    before: tuple[int, int],
    jobs: list[dict[str, Any]],
    logs: Path,
    settings: Settings,
) -> None:
    after = client.get(f"/sessions/{session}/messages").json()
    messages = after["messages"]
    summaries = [
        m for m in messages if m.get("additional_kwargs", {}).get("lc_source") == "summarization"
    ]
    table = Table(title=f"session {session}")
    for col in ("", "messages", "chars", "what was summarized"):
        table.add_column(col)
    table.add_row("produced", str(before[0]), f"{before[1]:,}", "")
    done = (
        ", ".join(f"{j['status']}" + (f" ({j['reason']})" if j["reason"] else "") for j in jobs)
        or "no job"
    )
    if summaries:
        meta = summaries[0]["additional_kwargs"]["summary"]
        what = f"{counted(meta['replaced_count'], 'message')}, {meta['replaced_chars']:,} chars -> 1 summary ({meta['summarizer']})"
    else:
        what = "nothing (under the threshold)"
    table.add_row("the thread now", str(len(messages)), f"{after['chars']:,}", what)
    table.add_row("jobs", str(len(jobs)), "", done)
    console.print(table)
    print_stats(client.get("/stats").json())
    if summaries:
        console.print(
            Panel(summaries[0]["content"], title="the summary now at the top of the session")
        )
    lines = []
    for name, marker in (("worker.log", "summarizer"), ("api.log", "applying job")):
        found = [
            line
            for line in (logs / name).read_text(errors="replace").splitlines()
            if marker in line and "] " in line
        ]
        lines += found[-3:]
    if lines:
        console.print(
            "worker and API logs (last lines):\n" + "\n".join(lines), highlight=False, markup=False
        )
    console.print(saved_line(before, (len(messages), after["chars"]), jobs, settings))


def saved_line(
    produced: tuple[int, int],
    now: tuple[int, int],
    jobs: list[dict[str, Any]],
    settings: Settings,
) -> str:
    """The demo's closing figures: what the runs produced against the thread the model reads
    now (``produced``, ``now``: (messages, chars)), the threshold, the compactions applied."""
    threshold = settings.summarization_threshold_chars
    saved = produced[1] - now[1]
    share = f" ({saved / produced[1]:.0%})" if produced[1] else ""
    applied = sum(j["status"] == "applied" for j in jobs)
    where = "under" if now[1] <= threshold else "[red]over[/red]"
    return (
        f"saved: the runs produced {counted(produced[0], 'message')}, {produced[1]:,} chars; "
        f"the model now reads {counted(now[0], 'message')}, {now[1]:,} chars, {where} the "
        f"{threshold:,}-char threshold: {saved:,} chars{share} fewer, "
        f"after {counted(applied, 'compaction')} (the originals are archived; `recall` reads them)"
    )
