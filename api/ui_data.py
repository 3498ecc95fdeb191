"""What the web UI's pages show (:mod:`api.ui`), read in-process from the service layer.

Every function takes the runtime and the caller (a :class:`~offpath.service.tenants.Principal`)
and returns plain dicts and lists for the Jinja2 templates; nothing here renders HTML.
A non-admin caller sees only the sessions its tenant owns, as in the JSON API.

* :func:`dashboard_stats`: the ``/stats`` body (:func:`offpath.service.usage.stats`, as the
  route computes it; its ``recent_failures`` too) and its widgets, each tagged with its
  JSON path in that body;
* :func:`size_chart`: thread size over time for the busiest sessions, as SVG coordinates;
* :func:`session_page`: a page of the sessions list (``GET /sessions``'s
  :func:`offpath.service.usage.list_sessions`);
* :func:`thread_items` / :func:`originals_by_summary`: one session's thread as the model
  sees it, and the archived originals each summary replaced.
"""

from __future__ import annotations

import hashlib
import json
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
from offpath.service import archive, db, usage
from offpath.service.admin import read_session
from offpath.service.runtime import Runtime
from offpath.service.tenants import SESSIONS, Principal

#: The dashboard's widgets: (JSON path in the ``/stats`` body, label, unit). Paths missing
#: from the body are not shown; numeric fields of ``summary`` not listed here are shown too,
#: after these, labelled by their path.
WIDGETS: tuple[tuple[str, str, str], ...] = (
    ("summary.sessions_compacted", "sessions compacted", ""),
    ("summary.approx_tokens_saved", "~tokens saved", "chars / 4"),
    ("summary.total_chars_compacted", "chars compacted", "chars"),
    ("summary.total_summarizations", "compactions", ""),
    *((f"summary.jobs.{s.value}", f"jobs {s.value}", "") for s in db.JobStatus),
    ("summary.lag_ms.p50", "compaction lag p50", "ms"),
    ("summary.lag_ms.p99", "compaction lag p99", "ms"),
    ("summary.summarizer_latency_ms.p50", "summarizer latency p50", "ms"),
    ("summary.summarizer_latency_ms.p99", "summarizer latency p99", "ms"),
    ("summary.fallback_maskings", "fallback maskings", "model calls"),
    ("summary.llm_tokens.input", "LLM tokens in", "as the LLM reported"),
    ("summary.llm_tokens.output", "LLM tokens out", "as the LLM reported"),
)

#: How many sessions the size chart draws.
CHART_SESSIONS = 5
#: Most archived originals a session page shows (the rest: ``GET /sessions/{id}/archive``).
MAX_ORIGINALS = 2000


# --- the dashboard ---------------------------------------------------------------------


def dashboard_stats(
    rt: Runtime, caller: Principal, since: datetime | None = None
) -> dict[str, Any]:
    """The ``/stats`` body for ``caller`` (all tenants for an admin key), ``since`` a time
    window: :func:`offpath.service.usage.stats`, as the route computes it."""
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


def widgets(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's widgets for a ``/stats`` body: ``{"path", "label", "unit", "value",
    "text"}``, in :data:`WIDGETS` order, then any other numeric field of ``summary``."""
    flat = flatten(body)
    known = {path for path, _, _ in WIDGETS}
    out = []
    for path, label, unit in WIDGETS:
        if path in flat:
            out.append(
                {"path": path, "label": label, "unit": unit, "value": flat[path]}
                | {"text": fmt(flat[path])}
            )
    for path, value in flat.items():
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if path.startswith("summary.") and path not in known and numeric:
            label = path.removeprefix("summary.").replace("_", " ").replace(".", " ")
            out.append(
                {"path": path, "label": label, "unit": "", "value": value} | {"text": fmt(value)}
            )
    return out


#: The figures a session's page shows from ``GET /sessions/{id}/stats``: (path, label, unit).
SESSION_WIDGETS: tuple[tuple[str, str, str], ...] = (
    ("summary.total_chars_compacted", "chars compacted", "chars"),
    ("summary.approx_tokens_saved", "~tokens saved", "chars / 4"),
    ("summary.lag_ms.p50", "compaction lag p50", "ms"),
    ("summary.summarizer_latency_ms.p50", "summarizer latency p50", "ms"),
    ("summary.jobs.failed", "jobs failed", ""),
)


def session_widgets(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """:data:`SESSION_WIDGETS` of one session's ``/stats`` body, as :func:`widgets` makes
    them (those missing from the body left out)."""
    flat = flatten(body)
    return [
        {"path": path, "label": label, "unit": unit, "value": flat[path], "text": fmt(flat[path])}
        for path, label, unit in SESSION_WIDGETS
        if path in flat
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


#: The chart's size and margins in SVG user units (px).
CHART_W, CHART_H, PAD_L, PAD_R, PAD_T, PAD_B = 760, 280, 64, 16, 14, 34
COLORS = ("#2563eb", "#db2777", "#059669", "#d97706", "#7c3aed")


def size_chart(rt: Runtime, caller: Principal) -> dict[str, Any]:
    """The dashboard's chart of thread size over time for the busiest sessions, laid out for
    an inline SVG: ``{"width", "height", "lines": [{"session_id", "color", "points" (the
    polyline's "x,y ..."), "dots": [{"x", "y", "title"}]}], "y_ticks": [{"y", "label"}],
    "x_ticks": [...], "threshold": {"y", "label"} | None, "empty": bool}``."""
    series = [size_series(rt, s) for s in busiest_sessions(rt, caller)]
    series = [s for s in series if s.points]
    chart: dict[str, Any] = {"width": CHART_W, "height": CHART_H, "lines": [], "empty": not series}
    chart.update(y_ticks=[], x_ticks=[], threshold=None, left=PAD_L, bottom=CHART_H - PAD_B)
    chart["right"] = CHART_W - PAD_R
    if not series:
        return chart
    threshold = rt.settings.summarization_threshold_chars
    times = [p[0] for s in series for p in s.points]
    t0, t1 = min(times), max(times)
    span = max((t1 - t0).total_seconds(), 0.001)
    top = max(max(p[1] for s in series for p in s.points), threshold, 1) * 1.08
    plot_w, plot_h = CHART_W - PAD_L - PAD_R, CHART_H - PAD_T - PAD_B

    def x(t: datetime) -> float:
        return round(PAD_L + plot_w * (t - t0).total_seconds() / span, 1)

    def y(chars: float) -> float:
        return round(PAD_T + plot_h * (1 - chars / top), 1)

    for i, s in enumerate(series):
        color = COLORS[i % len(COLORS)]
        coords = [(x(t), y(c), f"{s.session_id}: {c:,} chars {what}") for t, c, what in s.points]
        chart["lines"].append(
            {
                "session_id": s.session_id,
                "color": color,
                "points": " ".join(f"{a},{b}" for a, b, _ in coords),
                "dots": [{"x": a, "y": b, "title": t} for a, b, t in coords],
            }
        )
    for k in range(5):
        chars = top * k / 4
        chart["y_ticks"].append({"y": y(chars), "label": f"{int(chars / 1000):,}k"})
    for k, anchor in enumerate(("start", "middle", "end")):
        t = t0 + (t1 - t0) * k / 2
        label = t.strftime("%H:%M:%S UTC") if k == 0 else f"+{(t - t0).total_seconds():,.1f} s"
        chart["x_ticks"].append({"x": x(t), "label": label, "anchor": anchor})
    if threshold:
        chart["threshold"] = {"y": y(threshold), "label": f"threshold {threshold:,}"}
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
    the next page: what ``GET /sessions`` answers (:func:`offpath.service.usage.list_sessions`:
    ``session_id``, ``tenant``, ``messages``, ``chars``, ``compactions``, ``last_activity``,
    ``jobs_in_flight``). Raises :class:`~offpath.service.usage.BadCursor`."""
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


def thread_of(rt: Runtime, session_id: str) -> list[BaseMessage]:
    """The thread's messages as the model sees them ([] if there is none): from offpath's
    checkpointer, or for a thread of a team's own agent (the middleware), from the agent's
    checkpointer (:func:`offpath.service.admin.read_session`)."""
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
) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """The archived originals of ``session_id``, grouped by the summary in the thread that
    replaced them, then by compaction (oldest first): ``{summary_id: [{"job_id",
    "archived_at", "items" (:func:`thread_items` of its originals)}]}``, and how many
    originals the archive holds in all (at most :data:`MAX_ORIGINALS` are read).

    A later compaction folds the earlier summary in and keeps its id, so each summary
    usually owns every compaction; rows whose summary is no longer in the thread go to
    the first summary."""
    rows, total = archive.read(rt.engine, session_id, limit=MAX_ORIGINALS)
    ids = list(summary_ids)
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
        out[target].append(
            {
                "job_id": job_id,
                "archived_at": _iso(job_rows[0]["created_at"]),
                "items": thread_items(messages, own),
                "count": len(messages),
            }
        )
    return out, total


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
