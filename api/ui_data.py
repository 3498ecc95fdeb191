"""What the web UI's pages show (:mod:`api.ui`), read in-process from the service layer.

Every function takes the runtime and the caller (a :class:`~offpath.stores.tenants.Principal`)
and returns plain dicts and lists for the Jinja2 templates; nothing here renders HTML.
A non-admin caller sees only the sessions its tenant owns, as in the JSON API.

* :func:`dashboard_stats`: the ``/stats`` body (:func:`offpath.stores.usage.stats`, as the
  route computes it; its ``recent_failures`` too) and its widgets, each tagged with its
  JSON path in that body;
* :func:`size_chart`: thread size over time for the busiest sessions, as SVG coordinates;
* :func:`session_page`: a page of the sessions list (``GET /sessions``'s
  :func:`offpath.stores.usage.list_sessions`);
* :func:`thread_items` / :func:`originals_by_summary`: one session's thread as the model
  sees it, and the archived originals each summary replaced.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from langchain_core.messages import BaseMessage, messages_from_dict

from offpath.compaction.accounting import content_text, message_chars
from offpath.compaction.summary import (
    build_summary_message,
    fingerprint,
    is_summary,
    summary_meta,
)
from offpath.coordination.admin import read_session
from offpath.coordination.runtime import Runtime
from offpath.stores import archive, db, usage
from offpath.stores.tenants import SESSIONS, Principal

#: The dashboard's widgets: (JSON path in the ``/stats`` body, label, unit). Paths missing
#: from the body are not shown; numeric fields of ``summary`` not listed here (nor in
#: :data:`FOLDED`) are shown too, after these, labelled by :func:`label_of`. A path ending in
#: ``_ms`` or ``_ms.<stat>`` is a duration: shown rounded, in seconds from 1 s on
#: (:func:`fmt_ms`), its unit in its text.
WIDGETS: tuple[tuple[str, str, str], ...] = (
    ("summary.sessions_compacted", "sessions compacted", ""),
    ("summary.approx_tokens_saved", "~tokens saved", "chars / 4"),
    ("summary.total_chars_compacted", "chars compacted", "chars"),
    ("summary.total_summarizations", "compactions", ""),
    *((f"summary.jobs.{s.value}", f"jobs {s.value}", "") for s in db.JobStatus),
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
)
#: Counts shown inside other widgets' units (``{path}`` above), as "N compactions", not as
#: widgets of their own (a bare "lag ms count" says nothing).
FOLDED = {
    "summary.lag_ms.count",
    "summary.summarizer_latency_ms.count",
    "summary.llm_tokens.events",
}
#: The widgets whose value is drawn in a colour when it is not 0: (path suffix, tone).
TONES = ((".failed", "bad"), (".applied", "ok"))

#: How many sessions the size chart draws.
CHART_SESSIONS = 5
#: Most archived originals a session page shows (the rest: ``GET /sessions/{id}/archive``).
MAX_ORIGINALS = 2000


# --- the dashboard ---------------------------------------------------------------------


def dashboard_stats(
    rt: Runtime, caller: Principal, since: datetime | None = None
) -> dict[str, Any]:
    """The ``/stats`` body for ``caller`` (all tenants for an admin key), ``since`` a time
    window: :func:`offpath.stores.usage.stats`, as the route computes it."""
    return usage.stats(rt.engine, tenant=None if caller.admin else caller.tenant, since=since)


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
    """The text of a widget for the figure at ``path``: a duration by :func:`fmt_ms`, any
    other figure by :func:`fmt`."""
    return fmt_ms(value) if is_duration(path) else fmt(value)


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
    ("summary.approx_tokens_saved", "~tokens saved", "chars / 4"),
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


def _owned(caller: Principal, column: Any) -> Any:
    """A WHERE clause: ``column`` (a session id) is one of the caller's (True for an admin)."""
    if caller.admin:
        return sa.true()
    return column.in_(sa.select(SESSIONS.c.session_id).where(SESSIONS.c.tenant == caller.tenant))


@dataclass
class Series:
    """One session's line in the size chart: ``points`` are ``(time, chars, what)``."""

    session_id: str
    points: list[tuple[datetime, int, str]] = field(default_factory=list)


def summary_chars(prepared: Mapping[str, Any]) -> int:
    """Size in chars (:func:`message_chars`) of the summary message a prepared compaction
    patches in (its text, prefix line and quoted request)."""
    message = build_summary_message(
        message_id="size",
        summary_text=str(prepared.get("summary_text") or ""),
        replaced_ids=[],
        replaced_chars=0,
        summarizer="",
        compactions=1,
        request=prepared.get("request"),
    )
    return message_chars(message)


def size_series(rt: Runtime, session_id: str) -> Series:
    """A thread's size over time (chars), from its job rows and its ``sessions`` row (no
    checkpoint is read: the dashboard polls this).

    The points: the session's start (empty, when its first writer took it); each job's
    size when it was queued (``chars_before``); for each applied compaction, two points at
    the time it was applied (its row's last update): the size just before (its peak,
    recorded on the job row: ``chars_at_apply``, issue 21, item 6) and the size after (its
    record's ``chars_after``); last, the thread's size after offpath's last write to it,
    at its last activity. Growth between points is drawn as a straight line: only these
    sizes are known.

    A compaction applied before migration 0010 with no size in its record is drawn at the
    least it can have been: the largest of the size the job planned on
    (``prepared.total_chars``), every size known since the previous compaction and, for a
    job not forced by an operator, the threshold; after it, that less the chars removed
    plus the summary's own.
    """
    threshold = rt.settings.summarization_threshold_chars
    events: list[tuple[datetime, int, dict[str, Any]]] = []  # (time, 0 queued / 1 applied, row)
    for job in db.jobs_of(rt.engine, session_id):
        if job["chars_before"] is not None:
            events.append((_utc(job["created_at"]), 0, job))
        record = (job["result"] or {}).get("record") or {}
        if job["status"] == db.JobStatus.APPLIED and "chars_removed" in record:
            events.append((_utc(job["updated_at"]), 1, job))
    events.sort(key=lambda e: (e[0], e[1]))
    points: list[tuple[datetime, int, str]] = []
    known = 0  # the largest size known since the last compaction
    for at, applied, job in events:
        short = job["job_id"][:8]
        if not applied:
            known = max(known, int(job["chars_before"]))
            points.append((at, int(job["chars_before"]), f"job {short} queued"))
            continue
        result = job["result"]
        record = result["record"]
        prepared = result.get("prepared") or {}
        peak = job.get("chars_at_apply")
        if peak is None:
            peak = record.get("chars_before")
        if peak is not None:
            before, what = int(peak), "applied: before"
        else:  # an old row: the least it can have been
            forced = bool((job.get("options") or {}).get("force"))
            planned = int(prepared.get("total_chars") or 0)
            before, what = max(planned, known, 0 if forced else threshold), "applied: at least"
        if record.get("chars_after") is not None:
            after = int(record["chars_after"])
        else:
            after = max(0, before - int(record["chars_removed"]) + summary_chars(prepared))
        points.append((at, before, f"job {short} {what}"))
        points.append((at, after, f"job {short} applied: after"))
        known = after
    started, last, chars = activity_of(rt, session_id)
    if started is not None and (not points or started <= points[0][0]):
        points.insert(0, (started, 0, "session started"))
    if chars is not None and points:
        now = max(last or points[-1][0], points[-1][0])
        points.append((now, chars, "now"))
    return Series(session_id, points)


def busiest_sessions(rt: Runtime, caller: Principal, n: int = CHART_SESSIONS) -> list[str]:
    """The ``n`` sessions with the most chars saved (usage events), most first."""
    events = db.EVENTS
    saved = sa.cast(usage.saved_chars_expr(), sa.BigInteger)
    q = (
        sa.select(events.c.session_id, sa.func.sum(saved).label("chars"))
        .where(_owned(caller, events.c.session_id))
        .group_by(events.c.session_id)
        .order_by(sa.desc("chars"), events.c.session_id)
        .limit(n)
    )
    with rt.engine.connect() as conn:
        return [r.session_id for r in conn.execute(q)]


#: The chart's size and margins in SVG user units (px). The SVG is as wide as its card (a
#: phone scrolls it sideways rather than shrink its text below reading size).
CHART_W, CHART_H, PAD_L, PAD_R, PAD_T, PAD_B = 1000, 300, 56, 16, 24, 30
COLORS = ("#2563eb", "#db2777", "#059669", "#d97706", "#7c3aed")


def nice_ticks(top: float, most: int = 5) -> list[int]:
    """Ticks for an axis from 0 to at least ``top``: 0 and multiples of a round step (1, 2,
    2.5 or 5 x a power of ten), at most ``most`` steps, the last at or above ``top``
    (``top`` 97,857 -> 0, 20k, ... 100k)."""
    top = max(float(top), 1.0)
    raw = top / most
    power = 10 ** math.floor(math.log10(raw))
    step = max(next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw), 1)
    return [round(step * k) for k in range(math.ceil(top / step - 1e-9) + 1)]


def tick_label(chars: int) -> str:
    """``0``, ``500``, ``2.5k``, ``100k``, ``1.5M``: an axis tick in chars."""
    if chars >= 1_000_000:
        return f"{chars / 1_000_000:g}M"
    if chars >= 1000:
        return f"{chars / 1000:g}k"
    return str(chars)


def steps_of(points: Sequence[tuple[datetime, int, str]]) -> list[int]:
    """The x step of each point of a series: one step per event (the session's start, a job
    queued, a compaction applied, now), the two points of a compaction (just before, after)
    sharing theirs, as any points at the same time do."""
    out: list[int] = []
    for k, (at, _, _) in enumerate(points):
        out.append(0 if k == 0 else out[-1] + (at != points[k - 1][0]))
    return out


def size_chart(rt: Runtime, caller: Principal) -> dict[str, Any]:
    """The dashboard's chart of thread size over time for the busiest sessions, laid out for
    an inline SVG: ``{"width", "height", "lines": [{"session_id", "color", "points" (the
    polyline's "x,y ..."), "dots": [{"x", "y", "title"}], "now", "over" (its size now over
    the threshold, as a multiple of it, or None)}], "y_ticks": [{"y", "label"}], "threshold":
    {"y", "label"} | None, "empty": bool}``.

    Sizes on round ticks (:func:`nice_ticks`) up to the largest size or the threshold. Each
    session runs from its start (left) to now (right), one step per event
    (:func:`steps_of`): a session replayed in a second and one that ran for days are drawn
    alike, and the time of each point is in its title."""
    series = [size_series(rt, s) for s in busiest_sessions(rt, caller)]
    series = [s for s in series if s.points]
    chart: dict[str, Any] = {"width": CHART_W, "height": CHART_H, "lines": [], "empty": not series}
    chart.update(y_ticks=[], threshold=None, left=PAD_L, bottom=CHART_H - PAD_B, top=PAD_T)
    chart["right"] = CHART_W - PAD_R
    if not series:
        return chart
    threshold = rt.settings.summarization_threshold_chars
    highest = max(max(p[1] for s in series for p in s.points), threshold, 1)
    ticks = nice_ticks(highest)
    if threshold and ticks[-1] - threshold < 0.06 * ticks[-1]:  # room for its label
        ticks.append(ticks[-1] + ticks[1])
    top = ticks[-1]
    plot_w, plot_h = CHART_W - PAD_L - PAD_R, CHART_H - PAD_T - PAD_B

    def y(chars: float) -> float:
        return round(PAD_T + plot_h * (1 - chars / top), 1)

    for i, s in enumerate(series):
        color = COLORS[i % len(COLORS)]
        steps = steps_of(s.points)
        last = max(steps[-1], 1)
        coords = [
            (
                round(PAD_L + plot_w * k / last, 1),
                y(c),
                f"{s.session_id}: {c:,} chars {what} ({t.strftime('%Y-%m-%d %H:%M:%S')} UTC)",
            )
            for k, (t, c, what) in zip(steps, s.points, strict=True)
        ]
        now = s.points[-1][1]
        chart["lines"].append(
            {
                "session_id": s.session_id,
                "color": color,
                "points": " ".join(f"{a},{b}" for a, b, _ in coords),
                "dots": [{"x": a, "y": b, "title": t} for a, b, t in coords],
                "now": now,
                "over": round(now / threshold, 1) if threshold and now > threshold else None,
            }
        )
    chart["y_ticks"] = [{"y": y(c), "label": tick_label(c)} for c in ticks]
    if threshold:
        chart["threshold"] = {"y": y(threshold), "label": f"threshold {threshold:,} chars"}
    return chart


# --- sessions -------------------------------------------------------------------------

#: The sessions list's sort keys, each with its default order.
SORTS = {"last_activity": "desc", "chars": "desc", "compactions": "desc", "session_id": "asc"}
#: Sessions per page of the list.
PAGE_SIZE = 50


def session_page(
    rt: Runtime,
    caller: Principal,
    q: str = "",
    sort: str = "last_activity",
    order: str = "",
    cursor: str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the caller's sessions whose id contains ``q``, sorted by ``sort`` (one of
    :data:`SORTS`; ``order``: asc or desc, default per :data:`SORTS`), and the cursor of
    the next page: what ``GET /sessions`` answers (:func:`offpath.stores.usage.list_sessions`:
    ``session_id``, ``tenant``, ``messages``, ``chars``, ``compactions``, ``last_activity``,
    ``jobs_in_flight``). Raises :class:`~offpath.stores.usage.BadCursor`."""
    sort = sort if sort in SORTS else "last_activity"
    desc = (order or SORTS[sort]) == "desc"
    return usage.list_sessions(
        rt.engine,
        None if caller.admin else caller.tenant,
        q=q,
        sort=("-" if desc else "") + sort,
        limit=PAGE_SIZE,
        cursor=cursor,
    )


def session_counts(rt: Runtime, caller: Principal) -> dict[str, int]:
    """``{"sessions", "compacted"}``: how many sessions the caller's list holds (all pages,
    no search) and how many of them have an applied compaction, as the list counts them
    (:func:`offpath.stores.usage.list_sessions`' ``compactions``). The dashboard's
    "sessions compacted" (all time) is the second figure."""
    applied = (
        sa.select(db.JOBS.c.session_id)
        .where(db.JOBS.c.status == db.JobStatus.APPLIED.value)
        .distinct()
        .subquery()
    )
    mine = sa.true() if caller.admin else SESSIONS.c.tenant == caller.tenant
    q = (
        sa.select(sa.func.count(), sa.func.count(applied.c.session_id))
        .select_from(SESSIONS.outerjoin(applied, applied.c.session_id == SESSIONS.c.session_id))
        .where(mine)
    )
    with rt.engine.connect() as conn:
        sessions, compacted = conn.execute(q).one()
    return {"sessions": int(sessions), "compacted": int(compacted)}


def thread_of(rt: Runtime, session_id: str) -> list[BaseMessage]:
    """The thread's messages as the model sees them ([] if there is none): from offpath's
    checkpointer, or for a thread of a team's own agent (the middleware), from the agent's
    checkpointer (:func:`offpath.coordination.admin.read_session`)."""
    return read_session(rt, session_id)[1].messages


def activity_of(
    rt: Runtime, session_id: str
) -> tuple[datetime | None, datetime | None, int | None]:
    """When the session was created and last written to, and its size in chars after
    offpath's last write to it (its ``sessions`` row: no checkpoint is read; Nones for a
    thread offpath does not own)."""
    with rt.engine.connect() as conn:
        row = conn.execute(
            sa.select(SESSIONS.c.created_at, SESSIONS.c.last_activity, SESSIONS.c.chars).where(
                SESSIONS.c.session_id == session_id
            )
        ).first()
    if row is None:
        return None, None, None
    return _utc(row.created_at), _utc(row.last_activity), row.chars


# --- one session ----------------------------------------------------------------------


def session_version(rt: Runtime, session_id: str) -> str:
    """A short fingerprint of what a session page shows, from two indexed reads and no
    checkpoint: its ``sessions`` row (last activity, messages and chars, which every write
    offpath makes to the thread updates, a compaction's patch included) and its job rows
    (id, status, last change; archived originals come with an applied job). The page's
    polling re-renders the thread only when it changed."""
    with rt.engine.connect() as conn:
        owner = conn.execute(
            sa.select(SESSIONS.c.last_activity, SESSIONS.c.messages, SESSIONS.c.chars).where(
                SESSIONS.c.session_id == session_id
            )
        ).first()
        jobs = conn.execute(
            sa.select(db.JOBS.c.job_id, db.JOBS.c.status, db.JOBS.c.updated_at)
            .where(db.JOBS.c.session_id == session_id)
            .order_by(db.JOBS.c.created_at)
        ).all()
    seen = repr((tuple(owner) if owner else None, [tuple(j) for j in jobs]))
    return hashlib.sha256(seen.encode()).hexdigest()[:16]


def own_summaries(rt: Runtime, session_id: str) -> set[tuple[str, str]]:
    """``(message id, fingerprint)`` of every summary offpath's jobs patched into the
    session (their own records, DESIGN.md invariant 10): only these show as summaries."""
    out = set()
    for row in db.jobs_of(rt.engine, session_id):
        record = (row.get("result") or {}).get("record") or {}
        if record.get("summary_id") and record.get("summary_sha"):
            out.add((str(record["summary_id"]), str(record["summary_sha"])))
    return out


def thread_items(
    messages: Sequence[BaseMessage], own: set[tuple[str, str]] | None = None
) -> list[dict[str, Any]]:
    """``messages`` as the session page shows them: one item per message but tool results,
    which are folded into the call they answer (an orphan result stays an item).

    An item: ``{"id", "type", "text", "chars", "name", "summary": bool, "meta"
    (a summary's metadata), "calls": [{"id", "name", "args" (JSON text), "result"
    (text or None), "result_chars", "status"}]}``. With ``own`` (:func:`own_summaries`),
    only offpath's own summaries are ``summary``: a message a client marked as one shows
    as the message it is, its metadata never as offpath's (issue 20, item 8).
    """
    results: dict[str, BaseMessage] = {}
    for m in messages:
        if m.type == "tool":
            results.setdefault(str(getattr(m, "tool_call_id", "")), m)
    folded: set[int] = set()
    items = []
    for m in messages:
        if m.type == "tool" and id(m) in folded:
            continue
        calls = []
        for call in getattr(m, "tool_calls", None) or []:
            result = results.get(str(call.get("id")))
            if result is not None:
                folded.add(id(result))
            calls.append(
                {
                    "id": call.get("id"),
                    "name": call.get("name"),
                    "args": json.dumps(call.get("args"), indent=1, ensure_ascii=False, default=str),
                    "result": None if result is None else content_text(result.content),
                    "result_chars": None if result is None else message_chars(result),
                    "status": None if result is None else getattr(result, "status", None),
                }
            )
        items.append(
            {
                "id": m.id,
                "type": m.type,
                "text": content_text(m.content),
                "chars": message_chars(m),
                "name": m.name,
                "summary": (mine := _own(m, own)),
                "meta": dict(summary_meta(m)) if mine else {},
                "calls": calls,
            }
        )
    return items


def _own(message: BaseMessage, own: set[tuple[str, str]] | None) -> bool:
    if not is_summary(message):
        return False
    return own is None or (str(message.id), fingerprint(message)) in own


def originals_by_summary(
    rt: Runtime,
    session_id: str,
    summary_ids: Iterable[str],
    own: set[tuple[str, str]] | None = None,
    kept: Iterable[str] = (),
) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """The archived originals of ``session_id``, grouped by the summary in the thread that
    replaced them, then by compaction (oldest first): ``{summary_id: [{"job_id",
    "archived_at", "items" (:func:`thread_items` of its originals), "count", "replaced_ids",
    "shortened_ids"}]}``, and how many originals the archive holds in all (at most
    :data:`MAX_ORIGINALS` are read). Results shortened as they arrived are archived under
    no job (``job_id`` "").

    A compaction archives the messages it replaced, the kept tool results it shortened
    (their ids, ``kept``: the thread's messages but its summaries, are still in the thread)
    and the summary it folded in (neither: offpath's own text): ``replaced_ids`` and
    ``shortened_ids`` list the first two (:func:`originals_totals` adds them up).

    A later compaction folds the earlier summary in and keeps its id, so each summary
    usually owns every compaction; rows whose summary is no longer in the thread go to
    the first summary."""
    rows, total = archive.read(rt.engine, session_id, limit=MAX_ORIGINALS)
    ids = list(summary_ids)
    still = set(kept)
    per_job: dict[str, list[dict[str, Any]]] = {}
    owner: dict[str, str] = {}
    for r in rows:
        per_job.setdefault(r["job_id"], []).append(r)
        owner.setdefault(r["job_id"], r["summary_id"] if r["summary_id"] in ids else "")
    out: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
    if not ids:
        return out, total
    for job_id, job_rows in per_job.items():
        target = owner[job_id] or ids[0]
        messages = messages_from_dict([r["message"] for r in job_rows])
        mine = [str(m.id) for m in messages if not is_summary(m)]
        out[target].append(
            {
                "job_id": job_id,
                "archived_at": _iso(job_rows[0]["created_at"]),
                "items": thread_items(messages, own),
                "count": len(messages),
                "replaced_ids": [i for i in mine if i not in still],
                "shortened_ids": [i for i in mine if i in still],
            }
        )
    return out, total


def originals_totals(groups: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """What a summary's archived originals (its groups from :func:`originals_by_summary`)
    add up to: ``replaced`` (distinct messages no longer in the thread), ``shortened``
    (distinct kept tool results whose originals are archived) and ``compactions`` (the
    groups of a job; results shortened as they arrived are archived under no job)."""
    replaced = {i for g in groups for i in g["replaced_ids"]}
    shortened = {i for g in groups for i in g["shortened_ids"]} - replaced
    compactions = sum(1 for g in groups if g["job_id"])
    return {"replaced": len(replaced), "shortened": len(shortened), "compactions": compactions}


def job_timeline(rt: Runtime, session_id: str) -> list[dict[str, Any]]:
    """The session's jobs, oldest first, as ``GET /sessions/{id}/compactions`` shows them,
    plus ``took_s``: seconds from queued to its last change (to applied, for an applied job),
    ``forced``: an operator asked for it (compact now), and ``revertible``: the latest
    applied compaction of one of offpath's own threads (the page's Revert button; issue 19)."""
    from .sessions import job_json

    out = []
    for row in db.jobs_of(rt.engine, session_id):
        job = job_json(row)
        took = (_utc(row["updated_at"]) - _utc(row["created_at"])).total_seconds()
        job["took_s"] = round(took, 2)
        job["forced"] = bool((row.get("options") or {}).get("force"))
        job["revertible"] = False
        out.append((job, row))
    # the Revert button: the latest applied compaction, of one of offpath's own threads
    applied = [(job, row) for job, row in out if job["status"] == db.JobStatus.APPLIED]
    if applied:
        job, row = applied[-1]
        options = row.get("options") or {}
        own = options.get("patch", True) and not options.get("checkpoints")
        job["revertible"] = bool(own and not options.get("checkpoint_ns"))
    return [job for job, _ in out]


def _utc(value: datetime) -> datetime:
    """SQLite hands back naive datetimes: they are UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _iso(value: datetime | None) -> str | None:
    return None if value is None else _utc(value).isoformat(timespec="seconds")
