"""The dashboard's figures: the ``/stats`` body (:func:`dashboard_stats`) and its widgets, each
tagged with its JSON path in that body (:func:`widgets`; a session page's:
:func:`session_widgets`), and how a figure is shown (:func:`fmt`, :func:`fmt_ms`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from offpath.coordination.runtime import Runtime
from offpath.stores.db.tables import JobStatus
from offpath.stores.tenants import Principal
from offpath.stores.usage.stats_body import stats

#: The dashboard's widgets: (JSON path in the ``/stats`` body, label, unit). Paths missing
#: from the body are not shown; numeric fields of ``summary`` not listed here (nor in
#: :data:`FOLDED`) are shown too, after these, labelled by :func:`label_of`. A path ending in
#: ``_ms`` or ``_ms.<stat>`` is a duration: shown rounded, in seconds from 1 s on
#: (:func:`fmt_ms`), its unit in its text.
WIDGETS: tuple[tuple[str, str, str], ...] = (
    ("summary.sessions_compacted", "sessions compacted", ""),
    ("summary.total_chars_compacted", "chars compacted", "chars"),
    (
        "summary.total_tokens_compacted",
        "tokens compacted",
        "by each thread's model, over {summary.tokens_counted_compactions}",
    ),
    ("summary.approx_tokens_saved", "~tokens saved", "chars / 4"),
    ("summary.total_summarizations", "compactions", ""),
    *((f"summary.jobs.{s.value}", f"jobs {s.value}", "") for s in JobStatus),
    ("summary.lag_ms.p50", "compaction lag p50", "over {summary.lag_ms.count}"),
    ("summary.lag_ms.p99", "compaction lag p99", "over {summary.lag_ms.count}"),
    (
        "summary.summarizer_latency_ms.p50",
        "summarizer latency p50",
        "over {summary.summarizer_latency_ms.count}",
    ),
    (
        "summary.summarizer_latency_ms.p99",
        "summarizer latency p99",
        "over {summary.summarizer_latency_ms.count}",
    ),
    ("summary.fallback_maskings", "fallback maskings", "model calls"),
    ("summary.llm_tokens.input", "LLM tokens in", "reported by {summary.llm_tokens.events}"),
    ("summary.llm_tokens.output", "LLM tokens out", "reported by {summary.llm_tokens.events}"),
    (
        "summary.summaries_not_applied.waiting",
        "summaries waiting to apply",
        "of {summary.summaries_not_applied.paid} paid for",
    ),
    (
        "summary.summaries_not_applied.dropped",
        "summaries never applied",
        "of {summary.summaries_not_applied.paid} paid for",
    ),
    ("summary.summaries_not_applied.share", "share not applied", "waiting or never applied"),
)
#: Counts shown inside other widgets' units (``{path}`` above), as "N compactions", not as
#: widgets of their own (a bare "lag ms count" says nothing).
FOLDED = {
    "summary.lag_ms.count",
    "summary.summarizer_latency_ms.count",
    "summary.llm_tokens.events",
    "summary.tokens_counted_compactions",
    "summary.summaries_not_applied.paid",
}
#: The widgets whose value is drawn in a colour when it is not 0: (path suffix, tone).
TONES = ((".failed", "bad"), (".applied", "ok"))


def dashboard_stats(
    rt: Runtime, caller: Principal, since: datetime | None = None
) -> dict[str, Any]:
    """The ``/stats`` body for ``caller`` (all tenants for an admin key), ``since`` a time
    window: :func:`offpath.stores.usage.stats`, as the route computes it."""
    return stats(rt.engine, tenant=None if caller.admin else caller.tenant, since=since)


def flatten(body: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``: every leaf of a JSON object by its dotted path."""
    out: dict[str, Any] = {}
    for key, value in body.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def fmt(value: Any) -> str:
    """How a widget shows a figure: ints with thousands separators, floats to one decimal,
    ``None`` as an em dash (no data yet)."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)


def fmt_ms(value: Any) -> str:
    """A duration in milliseconds as a person reads it: ``"640 ms"`` under a second,
    ``"1.7 s"`` / ``"52.9 s"`` under a minute, ``"3 min 05 s"`` from there, ``"—"`` for
    None (no data yet)."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return fmt(value)
    ms = float(value)
    if round(ms) < 1000:
        return f"{round(ms):,} ms"
    if round(ms / 100) < 600:  # under 60.0 s once rounded to a tenth
        return f"{ms / 1000:.1f} s"
    minutes, seconds = divmod(round(ms / 1000), 60)
    return f"{minutes:,} min {seconds:02d} s"


def is_duration(path: str) -> bool:
    """A ``/stats`` path holding milliseconds: ``..._ms`` or ``..._ms.<stat>`` (not its
    ``count``)."""
    parts = path.split(".")
    return parts[-1].endswith("_ms") or (
        len(parts) > 1 and parts[-2].endswith("_ms") and parts[-1] != "count"
    )


def shown(path: str, value: Any) -> str:
    """The text of a widget for the figure at ``path``: a duration by :func:`fmt_ms`, a
    share (``....share``, 0..1) as a percentage to one decimal (``"3.5%"``), any other
    figure by :func:`fmt`."""
    if is_duration(path):
        return fmt_ms(value)
    if path.endswith(".share") and isinstance(value, float | int) and not isinstance(value, bool):
        return f"{value:.1%}"
    return fmt(value)


def label_of(path: str) -> str:
    """A label for a ``/stats`` path no widget names: its words, ``ms`` dropped (the value
    says its unit), e.g. ``summary.jobs_by_reason.skipped.too_few_messages`` ->
    ``jobs skipped: too few messages``."""
    parts = path.removeprefix("summary.").split(".")
    if parts[0] == "jobs_by_reason" and len(parts) == 3:
        return f"jobs {parts[1]}: {parts[2].replace('_', ' ')}"
    words = [p.removesuffix("_ms").replace("_", " ") for p in parts]
    return " ".join(w for w in words if w)


def tone_of(path: str, value: Any) -> str:
    """``bad`` / ``ok`` for a widget drawn in a colour (:data:`TONES`), "" otherwise: a
    count of failed jobs is red only when it is not 0."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not value:
        return ""
    return next((tone for suffix, tone in TONES if path.endswith(suffix)), "")


def _unit(template: str, flat: Mapping[str, Any]) -> str:
    """A unit text with ``{path}`` filled in as ``N compaction(s)`` (the count at that path)."""
    if "{" not in template:
        return template
    head, _, rest = template.partition("{")
    path, _, tail = rest.partition("}")
    n = flat.get(path)
    if not isinstance(n, int):
        return head.strip()
    return f"{head}{n:,} compaction{'' if n == 1 else 's'}{tail}"


def widget(path: str, label: str, unit: str, flat: Mapping[str, Any]) -> dict[str, Any]:
    """One widget: ``{"path", "label", "unit", "value", "text", "tone"}``."""
    value = flat[path]
    return {
        "path": path,
        "label": label,
        "unit": _unit(unit, flat),
        "value": value,
        "text": shown(path, value),
        "tone": tone_of(path, value),
    }


def widgets(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's widgets for a ``/stats`` body (:func:`widget`), in :data:`WIDGETS`
    order, then any other numeric field of ``summary`` but :data:`FOLDED`."""
    flat = flatten(body)
    known = {path for path, _, _ in WIDGETS} | FOLDED
    out = [widget(path, label, unit, flat) for path, label, unit in WIDGETS if path in flat]
    for path, value in flat.items():
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if path.startswith("summary.") and path not in known and numeric:
            out.append(widget(path, label_of(path), "", flat))
    return out


#: The figures a session's page shows from ``GET /sessions/{id}/stats``: (path, label, unit).
SESSION_WIDGETS: tuple[tuple[str, str, str], ...] = (
    ("summary.total_chars_compacted", "chars compacted", "chars"),
    ("summary.total_tokens_compacted", "tokens compacted", "its model's count"),
    ("summary.lag_ms.p50", "compaction lag p50", ""),
    ("summary.summarizer_latency_ms.p50", "summarizer latency p50", ""),
    ("summary.jobs.failed", "jobs failed", ""),
)


def session_widgets(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """:data:`SESSION_WIDGETS` of one session's ``/stats`` body, as :func:`widgets` makes
    them (those missing from the body left out)."""
    flat = flatten(body)
    return [
        widget(path, label, unit, flat) for path, label, unit in SESSION_WIDGETS if path in flat
    ]
