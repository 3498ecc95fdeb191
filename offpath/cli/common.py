"""What the ``offpath`` commands share: the typer ``app`` they register on, the consoles,
``CliError`` and ``fail`` (one line on stderr and a non-zero exit: 1 for bad input or a
failed request, 2 for bad settings), the settings a command loads, reading a conversation
file and replaying it to the API, the ``--url``/``--api-key`` options and the API's client,
``/stats`` as a table, and bringing the usage tables up to date. It holds no command and
imports no other module of ``offpath.cli``.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn

import httpx
import typer
from langchain_core.messages import messages_to_dict
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from offpath.compaction.formats import (
    ConversationFormatError,
    extract_messages,
    split_turns,
    to_messages,
)
from offpath.compaction.settings import API_URL_PATTERN, Settings, SettingsError
from offpath.config import ClientSettings, load_client_settings, load_settings

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode="markdown",
    help="Conversation compaction off the request path.",
)
console = Console(emoji=False)
err = Console(stderr=True, soft_wrap=True, emoji=False)


class CliError(Exception):
    """A user-facing error: printed as one line, exit 1."""


def settings_or_exit(**flags: tuple[str, object]) -> Settings:
    """All settings, validated together (a command that starts part of the service); exit 2
    with one line naming each bad setting. ``flags``: a setting's field -> ``(the option
    that sets it, its value)``, None when not given: a value given wins over the
    environment and is checked as the setting is (DESIGN.md invariant 19), the error naming
    the option (``--pool: Input should be 'threads', 'prefork' or 'solo' (got 'bogus')``)."""
    given = {field: value for field, (_, value) in flags.items() if value is not None}
    try:
        return load_settings(**given)
    except SettingsError as exc:
        text = str(exc)
        for field, (option, _) in flags.items():
            if field in given:
                text = text.replace(f"{field.upper()}:", f"{option}:")
        err.print(f"[red]error:[/red] {escape(text)}", highlight=False)
        raise typer.Exit(2) from None


def client_settings_or_exit() -> ClientSettings:
    """Only what a client of the API reads (``API_URL``, ``OFFPATH_API_KEY``): a bad setting
    of the service that the client does not use cannot stop it; exit 2
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


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


# --- reading conversation files ---------------------------------------------------------------


def detect_format(items: Sequence[Mapping[str, Any]]) -> str:
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
    """A session id made from a file's name: its ASCII letters, digits and ``. _ -``, any
    other run of chars one ``-`` (``my incident.json``: ``my-incident``; a name of none of
    them: ``session``), as the API's thread ids take them; a name with other scripts ends
    with 8 hex chars of its hash (``事故.json``: ``session-<hash>``), so two such names make
    two ids."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).strip("-.")
    if not path.stem.isascii():  # two names of other scripts do not make one id
        tag = hashlib.sha256(path.stem.encode()).hexdigest()[:8]
        return f"{cleaned[:119] or 'session'}-{tag}"
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


# --- the API's client --------------------------------------------------------------------------


ApiKeyOption = Annotated[
    str | None,
    typer.Option("--api-key", help="API key (default: OFFPATH_API_KEY)", show_default=False),
]


def cannot_listen(host: str, port: int) -> str | None:
    """Why a server could not bind ``host``:``port`` (another process listens there, or the
    address is not this machine's), or None; bound as uvicorn binds (``SO_REUSEADDR``), then
    let go (``offpath api``, the demo's ``--port``)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _api_url(value: str | None) -> str | None:
    """``--url`` as given, once it names a scheme (``localhost:8765`` alone would be read as
    a URL of scheme ``localhost``). Raises ``typer.BadParameter`` (exit 2) otherwise."""
    if value is not None and not re.match(API_URL_PATTERN, value):
        raise typer.BadParameter(f"{value!r}: give the API's URL with http:// or https://")
    return value


UrlOption = Annotated[
    str | None, typer.Option(help="API URL (default: API_URL)", callback=_api_url)
]


def api_client(
    settings: ClientSettings | Settings, url: str | None, api_key: str | None, timeout: float = 60
):
    """An HTTP client for the API at ``url`` (``API_URL``), sending the API key."""
    key = api_key or (
        settings.offpath_api_key.get_secret_value() if settings.offpath_api_key else ""
    )
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=url or settings.api_url, timeout=timeout, headers=headers)


def not_the_api(r: httpx.Response, what: str) -> None:
    """One line and exit 1 when ``r`` is no answer of offpath's API (a page of another server
    at ``--url``: Flower's HTML, a path after the base URL): its status and content type,
    never its body, and what ``--url`` takes."""
    kind = r.headers.get("content-type", "").split(";")[0].strip() or "no content type"
    base = f"{r.request.url.scheme}://{r.request.url.netloc.decode()}"
    fail(
        f"{what}: {base} has no {r.request.url.path} ({r.status_code}, {kind}): give --url the "
        "API's base URL (e.g. http://127.0.0.1:8000), and an id the API takes"
    )


def check_answer(r: httpx.Response, what: str) -> None:
    """One line and exit 1 for an answer that is not 2xx (401 says how to get a key; a 404
    of no route, or a 4xx that is no JSON: :func:`not_the_api`; a 5xx that is no JSON, from
    the API or a proxy before it, by its status alone)."""
    json_answer = "json" in r.headers.get("content-type", "")
    if r.status_code >= 500 and not json_answer:
        kind = r.headers.get("content-type", "").split(";")[0].strip() or "no content type"
        fail(f"{what}: the API answered {r.status_code} ({kind}): its log says why")
    if 400 <= r.status_code < 500 and not json_answer:
        not_the_api(r, what)
    if r.status_code == 404 and _detail(r) == "Not Found":  # no such route: not the API's
        not_the_api(r, what)
    if r.status_code == 401:
        make = "create one with `offpath keys create --tenant NAME`"
        if "authorization" not in {k.lower() for k in r.request.headers}:
            fail(f"{what}: no API key was sent: pass --api-key or set OFFPATH_API_KEY ({make})")
        detail = _detail(r)
        fail(
            f"{what}: the API refused the key ({detail}); pass --api-key or set OFFPATH_API_KEY"
            + ("" if "keys create" in detail else f" ({make})")
        )
    if r.status_code >= 400:
        fail(f"{what}: the API answered {r.status_code}: {_detail(r)}")


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
                key,
                f"p50 {fmt_ms(spread['p50'])}, p99 {fmt_ms(spread['p99'])} (n={spread['count']})",
            )
    if tokens := s.get("llm_tokens"):
        table.add_row(
            "llm_tokens",
            f"input {tokens['input']:,}, output {tokens['output']:,} "
            f"({counted(tokens['events'], 'compaction')} reported them)",
        )
    console.print(table)


def fmt_ms(value: float | None) -> str:
    """Milliseconds for a table cell (``1,234 ms``; ``-`` when unknown)."""
    return "-" if value is None else f"{value:,.0f} ms"


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


def migrate_or_exit(settings: Settings) -> str:
    """Bring the usage tables up to date; one line and exit 1 if the database is unreachable."""
    from offpath.stores.db.engine import migrate as run_migrations

    try:
        return run_migrations(settings)
    except Exception as exc:  # the driver's own message says what is wrong
        # all of it on one line: the first line says where it failed, the last one why
        reason = " ".join(str(getattr(exc, "orig", None) or exc).split())
        where = settings.database_url or f"SQLite under {settings.data_dir}"
        fail(f"cannot use the database ({where}): {reason or type(exc).__name__}")
        raise  # unreachable: fail() exits
