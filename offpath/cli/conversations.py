"""The ``offpath`` commands that read and replay conversations through a running API:
``replay``, ``stats``, ``sessions`` and ``show``."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich import box
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from offpath.cli.common import (
    ApiKeyOption,
    CliError,
    UrlOption,
    api_client,
    app,
    call_api,
    check_answer,
    client_settings_or_exit,
    console,
    counted,
    fail,
    fmt_ms,
    not_the_api,
    print_stats,
    read_conversation,
    replay_file,
    session_name,
)
from offpath.compaction.formats import (
    to_messages,
)

FORMATS = ("auto", "transcript", "openai", "langchain")


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
    if fmt not in FORMATS:  # a usage error, as typer's own
        fail(f"--format must be one of {', '.join(FORMATS)}", code=2)
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
    if "json" not in r.headers.get("content-type", ""):
        not_the_api(r, "cannot read /stats")
    print_stats(r.json())


#: ``offpath sessions``' page size when none is given (the API's own default).
SESSIONS_PER_PAGE = 50


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
    limit: Annotated[
        int, typer.Option(help="Sessions per page (1-200)", min=1, max=200)
    ] = SESSIONS_PER_PAGE,
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
    if body["next_cursor"]:  # the next page, with this page's options
        again = ["offpath", "sessions", "--sort", sort]
        again += ["--limit", str(limit)] if limit != SESSIONS_PER_PAGE else []
        again += ["-q", search] if search else []
        console.print(
            "more: " + shlex.join([*again, "--cursor", body["next_cursor"]]),
            highlight=False,
            soft_wrap=True,
            markup=False,
        )


#: What ``offpath sessions`` says under an empty list.
NO_SESSIONS_HINT = (
    "A session is listed once a turn is posted to the API (POST /sessions/{id}/messages or "
    "/turns; `offpath replay`), or once a team's own agent with OffPathCompaction has run a "
    "thread (listed for the tenant OWN_AGENT_TENANT names, 'default' unless set). A tenant's "
    "key lists that tenant's sessions only; an admin key lists every tenant's."
)


def print_sessions(rows: list[dict[str, Any]]) -> None:
    """``GET /sessions`` rows as a table whose session ids are never cut (a cut id,
    "incident-…", cannot be copied): the other columns wrap
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
    width: Annotated[
        int, typer.Option(help="Chars of each message shown (0: all of it)", min=0)
    ] = 300,
) -> None:
    """Show a session: its thread as the model sees it (the summary marked), then its
    compaction jobs."""
    from langchain_core.messages import ToolMessage

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
        if m.type == "tool" and isinstance(m, ToolMessage):
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
            fmt_ms(j["latency_ms"]),
            _num(j["chars_removed"]),
            j["created_at"][:19].replace("T", " "),
        )
    console.print(table)
