"""The dashboard's chart: thread size over time for the busiest sessions, from their job
rows and ``sessions`` rows (:func:`size_series`), laid out as SVG coordinates
(:func:`size_chart`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from offpath.compaction.accounting import message_chars
from offpath.compaction.summary import build_summary_message
from offpath.coordination.runtime import Runtime
from offpath.stores.db.job_queries import jobs_of
from offpath.stores.db.tables import EVENTS, JobStatus
from offpath.stores.tenants import SESSIONS, Principal
from offpath.stores.usage.totals import saved_chars_expr

from .listing import activity_of, utc_aware

#: How many sessions the size chart draws.
CHART_SESSIONS = 5


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
    recorded on the job row: ``chars_at_apply``) and the size after (its
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
    for job in jobs_of(rt.engine, session_id):
        if job["chars_before"] is not None:
            events.append((utc_aware(job["created_at"]), 0, job))
        record = (job["result"] or {}).get("record") or {}
        if job["status"] == JobStatus.APPLIED and "chars_removed" in record:
            events.append((utc_aware(job["updated_at"]), 1, job))
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
    events = EVENTS
    saved = sa.cast(saved_chars_expr(), sa.BigInteger)
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
