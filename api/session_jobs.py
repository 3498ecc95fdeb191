"""What the session routes (:mod:`api.sessions`) show of a thread's compaction jobs: each job
as ``GET /sessions/{id}/compactions`` shows it (:func:`job_json`), who holds the thread
(:func:`lease_json`), the failure backoff (:func:`backoff_json`), and the pace of the
server-sent events of ``GET /sessions/{id}/events`` (:mod:`api.streams` serves them).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from offpath.coordination.runtime import Runtime
from offpath.stores.db.job_queries import failures_in_a_row
from offpath.stores.db.tables import JobStatus, chars_saved, now_utc
from offpath.stores.leases.claims import failure_backoff_s

#: What a reverted compaction shows of its loss report: its originals are back in the thread,
#: so nothing left the model's view.
NOTHING_LOST: dict[str, Any] = {
    "messages_removed": 0,
    "chars_removed": 0,
    "results_shortened": 0,
    "chars_shortened": 0,
    "facts": 0,
    "facts_lost": 0,
    "lost": [],
    "ground_truth": None,
    "stated": {"facts": 0, "lost": 0, "recallable": 0},
    "tool_only": {"facts": 0, "lost": 0, "recallable": 0},
}


def job_json(r: dict[str, Any]) -> dict[str, Any]:
    """One ``compaction_jobs`` row as ``/compactions`` shows it. A reverted compaction (its
    originals put back) shows nothing saved and nothing lost: 0 messages and chars removed,
    0 chars saved, a loss report of zeros (:data:`NOTHING_LOST`)."""
    result = {
        **((r["result"] or {}).get("usage") or {}),
        **((r["result"] or {}).get("record") or {}),
    }
    applied = r["status"] in (JobStatus.APPLIED, JobStatus.REVERTED)
    reverted = r["status"] == JobStatus.REVERTED
    if reverted:
        result = {**result, "messages_removed": 0, "chars_removed": 0}
        if isinstance(result.get("loss"), dict) and "error" not in result["loss"]:
            result["loss"] = NOTHING_LOST
    return {
        "job_id": r["job_id"],
        "status": r["status"],
        "reason": r["reason"],
        "reason_code": r["reason_code"],
        "attempts": r["attempts"],
        "published": r["published"],
        "chars_when_queued": r["chars_before"],
        "chars_at_apply": r.get("chars_at_apply") if applied else None,
        "messages_removed": result.get("messages_removed") if applied else None,
        "chars_removed": result.get("chars_removed") if applied else None,
        "chars_saved": (0 if reverted else chars_saved(result))
        if applied and "chars_removed" in result
        else None,
        "summarizer": result.get("summarizer"),
        "latency_ms": result.get("latency_ms"),
        "loss": result.get("loss") if applied else None,
        "created_at": r["created_at"].isoformat(),
        "updated_at": r["updated_at"].isoformat(),
    }


def lease_json(rt: Runtime, session_id: str) -> dict[str, Any] | None:
    """Who holds the thread's claim now (None: free, or the lock store is unreachable)."""
    try:
        holder = rt.leases.holder(session_id)
    except Exception:
        return None
    if holder is None:
        return None
    return {"job_id": holder.job_id, "state": holder.state.name.lower()}


def backoff_json(rt: Runtime, session_id: str) -> dict[str, Any] | None:
    """The failure backoff after jobs failed in a row, while it runs."""
    failures, last = failures_in_a_row(rt.engine, session_id)
    s = rt.settings
    seconds = failure_backoff_s(failures, s.failure_backoff_s, s.failure_backoff_max_s)
    if not seconds or last is None:
        return None
    until = last + timedelta(seconds=seconds)
    if until <= now_utc():
        return None
    return {"failures_in_a_row": failures, "seconds": seconds, "until": until.isoformat()}


#: How often (s) the event streams' poller reads the watched threads' job rows (one query).
EVENTS_POLL_S = 0.5
#: A comment line after this long (s) without an event, so that proxies keep the stream open.
EVENTS_KEEPALIVE_S = 15.0
#: A stream ends after this long (s); the client reconnects (``retry``) and is told where the
#: thread stands: no connection outlives a deploy by more than this.
EVENTS_MAX_S = 300.0
#: How long (ms) a client waits before it reconnects (the stream's ``retry`` field).
EVENTS_RETRY_MS = 2000
