"""The ``offpath`` command: demo, replay, stats, and starting the API, a worker or Flower.

Errors are one line on stderr and a non-zero exit: 1 for bad input or a failed
request, 2 for bad settings.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from langchain_core.messages import messages_to_dict
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.padding import Padding
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from offpath.compaction.formats import (
    ConversationFormatError,
    extract_messages,
    split_turns,
    to_messages,
)
from offpath.compaction.settings import (
    ClientSettings,
    Settings,
    SettingsError,
    load_client_settings,
    load_settings,
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode="markdown",
    help="Conversation compaction off the request path.",
)
console = Console()
err = Console(stderr=True, soft_wrap=True)

FORMATS = ("auto", "transcript", "openai", "langchain")
#: ``celery`` on the project's app, in this interpreter.
CELERY = [sys.executable, "-m", "celery", "-A", "offpath.worker.celery_app"]


class CliError(Exception):
    """A user-facing error: printed as one line, exit 1."""


def settings_or_exit() -> Settings:
    """All settings, validated together (a command that starts part of the service); exit 2
    with one line naming each bad setting."""
    try:
        return load_settings()
    except SettingsError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def client_settings_or_exit() -> ClientSettings:
    """Only what a client of the API reads (``API_URL``, ``OFFPATH_API_KEY``): a bad setting
    of the service that the client does not use cannot stop it (issue 21, item 12); exit 2
    with one line naming a bad one of its own."""
    try:
        return load_client_settings()
    except SettingsError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 message``, ``2 messages``, ``1,024 chars``: ``n`` with the noun it agrees with
    (``plural``: for a noun that does not take an s)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def fail(message: str, code: int = 1) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


# --- reading conversation files ---------------------------------------------------------------


def detect_format(items: list[dict[str, Any]]) -> str:
    """``openai`` (role keys), ``langchain`` (serialized ``type``+``data``) or ``transcript``."""
    if all("role" in m for m in items):
        return "openai"
    if all("type" in m and isinstance(m.get("data"), dict) for m in items):
        return "langchain"
    if all("type" in m for m in items):
        return "transcript"
    raise ConversationFormatError("messages mix formats or have neither 'role' nor 'type'")


def read_conversation(path: Path, fmt: str = "auto") -> list[Any]:
    """The messages of a conversation file, as LangChain messages; CliError if unreadable."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CliError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{path}: cannot read it ({exc})") from None
    except json.JSONDecodeError as exc:
        raise CliError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    try:
        items = extract_messages(doc)
        if not items:
            raise ConversationFormatError("it has no messages")
        found = detect_format(items)
        if fmt != "auto" and fmt != found:
            raise ConversationFormatError(f"expected {fmt} format, found {found}")
        return to_messages(items)
    except ConversationFormatError as exc:
        raise CliError(f"{path}: {exc}") from None


def session_name(path: Path) -> str:
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in path.stem)
    return cleaned[:128] or "session"


def replay_file(
    client: httpx.Client, path: Path, session: str, fmt: str = "auto"
) -> dict[str, Any]:
    """Post ``path`` to the API turn by turn with a progress bar; returns the last answer."""
    turns = split_turns(read_conversation(path, fmt))
    last: dict[str, Any] = {}
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task(session[:40], total=len(turns))
        for turn in turns:
            try:
                r = client.post(
                    # langchain_core's own serialization: a lossless round trip (tool-call
                    # errors, metadata, a tool message's status and artifact included)
                    f"/sessions/{session}/turns",
                    json={"messages": messages_to_dict(turn)},
                )
            except httpx.HTTPError as exc:
                raise CliError(
                    f"cannot reach the API at {client.base_url} ({exc}); start it with `offpath api`"
                ) from None
            if r.status_code == 401:
                check_answer(r, f"{path}")
            if r.status_code != 200:
                hint = ""
                if "already used in this session" in _detail(r):
                    hint = " (the session has these messages already: replay into a new one with --session NAME)"
                raise CliError(
                    f"{path}: the API refused a turn ({r.status_code}): {_detail(r)}{hint}"
                )
            last = r.json()
            progress.advance(task)
    return last


def _detail(r: httpx.Response) -> str:
    try:
        detail = r.json().get("detail")
    except ValueError:
        return r.text[:200]
    if isinstance(detail, list):
        return "; ".join(f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" for d in detail)[
            :300
        ]
    return str(detail)[:300]


# --- commands -----------------------------------------------------------------------------------


ApiKeyOption = Annotated[
    str | None,
    typer.Option("--api-key", help="API key (default: OFFPATH_API_KEY)", show_default=False),
]
UrlOption = Annotated[str | None, typer.Option(help="API URL (default: API_URL)")]


def api_client(
    settings: ClientSettings | Settings, url: str | None, api_key: str | None, timeout: float = 60
):
    """An HTTP client for the API at ``url`` (``API_URL``), sending the API key."""
    key = api_key or (
        settings.offpath_api_key.get_secret_value() if settings.offpath_api_key else ""
    )
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=url or settings.api_url, timeout=timeout, headers=headers)


def check_answer(r: httpx.Response, what: str) -> None:
    """One line and exit 1 for an answer that is not 2xx (401 says how to get a key)."""
    if r.status_code == 401:
        fail(
            f"{what}: the API refused the key ({_detail(r)}); pass --api-key or set "
            "OFFPATH_API_KEY (create one with `offpath keys create --tenant NAME`)"
        )
    if r.status_code >= 400:
        fail(f"{what}: the API answered {r.status_code}: {_detail(r)}")


@app.command()
def replay(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="Conversation files (transcript, OpenAI or LangChain JSON)", metavar="FILE..."
        ),
    ],
    url: UrlOption = None,
    session: Annotated[str | None, typer.Option(help="Session id (default: the file name)")] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="auto, transcript, openai or langchain")
    ] = "auto",
    api_key: ApiKeyOption = None,
) -> None:
    """Replay conversation files against a running API, turn by turn."""
    if fmt not in FORMATS:
        fail(f"--format must be one of {', '.join(FORMATS)}")
    settings = client_settings_or_exit()
    try:
        for path in files:  # read them all first: a bad file fails before anything is posted
            read_conversation(path, fmt)
        with api_client(settings, url, api_key) as client:
            for path in files:
                sid = session or session_name(path)
                result = replay_file(client, path, sid, fmt)
                console.print(
                    f"{sid}: {counted(result.get('messages', 0), 'message')}, "
                    f"{counted(result.get('chars', 0), 'char')}",
                    highlight=False,
                )
    except CliError as exc:
        fail(str(exc))


@app.command()
def stats(url: UrlOption = None, api_key: ApiKeyOption = None) -> None:
    """Print /stats of a running API."""
    settings = client_settings_or_exit()
    try:
        with api_client(settings, url, api_key, timeout=10) as client:
            r = client.get("/stats")
    except httpx.HTTPError as exc:
        fail(f"cannot read /stats from {url or settings.api_url}: {exc}")
    check_answer(r, "cannot read /stats")
    print_stats(r.json())


def print_stats(body: dict[str, Any]) -> None:
    s = body["summary"]
    table = Table(title="/stats", show_header=False)
    for key in (
        "total_summarizations",
        "total_chars_compacted",
        "sessions_compacted",
        "approx_tokens_saved",
    ):
        table.add_row(key, f"{s[key]:,}")
    table.add_row("jobs", ", ".join(f"{k} {v}" for k, v in s["jobs"].items()))
    table.add_row("fallback_maskings", f"{s.get('fallback_maskings', 0):,}")
    for key in ("lag_ms", "summarizer_latency_ms"):
        if spread := s.get(key):
            table.add_row(
                key, f"p50 {_ms(spread['p50'])}, p99 {_ms(spread['p99'])} (n={spread['count']})"
            )
    if tokens := s.get("llm_tokens"):
        table.add_row(
            "llm_tokens",
            f"input {tokens['input']:,}, output {tokens['output']:,} "
            f"({counted(tokens['events'], 'compaction')} reported them)",
        )
    console.print(table)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


# --- session admin (issue 12): sessions, show, compact --------------------------------------------


def call_api(
    url: str | None,
    api_key: str | None,
    method: str,
    path: str,
    what: str,
    **kwargs: Any,
) -> httpx.Response:
    """One request to the API (``API_URL``, ``OFFPATH_API_KEY``); one line and exit 1 when the
    API cannot be reached or answers an error (exit 2 for bad settings)."""
    settings = client_settings_or_exit()
    try:
        with api_client(settings, url, api_key, timeout=30) as client:
            r = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        fail(f"{what}: cannot reach the API at {url or settings.api_url} ({exc})")
    check_answer(r, what)
    return r


@app.command()
def sessions(
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    search: Annotated[
        str, typer.Option("--search", "-q", help="Only session ids containing this")
    ] = "",
    sort: Annotated[
        str,
        typer.Option(
            help="last_activity, chars, compactions or session_id; a leading - sorts descending"
        ),
    ] = "-last_activity",
    limit: Annotated[int, typer.Option(help="Sessions per page (1-200)")] = 50,
    cursor: Annotated[
        str | None, typer.Option(help="Start at this page (the cursor a previous list printed)")
    ] = None,
) -> None:
    """List sessions (GET /sessions): size, compactions, last activity, jobs in flight."""
    params: dict[str, Any] = {"sort": sort, "limit": limit, "q": search}
    if cursor:
        params["cursor"] = cursor
    body = call_api(url, api_key, "GET", "/sessions", "cannot list sessions", params=params).json()
    if not body["sessions"]:
        console.print(
            "no sessions" + (f" whose id contains {search!r}" if search else ""),
            highlight=False,
        )
        if not search and not cursor:
            console.print(NO_SESSIONS_HINT, highlight=False, markup=False)
        return
    print_sessions(body["sessions"])
    if body["next_cursor"]:
        console.print(
            f"more: offpath sessions --sort {sort} --cursor {body['next_cursor']}",
            highlight=False,
            soft_wrap=True,
        )


#: What ``offpath sessions`` says under an empty list (issue 21, item 1).
NO_SESSIONS_HINT = (
    "A session is listed once a turn is posted to the API (POST /sessions/{id}/messages or "
    "/turns; `offpath replay`), or once a team's own agent with OffPathCompaction has run a "
    "thread (listed for the tenant OWN_AGENT_TENANT names, 'default' unless set). A tenant's "
    "key lists that tenant's sessions only; an admin key lists every tenant's."
)


def print_sessions(rows: list[dict[str, Any]]) -> None:
    """``GET /sessions`` rows as a table whose session ids are never cut (issue 21, item 12:
    at 80 columns they were, "incident-…", and could not be copied): the other columns wrap
    or shrink first; when even that leaves too little room, each session is an id on a line
    of its own (never folded: the terminal wraps it, a copy takes it whole) and its figures
    on the next. The tenant column is left out when every row has the same tenant (a
    tenant's key), which is said above them; the kind column (api, own agent) when every
    row is the API's."""
    tenants = {row["tenant"] for row in rows}
    if len(tenants) == 1:
        console.print(f"tenant {next(iter(tenants))}", highlight=False, markup=False)
    longest = max((len(row["session_id"]) for row in rows), default=len("session"))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("session", no_wrap=True, min_width=longest)
    if len(tenants) > 1:
        table.add_column("tenant")
    kinds = any(row.get("kind", "api") != "api" for row in rows)
    if kinds:
        table.add_column("kind")
    for name in ("messages", "chars", "compactions"):
        table.add_column(name, justify="right")
    table.add_column("last activity")
    table.add_column("in flight", justify="right")
    for row in rows:
        cells = [row["session_id"]] + ([row["tenant"]] if len(tenants) > 1 else [])
        cells += [row.get("kind", "api")] if kinds else []
        cells += [_num(row["messages"]), _num(row["chars"]), f"{row['compactions']:,}"]
        cells += [_when(row["last_activity"]), str(row["jobs_in_flight"] or "")]
        table.add_row(*(Text(cell) for cell in cells))
    unbounded = console.options.update_width(1_000_000)  # Measurement.get clamps to the width
    if Measurement.get(console, unbounded, table).minimum <= console.width:
        console.print(table)
        return
    for row in rows:
        console.print(Text(row["session_id"], style="bold"), soft_wrap=True)
        figures = [row["tenant"]] if len(tenants) > 1 else []
        if row.get("kind", "api") != "api":
            figures.append(row["kind"])
        if row["messages"] is not None:
            figures.append(counted(row["messages"], "message"))
        if row["chars"] is not None:
            figures.append(counted(row["chars"], "char"))
        figures.append(counted(row["compactions"], "compaction"))
        if row["last_activity"]:
            figures.append(f"last activity {_when(row['last_activity'])}")
        if row["jobs_in_flight"]:
            figures.append(f"{counted(row['jobs_in_flight'], 'job')} in flight")
        console.print(Padding(Text(" · ".join(figures)), (0, 0, 0, 2), expand=False))


def _when(iso: str | None) -> str:
    """An API timestamp (ISO 8601, UTC) as ``2025-03-11 14:30:00``."""
    return (iso or "")[:19].replace("T", " ")


def _num(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


@app.command()
def show(
    session_id: Annotated[str, typer.Argument(help="The session id")],
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    width: Annotated[int, typer.Option(help="Chars of each message shown (0: all of it)")] = 300,
) -> None:
    """Show a session: its thread as the model sees it (the summary marked), then its
    compaction jobs."""
    from offpath.compaction.accounting import content_text, message_chars
    from offpath.compaction.summary import is_summary

    what = f"cannot read session {session_id!r}"
    thread = call_api(url, api_key, "GET", f"/sessions/{session_id}/messages", what).json()
    jobs = call_api(url, api_key, "GET", f"/sessions/{session_id}/compactions", what).json()
    messages = to_messages(thread["messages"])
    own = thread.get("kind") == "own agent"
    console.print(
        f"[bold]{session_id}[/bold]{' (own agent)' if own else ''}: "
        f"{counted(len(messages), 'message')}, {counted(thread['chars'], 'char')}",
        highlight=False,
    )
    for i, m in enumerate(messages):
        label = "summary" if is_summary(m) else m.type
        style = "bold magenta" if label == "summary" else "bold"
        text = content_text(m.content, placeholders=True)
        if width and len(text) > width:
            text = text[:width] + f" ... (+{counted(len(text) - width, 'char')})"
        head = f"[{style}]#{i} {label}[/{style}] {m.id} ({counted(message_chars(m), 'char')})"
        if m.type == "tool":
            head += f" <- {m.tool_call_id}"
        console.print(head, highlight=False)
        for call in getattr(m, "tool_calls", None) or []:
            args = json.dumps(call["args"], ensure_ascii=False)
            console.print(
                f"  -> {call['name']}({args[: width or None]}) [{call['id']}]",
                highlight=False,
                markup=False,
            )
        if text:
            console.print("  " + text.replace("\n", "\n  "), highlight=False, markup=False)
    table = Table(
        "job",
        "status",
        "reason",
        "summarizer",
        "latency",
        "chars removed",
        "queued at",
        title="jobs",
    )
    for j in jobs["jobs"]:
        table.add_row(
            j["job_id"][:12],
            j["status"],
            j["reason_code"] or "",
            j["summarizer"] or "",
            _ms(j["latency_ms"]),
            _num(j["chars_removed"]),
            j["created_at"][:19].replace("T", " "),
        )
    console.print(table)


@app.command()
def compact(
    session_id: Annotated[str, typer.Argument(help="The session id")],
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
    wait: Annotated[
        bool, typer.Option(help="Wait for the job to end and print how it ended")
    ] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the job")] = 120,
) -> None:
    """Compact a session now (POST /sessions/{id}/compact), under its threshold too; exits 1
    if there is nothing to compact, a job is in flight, or the job fails."""
    what = f"cannot compact {session_id!r}"
    done = call_api(url, api_key, "POST", f"/sessions/{session_id}/compact", what).json()
    console.print(f"job {done['job_id']}: {done['status']}", highlight=False)
    own = done.get("kind") == "own agent"
    if own:  # the agent's middleware applies it: say so (issue 21, item 1)
        console.print(done["detail"], highlight=False, markup=False)
    if not wait or done["status"] != "queued":
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = call_api(url, api_key, "GET", f"/sessions/{session_id}/compactions", what).json()
        job = next((j for j in jobs["jobs"] if j["job_id"] == done["job_id"]), None)
        if own and job is not None and job["status"] == "prepared":
            console.print(
                "prepared: the agent's middleware applies it at the thread's next model call",
                highlight=False,
            )
            return
        if job is not None and job["status"] in ("applied", "skipped", "failed", "reverted"):
            if job["status"] == "applied":
                console.print(
                    f"applied: -{counted(job['chars_removed'], 'char')}, "
                    f"{counted(job['messages_removed'], 'message')} summarized by "
                    f"{job['summarizer']} in {_ms(job['latency_ms'])}",
                    highlight=False,
                )
                return
            fail(f"job {done['job_id']} {job['status']}: {job['reason']}")
        time.sleep(0.5)
    fail(f"job {done['job_id']} did not end within {timeout:g}s (it goes on; see `offpath show`)")


@app.command()
def revert(
    session_id: Annotated[str, typer.Argument(help="The session id")],
    job_id: Annotated[
        str | None,
        typer.Argument(help="The compaction job to revert (default: the latest applied one)"),
    ] = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Revert a session's latest compaction: its originals go back in place of its summary.

    The originals come byte for byte from the archive (POST
    /sessions/{id}/compactions/{job}/revert). Exits 1 if it cannot be reverted now (the API
    says why) or the session has no applied compaction."""
    what = f"cannot revert a compaction of {session_id!r}"
    if job_id is None:
        jobs = call_api(url, api_key, "GET", f"/sessions/{session_id}/compactions", what).json()
        applied = [j for j in jobs["jobs"] if j["status"] == "applied"]
        if not applied:
            fail(f"{what}: it has no applied compaction (see `offpath show {session_id}`)")
        job_id = applied[-1]["job_id"]
    done = call_api(
        url, api_key, "POST", f"/sessions/{session_id}/compactions/{job_id}/revert", what
    ).json()
    console.print(
        f"job {done['job_id']} reverted: {counted(done['messages_restored'], 'message')} and "
        f"{counted(done['results_restored'], 'shortened result')} put back; the thread has "
        f"{counted(done['messages'], 'message')}, {counted(done['chars'], 'char')}",
        highlight=False,
    )


@app.command()
def api(
    host: Annotated[str, typer.Option(help="Interface to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port")] = 8000,
) -> None:
    """Run the chat API (uvicorn)."""
    settings = settings_or_exit()
    migrate_or_exit(settings)
    if settings.auth_disabled and host not in ("127.0.0.1", "localhost", "::1"):
        err.print(
            f"[red]warning:[/red] AUTH_DISABLED=true and the API listens on {host}: anyone who "
            "reaches it can read and write every session and spend the LLM budget",
            highlight=False,
        )
    import uvicorn

    uvicorn.run("offpath.api.app:app", host=host, port=port, log_level=settings.log_level.lower())


@app.command()
def worker(
    pool: Annotated[str | None, typer.Option(help="Celery pool (default: WORKER_POOL)")] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(help="Concurrent jobs per process (default: WORKER_CONCURRENCY)"),
    ] = None,
    processes: Annotated[
        int | None,
        typer.Option(help="Worker processes (default: WORKER_PROCESSES; 0: one per core)"),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="Worker node name (default: celery@host)")
    ] = None,
    restart: Annotated[bool, typer.Option(help="Restart the worker if it dies")] = True,
) -> None:
    """Run Celery workers for compaction jobs, one process per core, each restarted if it dies.

    One process per core: a process's jobs share one GIL, and with the threads pool one
    process is CPU-bound long before its LLM calls are (BENCHMARKS.md, throughput). The
    restart is there because kombu 5.7 ends a worker that loses Redis while a job is in
    flight ("Unrecoverable error: AttributeError ... 'hostname'"); the job itself is safe
    (redelivered after the visibility timeout). ``--no-restart``: a process that exits ends
    the others too (a supervisor such as Docker restarts the whole).
    """
    settings = settings_or_exit()
    migrate_or_exit(settings)
    if settings.redis_eviction_check == "refuse":  # one line, not a restart loop (issue 20)
        from offpath.coordination.eviction import EvictingRedis, check_eviction

        try:
            check_eviction(settings, "the worker")
        except EvictingRedis as exc:
            fail(str(exc))
    n = processes if processes is not None else settings.worker_processes
    n = n or os.cpu_count() or 1
    cmds = []
    for i in range(n):
        cmd = [
            *CELERY,
            "worker",
            f"--loglevel={settings.log_level}",
            f"--pool={pool or settings.worker_pool}",
            f"--concurrency={concurrency or settings.worker_concurrency}",
            f"--queues={settings.celery_queue}",
            "--without-mingle",
            "--without-gossip",  # start-up sync and chatter offpath does not use
        ]
        node = name or "celery@%h"
        if n > 1:  # one node name per process
            left, at, right = node.partition("@")
            node = f"{left}{i + 1}{at}{right}"
        if n > 1 or name:
            cmd.append(f"--hostname={node}")
        env = None
        if n > 1 and settings.worker_metrics_port:  # one metrics port per process
            env = {**os.environ, "WORKER_METRICS_PORT": str(settings.worker_metrics_port + i)}
        cmds.append((cmd, env))
    if n == 1 and not restart:
        os.execv(sys.executable, cmds[0][0])
    if n > 1:
        err.print(f"starting {n} worker processes", highlight=False)
    raise typer.Exit(supervise(cmds, restart=restart))


#: Signals that stop the supervised workers; blocked while a new child is being started.
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def supervise(cmds: list[tuple[list[str], dict[str, str] | None]], restart: bool = True) -> int:
    """Run each ``(cmd, env)``, restarting one when it exits with an error (backoff 1 s,
    doubling to 30 s), until all exit cleanly or we are told to stop. ``restart=False``:
    the first to exit with an error stops the others; its code is returned.

    Each child runs in a process group of its own, so a Ctrl-C in the terminal reaches only
    us, and we pass it on once: the first SIGINT, SIGTERM or SIGHUP becomes a SIGTERM
    (Celery's warm shutdown: running jobs finish, exit 0), a second Ctrl-C a SIGQUIT
    (cold shutdown). On Linux the children are also told to stop (SIGTERM) if we die, even
    by SIGKILL, so no worker is left behind.
    """
    stops = 0
    children: list[subprocess.Popen[bytes] | None] = [None] * len(cmds)

    def forward(signum: int, _frame: object) -> None:
        nonlocal stops
        stops += 1
        cold = stops > 1 and signum == signal.SIGINT
        for child in children:
            if child is not None and child.poll() is None:
                child.send_signal(signal.SIGQUIT if cold else signal.SIGTERM)
        if stops == 1:
            err.print("stopping the worker when its running jobs end (Ctrl-C again: cancel them)")

    for signum in STOP_SIGNALS:
        signal.signal(signum, forward)
    in_child = _child_setup()
    delays = [1.0] * len(cmds)
    started = [0.0] * len(cmds)
    due = [0.0] * len(cmds)  # when a child is (re)started
    done = [False] * len(cmds)
    code = 0
    while True:
        now = time.monotonic()
        for i, (cmd, env) in enumerate(cmds):
            child = children[i]
            if done[i]:
                continue
            if child is None:
                if stops:
                    done[i] = True
                elif now >= due[i]:
                    # a stop signal that arrives while a child is starting is handled once it
                    # is in ``children``; the child unblocks them for itself (in_child)
                    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
                    try:
                        if not stops:
                            children[i] = subprocess.Popen(
                                cmd, env=env, process_group=0, preexec_fn=in_child
                            )
                            started[i] = now
                    finally:
                        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
                continue
            exit_code = child.poll()
            if exit_code is None:
                continue
            children[i] = None
            if stops and exit_code == -signal.SIGTERM:
                exit_code = 0  # stopped by our SIGTERM before Celery took its signals
            if stops or exit_code == 0 or not restart:
                done[i] = True
                code = code or exit_code
                if exit_code and not stops:  # --no-restart: the others stop too
                    forward(signal.SIGTERM, None)
            else:
                fast = now - started[i] <= 60
                delays[i] = min(delays[i] * 2, 30.0) if fast else 1.0
                due[i] = now + delays[i]
                err.print(
                    f"worker exited with code {exit_code}; restarting in {delays[i]:.0f}s",
                    highlight=False,
                )
        if all(done):
            return code
        time.sleep(0.1)


def _child_setup() -> Any:
    """What the supervised child runs before exec: ask for SIGTERM when the supervisor dies
    (Linux ``PR_SET_PDEATHSIG``; skipped elsewhere), then take the stop signals back."""
    parent = os.getpid()
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            pass

    def in_child() -> None:
        if prctl is not None:
            prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        if prctl is not None and os.getppid() != parent:  # it died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return in_child


@app.command()
def flower(
    port: Annotated[int | None, typer.Option(help="Port (default: FLOWER_PORT)")] = None,
    address: Annotated[
        str, typer.Option(help="Interface to bind; 0.0.0.0 needs FLOWER_BASIC_AUTH")
    ] = "127.0.0.1",
) -> None:
    """Run Flower on the broker, with basic auth from FLOWER_BASIC_AUTH."""
    settings = settings_or_exit()
    if not settings.flower_basic_auth and address not in ("127.0.0.1", "localhost", "::1"):
        fail(f"FLOWER_BASIC_AUTH is empty: set user:password before binding Flower to {address}")
    if not settings.flower_basic_auth:
        err.print(
            "warning: FLOWER_BASIC_AUTH is empty; Flower has no password (only 127.0.0.1 can reach it)"
        )
    # Flower reads FLOWER_BASIC_AUTH itself: the password stays out of the process list
    os.environ["FLOWER_BASIC_AUTH"] = settings.flower_basic_auth
    cmd = [
        *CELERY,
        "flower",
        f"--port={port or settings.flower_port}",
        f"--address={address}",
    ]
    os.execv(sys.executable, cmd)


@app.command()
def beat(
    check: Annotated[
        bool,
        typer.Option("--check", help="Exit 0 if the reconciler ran in the last 3 intervals"),
    ] = False,
) -> None:
    """Run Celery beat: the reconciler's schedule (every RECONCILE_INTERVAL_S). Run one."""
    settings = settings_or_exit()
    if check:
        from offpath.agent.graph import open_runtime
        from offpath.worker.reconciler import seconds_since_last_pass

        rt = open_runtime(settings, run_migrations=False)
        try:
            ago = seconds_since_last_pass(rt)
        finally:
            rt.close()
        if ago is None or ago > 3 * settings.reconcile_interval_s:
            fail(
                "the reconciler has not run lately"
                + (f" (last pass {ago:.0f}s ago)" if ago else "")
            )
        console.print(f"reconciler: last pass {ago:.0f}s ago")
        return
    migrate_or_exit(settings)
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    cmd = [
        *CELERY,
        "beat",
        f"--loglevel={settings.log_level}",
        f"--schedule={Path(settings.data_dir) / 'celerybeat-schedule'}",
    ]
    os.execv(sys.executable, cmd)


keys_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode="markdown", help="Create, list and revoke API keys."
)
app.add_typer(keys_app, name="keys")


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="The tenant the key acts for")],
    admin: Annotated[bool, typer.Option(help="An admin key sees every tenant")] = False,
) -> None:
    """Create a key; it is printed once (only its hash is stored)."""
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", tenant):
        fail("--tenant must be 1-64 letters, digits or . _ -")
    settings = settings_or_exit()
    migrate_or_exit(settings)
    from offpath.stores.db import make_engine
    from offpath.stores.tenants import create_key

    engine = make_engine(settings)
    key = create_key(engine, tenant, admin=admin)
    engine.dispose()
    err.print(f"key for tenant {tenant}{' (admin)' if admin else ''}; shown once, keep it:")
    print(key)


@keys_app.command("list")
def keys_list() -> None:
    """List keys (their prefixes, never the keys)."""
    settings = settings_or_exit()
    migrate_or_exit(settings)
    from offpath.stores.db import make_engine
    from offpath.stores.tenants import list_keys

    engine = make_engine(settings)
    table = Table("prefix", "tenant", "admin", "created", "revoked")
    for k in list_keys(engine):
        table.add_row(
            k["prefix"],
            k["tenant"],
            "yes" if k["admin"] else "",
            f"{k['created_at']:%Y-%m-%d %H:%M}",
            f"{k['revoked_at']:%Y-%m-%d %H:%M}" if k["revoked_at"] else "",
        )
    engine.dispose()
    console.print(table)


@keys_app.command("revoke")
def keys_revoke(
    key: Annotated[str, typer.Argument(help="The key, or its prefix as `keys list` shows it")],
) -> None:
    """Revoke a key (it stops working within seconds)."""
    settings = settings_or_exit()
    migrate_or_exit(settings)
    from offpath.stores.db import make_engine
    from offpath.stores.tenants import UnknownKey, revoke_key

    engine = make_engine(settings)
    try:
        n = revoke_key(engine, key)
    except UnknownKey as exc:
        fail(str(exc))
    finally:
        engine.dispose()
    console.print(f"revoked {n} key(s)")


def migrate_or_exit(settings: Settings) -> str:
    """Bring the usage tables up to date; one line and exit 1 if the database is unreachable."""
    from offpath.stores.db import migrate as run_migrations

    try:
        return run_migrations(settings)
    except Exception as exc:  # the driver's own message says what is wrong
        # all of it on one line: the first line says where it failed, the last one why
        reason = " ".join(str(getattr(exc, "orig", None) or exc).split())
        where = settings.database_url or f"SQLite under {settings.data_dir}"
        fail(f"cannot use the database ({where}): {reason or type(exc).__name__}")
        raise  # unreachable: fail() exits


@app.command()
def migrate() -> None:
    """Create or upgrade the usage tables (Alembic)."""
    settings = settings_or_exit()
    console.print(migrate_or_exit(settings))


@app.command()
def demo(
    file: Annotated[
        Path | None, typer.Option(help="Conversation to replay (default: the example)")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the compaction jobs")] = 90,
    serve: Annotated[
        bool, typer.Option(help="Keep the API (and its dashboard at /ui) up until Ctrl-C")
    ] = False,
) -> None:
    """Run the whole loop on embedded defaults: worker, API, a replayed investigation, /stats,
    and the dashboard's URL."""
    from offpath.cli.demo import run_demo

    settings = settings_or_exit()
    try:
        code = run_demo(settings, file, timeout, serve)
    except CliError as exc:
        fail(str(exc))
    raise typer.Exit(code)


def main() -> None:  # pragma: no cover - console script
    try:
        app()
    except subprocess.CalledProcessError as exc:
        fail(str(exc))


if __name__ == "__main__":  # pragma: no cover
    app()
