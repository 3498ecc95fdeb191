"""``get_logs``'s implementation: the services and pods of the manifest, and the container
log files of ``logs/<service>/<pod>.log``, read by time window and regex."""

from __future__ import annotations

import bisect
import heapq
import re
from collections.abc import Callable
from typing import Any

from langchain_core.tools import tool

from offpath.agent.sre_tools.fixtures import (
    MAX_CHARS,
    ToolError,
    answers_errors,
    cap_answer,
    fixtures_dir,
    int_arg,
    parse_time,
    read_fixture,
    read_log,
    short_time,
    stamp,
)

MAX_LOG_LIMIT = 2000


# ---------------------------------------------------------------- services, pods
def _services() -> dict[str, dict[str, Any]]:
    return read_fixture("manifest.json")["services"]


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


@answers_errors
def _get_logs(
    service: str, pod: str = "", since: str = "", until: str = "", grep: str = "", limit: int = 200
) -> str:
    name, info = _service(service)
    pods = _pods(name, info, pod)
    start, end = parse_time(since, "since"), parse_time(until, "until")
    if start and end and start >= end:
        raise ToolError(f"since ({short_time(start)}) is not before until ({short_time(end)})")
    limit, limit_note = int_arg(limit, "limit", 1, MAX_LOG_LIMIT)
    match, grep_note = _grep(str(grep or ""))
    lo, hi = (stamp(start) if start else ""), (stamp(end) if end else "\uffff")
    folder = fixtures_dir() / "logs" / name
    streams = []
    for p in pods:
        path = folder / f"{p}.log"
        try:
            stamps, lines = read_log(str(path), path.stat().st_mtime_ns)
        except FileNotFoundError:
            raise ToolError(f"fixture file {path} is missing") from None
        a, b = bisect.bisect_left(stamps, lo), bisect.bisect_left(stamps, hi)
        prefix = f"[{p}] " if len(pods) > 1 else ""
        streams.append([(stamps[i], prefix + lines[i]) for i in range(a, b) if match(lines[i])])
    found = [line for _, line in heapq.merge(*streams)]
    shown = found[-limit:]
    window = f"{short_time(start) if start else 'start of the logs'} .. {short_time(end) if end else 'now'}"
    who = pods[0] if len(pods) == 1 else f"{len(pods)} pods ({', '.join(pods)})"
    head = [
        f"logs of {name} (namespace {info['namespace']}), {who}; {window}"
        + (f"; grep /{grep}/i" if grep else ""),
        f"{len(found):,} matching lines",
    ]
    head += [f"note: {n}" for n in (limit_note, grep_note) if n]
    if not found:
        cover = read_fixture("manifest.json")["logs"]
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
    return text if len(text) <= MAX_CHARS else cap_answer(head, shown, [], note)


@tool(parse_docstring=True)
def get_logs(
    service: str, pod: str = "", since: str = "", until: str = "", grep: str = "", limit: int = 200
) -> str:
    """Read container logs of a service (all its pods, merged by time, or some of them).

    Times are UTC. Lines start with their timestamp; with several pods each line is prefixed
    with [pod]. The answer holds the most recent matching lines (at most `limit`, and at most
    8,000 characters) and says how many matched.

    Args:
        service: Service name, e.g. checkout-api, fulfillment-api, orders-worker, orders-db, cart-cache, ingress-nginx.
        pod: A pod name or part of one (e.g. 6f7d9-2); empty for all pods of the service.
        since: Start of the window: HH:MM[:SS], ISO 8601, or a duration back from now such as 30m; empty for no start.
        until: End of the window (exclusive), same forms; empty for now.
        grep: Case-insensitive regular expression the lines must contain, e.g. "ERROR|WARN" or "status=503".
        limit: Most lines to return (the latest ones), 1-2000.
    """
    return _get_logs(service, pod, since, until, grep, limit)
