"""A read-only SRE toolset for the demo agent: logs, metrics, recent deploys, pod status.

``SRE_TOOLS`` (the default of ``AGENT_TOOLS``) is four LangChain tools that answer
from the fixture files of ``examples/sre/`` (written by
``examples/make_sre_fixtures.py``): the cluster prod-eu-1 at 2025-03-11 14:30 UTC,
25 minutes into the checkout-api latency incident of the example investigation.

* :func:`get_logs` -- container log lines of a service (or some of its pods), by time
  window and regex, newest last.
* :func:`query_metrics` -- a small PromQL matcher over the per-minute fixture series:
  metric name (or one of the raw names a recording rule answers for), label matchers,
  one ``sum|avg|max|min|count [by|without (...)]`` aggregation; a text table.
* :func:`recent_deploys` -- helm history of a release with each revision's pipeline and
  changes (the config diff included).
* :func:`pod_status` -- ``kubectl get pods -o wide`` with a label selector, and why pods
  are not ready or restarted.

Every answer is text an SRE would read, at most :data:`MAX_CHARS` characters (what was cut
is said in the answer). Bad arguments, unknown services or pods and missing fixtures give
an answer starting with ``error:``; the tools never raise. (An argument of the wrong type,
``limit="lots"``, fails the tool's schema before it runs; the agent's tool node turns that
into an error ``ToolMessage`` too.)

The fixture folder is looked up at each call: ``DEMO_FIXTURES_DIR`` if set, else the copy
installed with the package (``offpath/demo/sre``: the wheel ships ``examples/sre`` there, so a
non-editable install such as the Docker image's has them; issue 21, item 7), else
``examples/sre`` of the repository checkout this package lives in (an editable install).
"""

from __future__ import annotations

import bisect
import functools
import heapq
import json
import math
import os
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from langchain_core.tools import BaseTool, tool

#: The longest answer a tool gives, in characters.
MAX_CHARS = 8000
#: The fixtures a wheel installs as ``offpath/demo/sre`` (pyproject.toml maps examples/sre there).
PACKAGED_FIXTURES = Path(__file__).resolve().parents[1] / "demo" / "sre"
#: The default fixture folder: the installed copy, else ``examples/sre`` of the checkout.
DEFAULT_FIXTURES = (
    PACKAGED_FIXTURES
    if (PACKAGED_FIXTURES / "manifest.json").is_file()
    else Path(__file__).resolve().parents[2] / "examples" / "sre"
)
MAX_LOG_LIMIT = 2000
MAX_POINTS = 2000  # samples per series a range query may ask for
LOOKBACK_S = 119  # a sample counts for an evaluation time up to this much later


class ToolError(Exception):
    """A bad argument or a missing fixture; the tool answers ``error: <message>``."""


def _answers_errors(fn: Callable[..., str]) -> Callable[..., str]:
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


def _json(name: str) -> Any:
    path = fixtures_dir() / name
    try:
        return _read_json(str(path), path.stat().st_mtime_ns)
    except FileNotFoundError:
        raise ToolError(f"fixture file {path} is missing") from None


@functools.lru_cache(maxsize=64)
def _read_log(path: str, mtime_ns: int) -> tuple[list[str], list[str]]:
    """(timestamps, lines) of a log file; timestamps are the lines' first field."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [line.split(" ", 1)[0] for line in lines], lines


def _now() -> datetime:
    return _parse_iso(_json("manifest.json")["now"])


# ---------------------------------------------------------------- times
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> float:
    m = _DURATION.match(text.strip().lower())
    if not m:
        raise ValueError(text)
    return float(m.group(1)) * _UNITS[m.group(2)]


def _parse_iso(text: str) -> datetime:
    dt = datetime.fromisoformat(text.strip().replace("z", "Z").replace("Z", "+00:00"))
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _parse_time(text: Any, what: str) -> datetime | None:
    """A time argument: "" (none), "now", "now-30m", "30m" / "30m ago", "14:05", "14:05:30"
    (UTC, on the fixtures' day), an ISO 8601 time, or epoch seconds."""
    text = str(text if text is not None else "").strip()
    if not text:
        return None
    now, low = _now(), text.lower()
    try:
        if low == "now":
            return now
        rel = re.match(r"^now\s*-\s*(.+)$", low) or re.match(r"^(.+?)\s*ago$", low)
        if rel or _DURATION.match(low):
            return now - timedelta(seconds=_duration(rel.group(1) if rel else low))
        if re.match(r"^\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?$", low):
            h, m, *s = low.split(":")
            day = now.replace(hour=0, minute=0, second=0, microsecond=0)
            return day + timedelta(hours=int(h), minutes=int(m), seconds=float(s[0] if s else 0))
        if re.match(r"^\d{9,11}(\.\d+)?$", low):
            return datetime.fromtimestamp(float(low), UTC)
        return _parse_iso(text)
    except (ValueError, OverflowError):
        raise ToolError(
            f"{what}={text!r} is not a time: use HH:MM[:SS] (UTC, on {now:%Y-%m-%d}), an ISO 8601 "
            "time such as 2025-03-11T14:05:00Z, a duration back from now such as 30m, or now"
        ) from None


def _stamp(dt: datetime) -> str:
    """The log lines' timestamp format (millisecond RFC 3339, UTC)."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def _short(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int_arg(value: Any, name: str, lo: int, hi: int) -> tuple[int, str]:
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


def _cap(head: list[str], body: list[str], tail: list[str], cut_note: Callable[[int], str]) -> str:
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


# ---------------------------------------------------------------- query_metrics
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
_KEYWORDS |= {"and", "or", "unless", "inf", "nan"}
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|==|=)\s*"((?:[^"\\]|\\.)*)"')
_AGG = re.compile(
    r"\b(sum|avg|max|min|count)\s*(?:(by|without)\s*\(([^)]*)\))?\s*\((.*)\)\s*"
    r"(?:(by|without)\s*\(([^)]*)\))?",
    re.S,
)


def _metric_names(query: str) -> set[str]:
    q = re.sub(r'"(?:[^"\\]|\\.)*"', '""', query)
    q = re.sub(r"\{[^}]*\}", " ", q)
    q = re.sub(r"\[[^\]]*\]", " ", q)
    q = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", q)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", q):
        rest = q[m.end() :].lstrip()
        if rest.startswith("(") or m.group(0).lower() in _KEYWORDS:
            continue
        if m.start() > 0 and (q[m.start() - 1].isdigit() or q[m.start() - 1] == "."):
            continue  # 1m, 0.99e1: part of a number
        names.add(m.group(0))
    return names


def _matchers(query: str) -> list[tuple[str, str, str]]:
    out = []
    for block in re.findall(r"\{([^}]*)\}", query):
        for label, op, value in _MATCHER.findall(block):
            out.append((label, "=" if op == "==" else op, value.replace('\\"', '"')))
    return out


def _label_ok(labels: dict[str, str], label: str, op: str, value: str) -> bool:
    have = labels.get(label, "")
    if op == "=":
        return have == value
    if op == "!=":
        return have != value
    try:
        hit = re.fullmatch(value, have) is not None
    except re.error as exc:
        raise ToolError(f'bad regex in {label}{op}"{value}": {exc}') from None
    return hit if op == "=~" else not hit


def _metric_list(metrics: list[dict[str, Any]]) -> str:
    return "\n".join(f"  {m['name']}: {m['help']}" for m in metrics)


def _select_metrics(query: str, metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names = _metric_names(query)
    name_matchers = [(op, v) for label, op, v in _matchers(query) if label == "__name__"]
    chosen = []
    for m in metrics:
        known = {m["name"], *m["aliases"]}
        if known & names or any(
            any(_label_ok({"__name__": k}, "__name__", op, v) for k in known)
            for op, v in name_matchers
        ):
            chosen.append(m)
    if not chosen:  # a part of a name: "db_pool", "goroutines"
        parts = [n for n in names if len(n) >= 5]
        chosen = [m for m in metrics if any(p in m["name"] for p in parts)]
    return chosen


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    return f"{v:.4g}"


def _series_label(labels: dict[str, str], skip: Iterable[str] = ()) -> str:
    items = [f'{k}="{v}"' for k, v in sorted(labels.items()) if k not in skip]
    return "{" + ", ".join(items) + "}"


def _aggregate(
    query: str, metric: str, series: list[tuple[dict[str, str], dict[int, float]]]
) -> tuple[list[tuple[dict[str, str], dict[int, float]]], str]:
    m = _AGG.search(query)
    if not m:
        return series, ""
    op = m.group(1)
    mode, grouping = (m.group(2), m.group(3)) if m.group(2) else (m.group(5), m.group(6))
    labels = [x.strip() for x in (grouping or "").split(",") if x.strip() and x.strip() != "le"]
    note = ""
    if op == "sum" and metric.endswith(":p99"):
        op, note = "max", "quantiles do not add up: sum evaluated as max"
    groups: dict[tuple[tuple[str, str], ...], list[dict[int, float]]] = {}
    for lab, vals in series:
        if mode == "without":
            key = tuple(sorted((k, v) for k, v in lab.items() if k not in labels))
        elif mode == "by":
            key = tuple(sorted((k, lab[k]) for k in labels if k in lab))
        else:
            key = ()
        groups.setdefault(key, []).append(vals)
    fn: Callable[[list[float]], float] = {
        "sum": sum,
        "max": max,
        "min": min,
        "avg": lambda xs: sum(xs) / len(xs),
        "count": lambda xs: float(len(xs)),
    }[op]
    out = []
    for key, members in sorted(groups.items()):
        times = sorted({t for vals in members for t in vals})
        out.append((dict(key), {t: fn([v[t] for v in members if t in v]) for t in times}))
    how = f"{op} {mode} ({', '.join(labels)})" if mode else op
    return out, f"aggregated: {how}" + (f"; {note}" if note else "")


def _value_at(vals: dict[int, float], times: list[int], t: int) -> float | None:
    i = bisect.bisect_right(times, t) - 1
    if i >= 0 and t - times[i] <= LOOKBACK_S:
        return vals[times[i]]
    return None


@_answers_errors
def _query_metrics(query: str, start: str = "", end: str = "", step: str = "1m") -> str:
    query = str(query or "").strip()
    doc = _json("metrics.json")
    metrics = doc["metrics"]
    if not query:
        raise ToolError("empty query. Metrics in the fixtures:\n" + _metric_list(metrics))
    chosen = _select_metrics(query, metrics)
    if not chosen:
        names = ", ".join(sorted(_metric_names(query))) or "none"
        raise ToolError(
            f"no fixture series for this query (metric names in it: {names}). "
            "Metrics in the fixtures:\n" + _metric_list(metrics)
        )
    t_start, t_end = _parse_time(start, "start"), _parse_time(end, "end")
    try:
        step_s = int(_duration(str(step or "1m")))
    except ValueError:
        raise ToolError(f"step={step!r} is not a duration such as 30s, 1m, 5m") from None
    notes = []
    if step_s < 60:
        step_s = 60
        notes.append("the fixtures hold one sample a minute: step raised to 1m")
    instant = t_start is None
    if instant:
        at = t_end or _now()
        evals = [int(at.timestamp())]
    else:
        stop = t_end or _now()
        if t_start >= stop:
            raise ToolError(f"start ({_short(t_start)}) is not before end ({_short(stop)})")
        n = int((stop - t_start).total_seconds() // step_s) + 1
        if n > MAX_POINTS:
            raise ToolError(f"{n} points per series: raise step or narrow start/end")
        evals = [int(t_start.timestamp()) + k * step_s for k in range(n)]
    matchers = [x for x in _matchers(query) if x[0] != "__name__"]
    blocks = []
    for metric in chosen:
        result = metric["result"]
        present = {k for s in result for k in s["metric"]}
        used = [x for x in matchers if x[0] in present]
        ignored = sorted({f'{lab}{op}"{v}"' for lab, op, v in matchers if lab not in present})
        series = []
        for s in result:
            if all(_label_ok(s["metric"], *x) for x in used):
                series.append((s["metric"], {int(t): float(v) for t, v in s["values"]}))
        series, agg = _aggregate(query, metric["name"], series)
        lo, hi = evals[0] - LOOKBACK_S, evals[-1]  # only series with a sample in the window
        series = sorted(
            (s for s in series if any(lo <= t <= hi for t in s[1])),
            key=lambda s: sorted(s[0].items()),
        )
        blocks.append((metric, series, ignored, agg))
    rng = doc["range"]
    head = [f"query: {query}"]
    if instant:
        head.append(f"instant query at {_short(datetime.fromtimestamp(evals[0], UTC))}")
    else:
        head.append(
            f"range: {_short(datetime.fromtimestamp(evals[0], UTC))} .. "
            f"{_short(datetime.fromtimestamp(evals[-1], UTC))}  step={step_s}s"
        )
    head.append(f"(fixture series: one sample a minute, {rng['start']} .. {rng['end']})")
    head += [f"note: {n}" for n in notes]
    body: list[str] = []
    legend: list[str] = []
    for metric, series, ignored, agg in blocks:
        unit = f", {metric['unit']}" if metric.get("unit") else ""
        legend.append(f"metric {metric['name']}{unit}: {metric['help']}")
        if agg:
            legend.append(f"  {agg}")
        if ignored:
            legend.append(
                f"  ignored matchers (labels this metric does not have): {', '.join(ignored)}"
            )
        if not series:
            legend.append("  no series match the label matchers in this time window")
            continue
        common = (
            {k: v for k, v in series[0][0].items() if all(s[0].get(k) == v for s in series)}
            if len(series) > 1
            else {}
        )
        if common:
            legend.append(f"  common labels: {_series_label(common)}")
        if instant:
            legend += _instant_table(series, evals[0], common)
            continue
        legend_rows, rows = _range_table(series, evals, common)
        legend += legend_rows
        body += rows
    if instant:
        return _cap(head, legend, [], lambda n: f"[... {n} lines cut (8,000-char answer cap)]")
    return _cap(
        [*head, *legend],
        body,
        [],
        lambda n: (
            f"[... the first {n} rows cut (8,000-char answer cap): narrow start/end or raise step ...]"
        ),
    )


def _instant_table(
    series: list[tuple[dict[str, str], dict[int, float]]], t: int, common: dict[str, str]
) -> list[str]:
    rows = []
    for labels, vals in series:
        v = _value_at(vals, sorted(vals), t)
        rows.append((_series_label(labels, common), "-" if v is None else _fmt(v)))
    width = max(len(r[0]) for r in rows)
    return [f"  {'series':<{width}}  value"] + [f"  {a:<{width}}  {b}" for a, b in rows]


def _range_table(
    series: list[tuple[dict[str, str], dict[int, float]]], evals: list[int], common: dict[str, str]
) -> tuple[list[str], list[str]]:
    """(legend lines, table rows): one column per series, in blocks of 8 columns."""
    legend = [f"  #{i + 1} {_series_label(lab, common)}" for i, (lab, _) in enumerate(series)]
    day = len({datetime.fromtimestamp(t, UTC).date() for t in evals}) == 1
    clock = "%H:%M:%S" if day else "%m-%d %H:%M"
    rows: list[str] = []
    sorted_times = [sorted(v) for _, v in series]
    for first in range(0, len(series), 8):
        idx = range(first, min(first + 8, len(series)))
        cells = {
            i: [
                "-" if (v := _value_at(series[i][1], sorted_times[i], t)) is None else _fmt(v)
                for t in evals
            ]
            for i in idx
        }
        width = {i: max(len(f"#{i + 1}"), *(len(c) for c in cells[i])) for i in idx}
        rows.append("time      " + "  ".join(f"{'#' + str(i + 1):>{width[i]}}" for i in idx))
        for k, t in enumerate(evals):
            stamp = datetime.fromtimestamp(t, UTC).strftime(clock)
            rows.append(f"{stamp:<10}" + "  ".join(f"{cells[i][k]:>{width[i]}}" for i in idx))
    return legend, rows


# ---------------------------------------------------------------- recent_deploys
def _helm_time(text: str) -> str:
    return _parse_iso(text).strftime("%a %b %e %H:%M:%S %Y")


@_answers_errors
def _recent_deploys(service: str, limit: int = 10) -> str:
    limit, limit_note = _int_arg(limit, "limit", 1, 50)
    doc = _json("deploys.json")
    releases = {r["release"]: r for r in doc["releases"]}
    key, now = str(service or "").strip().lower(), _now()
    if key in ("", "all", "*"):
        rows = sorted(
            (
                (h["updated"], r["release"], r["namespace"], h)
                for r in releases.values()
                for h in r["history"]
            ),
            key=lambda x: x[0],
            reverse=True,
        )[:limit]
        lines = [f"releases across the cluster, most recent first (as of {_short(now)}):"]
        lines.append(
            f"{'UPDATED':<22}{'RELEASE':<18}{'NAMESPACE':<15}{'REV':<5}{'APP VERSION':<13}STATUS"
        )
        for when, name, ns, h in rows:
            ago = _age(now - _parse_iso(when))
            lines.append(
                f"{when:<22}{name:<18}{ns:<15}{h['revision']:<5}{h['app_version']:<13}"
                f"{h['status']} ({ago} ago)"
            )
        lines.append("(recent_deploys(service=<release>) shows a release's changes)")
        return _cap(lines[:2], lines[2:], [], lambda n: f"[... {n} rows cut ...]")
    if key not in releases:
        raise ToolError(f"no release named {service!r}. Releases: {', '.join(releases)}")
    rel = releases[key]
    hist = rel["history"][-limit:]
    head = [f"$ helm history {key} -n {rel['namespace']} --max {limit}"]
    head += [f"note: {limit_note}"] if limit_note else []
    head.append(
        f"{'REVISION':<10}{'UPDATED':<26}{'STATUS':<12}{'CHART':<22}{'APP VERSION':<13}DESCRIPTION"
    )
    for h in hist:
        head.append(
            f"{h['revision']:<10}{_helm_time(h['updated']):<26}{h['status']:<12}{h['chart']:<22}"
            f"{h['app_version']:<13}{h['description']}"
        )
    body: list[str] = []
    for h in reversed(hist):
        when = _parse_iso(h["updated"])
        body += [
            "",
            f"revision {h['revision']} ({h['app_version']}, {h['status']}): "
            f"{_short(when)}, {_age(now - when)} before {_short(now)}",
        ]
        body.append(
            f"  pipeline: {h.get('pipeline', '-')}"
            + (f", {h['trigger']}" if h.get("trigger") else "")
        )
        body.append(f"  canary analysis: {h.get('canary', '-')}")
        for line in h.get("pipeline_log") or []:
            body.append(f"    {line}")
        if h.get("changes"):
            body.append("  changes:")
            body += [f"    {c}" for c in h["changes"]]
        if h.get("values_diff"):
            body.append("  config diff:")
            body += [f"    {line}" for line in h["values_diff"].splitlines()]
    text = "\n".join([*head, *body])
    if len(text) <= MAX_CHARS:
        return text
    note = "[... cut at 8,000 chars: ask with a lower limit for less ...]"
    return text[: MAX_CHARS - len(note) - 1].rsplit("\n", 1)[0] + "\n" + note


def _age(delta: timedelta) -> str:
    """kubectl's AGE: 45s, 12m, 5h, 3d."""
    s = max(int(delta.total_seconds()), 0)
    if s < 120:
        return f"{s}s"
    if s < 3 * 3600:
        return f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


# ---------------------------------------------------------------- pod_status
_SEL_SET = re.compile(r"^([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)$")
_SEL_EQ = re.compile(r"^([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)$")
_SEL_HAS = re.compile(r"^(!?)\s*([\w./-]+)$")


def _split_selector(selector: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [p for p in [*parts, cur.strip()] if p]


def _selector(
    selector: str, items: list[dict[str, Any]]
) -> tuple[Callable[[dict[str, str]], bool], str]:
    tests: list[Callable[[dict[str, str]], bool]] = []
    note = ""
    keys = {k for it in items for k in it["metadata"]["labels"]}
    apps = {it["metadata"]["labels"].get("app") for it in items}
    for term in _split_selector(selector):
        if m := _SEL_SET.match(term):
            k, op, vals = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            tests.append(lambda lab, k=k, op=op, vals=vals: (lab.get(k) in vals) == (op == "in"))
        elif m := _SEL_EQ.match(term):
            k, op, v = m.groups()
            tests.append(lambda lab, k=k, op=op, v=v: (lab.get(k) == v) == (op != "!="))
        elif m := _SEL_HAS.match(term):
            neg, k = m.groups()
            if not neg and k not in keys and k in apps:  # a bare app name: app=<it>
                note = f"selector {k!r} read as app={k}"
                tests.append(lambda lab, v=k: lab.get("app") == v)
            else:
                tests.append(lambda lab, k=k, neg=neg: (k in lab) != bool(neg))
        else:
            raise ToolError(
                f"cannot parse selector term {term!r}: use key=value, key!=value, "
                "key in (a,b), key notin (a,b), key or !key, comma-separated"
            )
    return (lambda lab: all(t(lab) for t in tests)), note


def _pod_row(it: dict[str, Any], now: datetime) -> tuple[list[str], str]:
    meta, st = it["metadata"], it["status"]
    cs = st["containerStatuses"]
    ready = sum(1 for c in cs if c["ready"])
    restarts = sum(c["restartCount"] for c in cs)
    status = st["phase"]
    for c in cs:
        if "terminated" in c["state"]:
            status = c["state"]["terminated"]["reason"]
        elif "waiting" in c["state"]:
            status = c["state"]["waiting"]["reason"]
    last = [c["lastState"].get("terminated") for c in cs if c["lastState"].get("terminated")]
    rs = str(restarts)
    if last:
        rs += f" ({_age(now - _parse_iso(last[0]['finishedAt']))} ago)"
    row = [
        meta["name"],
        f"{ready}/{len(cs)}",
        status,
        rs,
        _age(now - _parse_iso(meta["creationTimestamp"])),
        st.get("podIP") or "<none>",
        (it["spec"].get("nodeName") or "<none>").split(".")[0],
    ]
    why = []
    if status == "Running":
        for cond in st["conditions"]:
            if cond["type"] == "Ready" and cond["status"] != "True":
                since = _parse_iso(cond["lastTransitionTime"])
                why.append(
                    f"Ready=False since {_short(since)} ({cond.get('reason', '')}: {cond.get('message', '')})"
                )
    for t in last:
        why.append(
            f"{restarts} restarts; last terminated {t['finishedAt']} reason={t['reason']} "
            f"exitCode={t['exitCode']} (ran since {t['startedAt']})"
        )
    return row, "; ".join(why)


@_answers_errors
def _pod_status(namespace: str = "shop-prod", selector: str = "") -> str:
    doc, now = _json("pods.json"), _now()
    items = doc["items"]
    namespaces = sorted({it["metadata"]["namespace"] for it in items})
    ns = str(namespace or "").strip().lower()
    every = ns in ("", "all", "*", "--all-namespaces", "-a")
    if not every and ns not in namespaces:
        raise ToolError(f"no namespace {namespace!r}. Namespaces: {', '.join(namespaces)}")
    scoped = [it for it in items if every or it["metadata"]["namespace"] == ns]
    match, note = _selector(str(selector or ""), scoped)
    chosen = [it for it in scoped if match(it["metadata"]["labels"])]
    cmd = "kubectl get pods " + ("-A" if every else f"-n {ns}")
    cmd += f" -l '{selector}'" if selector else ""
    head = [f"$ {cmd} -o wide    (as of {_short(now)})"]
    head += [f"note: {note}"] if note else []
    if not chosen:
        return "\n".join([*head, "No resources found."])
    headers = ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"]
    rows, details = [], []
    for it in sorted(chosen, key=lambda x: (x["metadata"]["namespace"], x["metadata"]["name"])):
        row, why = _pod_row(it, now)
        if every:
            row.insert(0, it["metadata"]["namespace"])
        rows.append(row)
        if why:
            details.append(f"  {it['metadata']['name']}: {why}")
    if every:
        headers.insert(0, "NAMESPACE")
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    lines = [
        "   ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in [headers, *rows]
    ]
    if details:
        lines += ["", "pods not ready or restarted (from their status):", *details]
    return _cap(
        head,
        lines,
        [],
        lambda n: f"[... {n} lines cut (8,000-char answer cap): use a selector ...]",
    )


# ---------------------------------------------------------------- the tools
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


@tool(parse_docstring=True)
def query_metrics(query: str, start: str = "", end: str = "", step: str = "1m") -> str:
    """Query Prometheus metrics (per-minute series) and get a text table.

    The query is matched against the recorded series by metric name (or the raw name a
    recording rule answers for, e.g. http_server_request_duration_seconds_bucket) and label
    matchers ({service="checkout-api", pod=~"checkout-api-6f7d9-.*"}); one outer
    sum/avg/max/min/count with by/without is evaluated. Functions such as rate or
    histogram_quantile are already applied by the recording rules. An empty or unknown
    query lists the available metrics.

    Args:
        query: PromQL expression, e.g. histogram_quantile(0.99, sum by (le, pod) (rate(http_server_request_duration_seconds_bucket{service="checkout-api"}[1m]))).
        start: Start of a range query (HH:MM, ISO 8601 or e.g. 30m for 30 minutes ago); empty for an instant query.
        end: End of the range, or the time of an instant query; empty for now.
        step: Resolution of a range query, e.g. 1m or 5m.
    """
    return _query_metrics(query, start, end, step)


@tool(parse_docstring=True)
def recent_deploys(service: str, limit: int = 10) -> str:
    """Show the recent deploys (helm history) of a service, with each revision's CI pipeline, canary result, changes and config diff.

    Args:
        service: Release name (e.g. checkout-api), or "all" for the latest deploys across the cluster.
        limit: How many revisions (or, with "all", deploys) to show, most recent first, 1-50.
    """
    return _recent_deploys(service, limit)


@tool(parse_docstring=True)
def pod_status(namespace: str = "shop-prod", selector: str = "") -> str:
    """List pods (kubectl get pods -o wide): readiness, status, restarts, age, IP, node; and why pods are not ready or restarted.

    Args:
        namespace: Namespace (shop-prod, data, ingress-nginx), or "all".
        selector: Label selector, e.g. app=checkout-api or app.kubernetes.io/name in (orders-db,cart-cache); empty for all pods.
    """
    return _pod_status(namespace, selector)


#: The demo agent's tools (``AGENT_TOOLS=offpath.agent.sre_tools:SRE_TOOLS``): all read-only.
SRE_TOOLS: list[BaseTool] = [get_logs, query_metrics, recent_deploys, pod_status]
