"""``query_metrics``'s implementation: a small PromQL matcher over the per-minute series of
``metrics.json`` (metric names and aliases, label matchers, one outer aggregation) and the
text tables of its answers."""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from langchain_core.tools import tool

from offpath.agent.sre_tools.fixtures import (
    ToolError,
    answers_errors,
    cap_answer,
    duration_s,
    fixture_now,
    parse_time,
    read_fixture,
    short_time,
)

MAX_POINTS = 2000  # samples per series a range query may ask for
LOOKBACK_S = 119  # a sample counts for an evaluation time up to this much later


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


@answers_errors
def _query_metrics(query: str, start: str = "", end: str = "", step: str = "1m") -> str:
    query = str(query or "").strip()
    doc = read_fixture("metrics.json")
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
    t_start, t_end = parse_time(start, "start"), parse_time(end, "end")
    try:
        step_s = int(duration_s(str(step or "1m")))
    except ValueError:
        raise ToolError(f"step={step!r} is not a duration such as 30s, 1m, 5m") from None
    notes = []
    if step_s < 60:
        step_s = 60
        notes.append("the fixtures hold one sample a minute: step raised to 1m")
    instant = t_start is None
    if instant:
        at = t_end or fixture_now()
        evals = [int(at.timestamp())]
    else:
        stop = t_end or fixture_now()
        if t_start >= stop:
            raise ToolError(f"start ({short_time(t_start)}) is not before end ({short_time(stop)})")
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
        head.append(f"instant query at {short_time(datetime.fromtimestamp(evals[0], UTC))}")
    else:
        head.append(
            f"range: {short_time(datetime.fromtimestamp(evals[0], UTC))} .. "
            f"{short_time(datetime.fromtimestamp(evals[-1], UTC))}  step={step_s}s"
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
        return cap_answer(
            head, legend, [], lambda n: f"[... {n} lines cut (8,000-char answer cap)]"
        )
    return cap_answer(
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
