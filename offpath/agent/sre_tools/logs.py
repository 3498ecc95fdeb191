"""``get_logs``'s implementation: the services and pods of the manifest, and the container
log files of ``logs/<service>/<pod>.log``, read by time window and regex."""

from __future__ import annotations

import bisect
import heapq
import re
from collections.abc import Callable
from typing import Any

from offpath.agent.sre_tools.fixtures import (
    MAX_CHARS,
    ToolError,
    _answers_errors,
    _cap,
    _int_arg,
    _json,
    _parse_time,
    _read_log,
    _short,
    _stamp,
    fixtures_dir,
)

MAX_LOG_LIMIT = 2000


# ---------------------------------------------------------------- services, pods
def _services() -> dict[str, dict[str, Any]]:
    return _json("manifest.json")["services"]


def _service(name: Any) -> tuple[str, dict[str, Any]]:
    services, key = _services(), str(name or "").strip().lower()
    if key in services:
        return key, services[key]
    for svc, info in services.items():
        if key and key in (p.lower() for p in info["pods"]):
            raise ToolError(
                f"unknown service {name!r}: that is a pod of {svc}; "
                f"use service={svc!r}, pod={key!r}"
            )
    close = [s for s in services if key and (key in s or s in key)]
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ToolError(f"unknown service {name!r}{hint}. Known services: {', '.join(services)}")


def _pods(service: str, info: dict[str, Any], pod: Any) -> list[str]:
    pods, want = info["pods"], str(pod or "").strip().lower()
    if not want:
        return list(pods)
    if want in pods:
        return [want]
    found = [p for p in pods if want in p.lower()]
    if not found:
        raise ToolError(
            f"no pod {pod!r} of service {service} in the logs. Its pods: {', '.join(pods)}"
        )
    return found


# ---------------------------------------------------------------- get_logs
def _grep(pattern: str) -> tuple[Callable[[str], bool], str]:
    if not pattern:
        return (lambda line: True), ""
    try:
        rx = re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        low = pattern.lower()
        return (
            lambda line: low in line.lower()
        ), f"grep is not a valid regex ({exc}): matched as text"
    return (lambda line: rx.search(line) is not None), ""


@_answers_errors
def _get_logs(
    service: str, pod: str = "", since: str = "", until: str = "", grep: str = "", limit: int = 200
) -> str:
    name, info = _service(service)
    pods = _pods(name, info, pod)
    start, end = _parse_time(since, "since"), _parse_time(until, "until")
    if start and end and start >= end:
        raise ToolError(f"since ({_short(start)}) is not before until ({_short(end)})")
    limit, limit_note = _int_arg(limit, "limit", 1, MAX_LOG_LIMIT)
    match, grep_note = _grep(str(grep or ""))
    lo, hi = (_stamp(start) if start else ""), (_stamp(end) if end else "\uffff")
    folder = fixtures_dir() / "logs" / name
    streams = []
    for p in pods:
        path = folder / f"{p}.log"
        try:
            stamps, lines = _read_log(str(path), path.stat().st_mtime_ns)
        except FileNotFoundError:
            raise ToolError(f"fixture file {path} is missing") from None
        a, b = bisect.bisect_left(stamps, lo), bisect.bisect_left(stamps, hi)
        prefix = f"[{p}] " if len(pods) > 1 else ""
        streams.append([(stamps[i], prefix + lines[i]) for i in range(a, b) if match(lines[i])])
    found = [line for _, line in heapq.merge(*streams)]
    shown = found[-limit:]
    window = f"{_short(start) if start else 'start of the logs'} .. {_short(end) if end else 'now'}"
    who = pods[0] if len(pods) == 1 else f"{len(pods)} pods ({', '.join(pods)})"
    head = [
        f"logs of {name} (namespace {info['namespace']}), {who}; {window}"
        + (f"; grep /{grep}/i" if grep else ""),
        f"{len(found):,} matching lines",
    ]
    head += [f"note: {n}" for n in (limit_note, grep_note) if n]
    if not found:
        cover = _json("manifest.json")["logs"]
        head.append(
            f"(no lines match; the fixture logs cover {cover['from']} .. {cover['to']}, plus each "
            "container's start-up lines)"
        )
    skipped = len(found) - len(shown)

    def note(n: int) -> str:  # n: lines the answer cap cut
        why = [r for r, c in ((f"limit={limit}", skipped), ("the 8,000-char answer cap", n)) if c]
        return (
            f"[... {skipped + n:,} earlier matching lines not shown ({' and '.join(why)}): "
            "narrow since/until or grep ...]"
        )

    text = "\n".join([*head, *([note(0)] if skipped else []), *shown])
    return text if len(text) <= MAX_CHARS else _cap(head, shown, [], note)
