"""The fixture files and the helpers every tool shares.

Where the fixtures are (:func:`fixtures_dir`: ``DEMO_FIXTURES_DIR``, else the copy installed
with the package, else ``examples/sre`` of the checkout), reading them (cached by path and
modification time), :class:`ToolError` and the decorator that turns any failure into an
``error:`` answer, parsing time arguments, and capping an answer at :data:`MAX_CHARS`.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

#: The longest answer a tool gives, in characters.
MAX_CHARS = 8000
#: The fixtures a wheel installs as ``offpath/demo/sre`` (pyproject.toml maps examples/sre there).
PACKAGED_FIXTURES = Path(__file__).resolve().parents[2] / "demo" / "sre"
#: The default fixture folder: the installed copy, else ``examples/sre`` of the checkout.
DEFAULT_FIXTURES = (
    PACKAGED_FIXTURES
    if (PACKAGED_FIXTURES / "manifest.json").is_file()
    else Path(__file__).resolve().parents[3] / "examples" / "sre"
)


class ToolError(Exception):
    """A bad argument or a missing fixture; the tool answers ``error: <message>``."""


def answers_errors(fn: Callable[..., str]) -> Callable[..., str]:
    """Turn any exception of ``fn`` into an ``error:`` answer (the tools never raise)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> str:
        try:
            return fn(*args, **kwargs)
        except ToolError as exc:
            return f"error: {exc}"
        except Exception as exc:  # a fixture file edited by hand, a bug: still an answer
            return f"error: {fn.__name__} failed: {type(exc).__name__}: {exc}"

    return wrapper


# ---------------------------------------------------------------- fixtures
def fixtures_dir() -> Path:
    """The fixture folder: ``DEMO_FIXTURES_DIR`` if set, else :data:`DEFAULT_FIXTURES` (the
    copy installed with the package, else ``examples/sre`` of the checkout).

    Raises :class:`ToolError` when it does not exist.
    """
    env = os.environ.get("DEMO_FIXTURES_DIR", "").strip()
    folder = Path(env).expanduser() if env else DEFAULT_FIXTURES
    if not (folder / "manifest.json").is_file():
        where = "DEMO_FIXTURES_DIR" if env else "the default"
        raise ToolError(
            f"no SRE fixtures at {folder} ({where}; expected manifest.json there): run "
            "`python examples/make_sre_fixtures.py` in the repository, or set DEMO_FIXTURES_DIR"
        )
    return folder


@functools.lru_cache(maxsize=16)
def _read_json(path: str, mtime_ns: int) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def read_fixture(name: str) -> Any:
    """The parsed JSON fixture file ``name`` (re-read when it changes); :class:`ToolError` if
    it is missing."""
    path = fixtures_dir() / name
    try:
        return _read_json(str(path), path.stat().st_mtime_ns)
    except FileNotFoundError:
        raise ToolError(f"fixture file {path} is missing") from None


@functools.lru_cache(maxsize=64)
def read_log(path: str, mtime_ns: int) -> tuple[list[str], list[str]]:
    """(timestamps, lines) of a log file; timestamps are the lines' first field."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [line.split(" ", 1)[0] for line in lines], lines


def fixture_now() -> datetime:
    """The fixtures' "now" (``manifest.json``): every relative time is counted from it."""
    return parse_iso(read_fixture("manifest.json")["now"])


# ---------------------------------------------------------------- times
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(text: str) -> float:
    """Seconds of a duration such as ``500ms``, ``30m`` or ``1.5h``; ``ValueError`` otherwise."""
    m = _DURATION.match(text.strip().lower())
    if not m:
        raise ValueError(text)
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_iso(text: str) -> datetime:
    """An ISO 8601 time (``Z`` accepted), UTC when it names no zone."""
    dt = datetime.fromisoformat(text.strip().replace("z", "Z").replace("Z", "+00:00"))
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def parse_time(text: Any, what: str) -> datetime | None:
    """A time argument: "" (none), "now", "now-30m", "30m" / "30m ago", "14:05", "14:05:30"
    (UTC, on the fixtures' day), an ISO 8601 time, or epoch seconds."""
    text = str(text if text is not None else "").strip()
    if not text:
        return None
    now, low = fixture_now(), text.lower()
    try:
        if low == "now":
            return now
        rel = re.match(r"^now\s*-\s*(.+)$", low) or re.match(r"^(.+?)\s*ago$", low)
        if rel or _DURATION.match(low):
            return now - timedelta(seconds=duration_s(rel.group(1) if rel else low))
        if re.match(r"^\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?$", low):
            h, m, *s = low.split(":")
            day = now.replace(hour=0, minute=0, second=0, microsecond=0)
            return day + timedelta(hours=int(h), minutes=int(m), seconds=float(s[0] if s else 0))
        if re.match(r"^\d{9,11}(\.\d+)?$", low):
            return datetime.fromtimestamp(float(low), UTC)
        return parse_iso(text)
    except (ValueError, OverflowError):
        raise ToolError(
            f"{what}={text!r} is not a time: use HH:MM[:SS] (UTC, on {now:%Y-%m-%d}), an ISO 8601 "
            "time such as 2025-03-11T14:05:00Z, a duration back from now such as 30m, or now"
        ) from None


def stamp(dt: datetime) -> str:
    """The log lines' timestamp format (millisecond RFC 3339, UTC)."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def short_time(dt: datetime) -> str:
    """``dt`` in UTC to the second (``2025-03-11T14:05:00Z``), as the tools' answers show it."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def int_arg(value: Any, name: str, lo: int, hi: int) -> tuple[int, str]:
    """(value clamped to lo..hi, a note if it was clamped)."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ToolError(f"{name}={value!r} is not a whole number") from None
    if n < lo:
        raise ToolError(f"{name} must be at least {lo} (got {n})")
    if n > hi:
        return hi, f"{name}={n} lowered to {hi}"
    return n, ""


def cap_answer(
    head: list[str], body: list[str], tail: list[str], cut_note: Callable[[int], str]
) -> str:
    """head + body + tail within MAX_CHARS, dropping body lines from the start if needed;
    ``cut_note(n)`` says that n lines were dropped (it goes after the head)."""
    text = "\n".join([*head, *body, *tail])
    if len(text) <= MAX_CHARS:
        return text
    fixed = sum(len(x) + 1 for x in (*head, *tail)) + len(cut_note(len(body))) + 1
    room, keep = MAX_CHARS - fixed, 0
    for line in reversed(body):
        if room - (len(line) + 1) < 0:
            break
        room -= len(line) + 1
        keep += 1
    kept = body[len(body) - keep :]
    return "\n".join([*head, cut_note(len(body) - keep), *kept, *tail])[:MAX_CHARS]
