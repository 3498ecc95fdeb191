"""One session's page: its thread as the model sees it (:func:`thread_items`, only offpath's own
summaries shown as summaries: :func:`own_summaries`), the archived originals each summary
replaced (:func:`originals_by_summary`), its jobs (:func:`job_timeline`), its fixed part
(:func:`fixed_part_of`) and the fingerprint its polling compares (:func:`session_version`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from langchain_core.messages import BaseMessage, messages_from_dict

from offpath.compaction.accounting import content_text, message_chars
from offpath.compaction.planner import thread_budget
from offpath.compaction.summary import fingerprint, is_summary, summary_meta
from offpath.coordination.runtime import Runtime
from offpath.stores import archive
from offpath.stores.db.job_queries import jobs_of
from offpath.stores.db.tables import JOBS, JobStatus
from offpath.stores.tenants import SESSIONS, fixed_part

from .listing import iso_seconds, utc_aware

#: Most archived originals a session page shows (the rest: ``GET /sessions/{id}/archive``).
MAX_ORIGINALS = 2000


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
            sa.select(JOBS.c.job_id, JOBS.c.status, JOBS.c.updated_at, JOBS.c.created_at)
            .where(JOBS.c.session_id == session_id)
            .order_by(JOBS.c.created_at)
        ).all()
    # a queued job turns into the page's "no worker took it" warning as time passes
    waits = [_waited_s(j.created_at) >= _pickup_warn_s() for j in jobs if j.status == "queued"]
    seen = repr((tuple(owner) if owner else None, [tuple(j[:3]) for j in jobs], waits))
    return hashlib.sha256(seen.encode()).hexdigest()[:16]


def own_summaries(rt: Runtime, session_id: str) -> set[tuple[str, str]]:
    """``(message id, fingerprint)`` of every summary offpath's jobs patched into the
    session (their own records, DESIGN.md invariant 10): only these show as summaries."""
    out = set()
    for row in jobs_of(rt.engine, session_id):
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
    as the message it is, its metadata never as offpath's.
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
    kept: Iterable[str | None] = (),
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
                "archived_at": iso_seconds(job_rows[0]["created_at"]),
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


def fixed_part_of(rt: Runtime, session_id: str, messages: Sequence[BaseMessage]) -> dict[str, Any]:
    """``{"fixed": chars, "fixed_warning": text or None}``: the session's fixed part (what no
    compaction removes from its model calls) as the middleware recorded it (a system prompt
    given to the agent is in no checkpoint), else the system messages at the head of
    ``messages``; and, when it alone is over the threshold it is compacted under, the warning
    that names the sizes and the setting to change (None: it is not)."""
    threshold = rt.settings.summarization_threshold_chars
    head = 0
    for m in messages:
        if m.type != "system":
            break
        head += message_chars(m)
    fixed, under = fixed_part(rt.engine, session_id) or (head, threshold)
    settings = rt.settings  # the middleware's threshold, when it compacts under another
    if under != threshold:
        settings = settings.model_copy(update={"summarization_threshold_chars": under})
    budget = thread_budget(settings, fixed)
    return {"fixed": fixed, "fixed_warning": budget.warning() if budget.over else None}


def job_timeline(rt: Runtime, session_id: str) -> list[dict[str, Any]]:
    """The session's jobs, oldest first, as ``GET /sessions/{id}/compactions`` shows them,
    plus ``took_s``: seconds from queued to its last change (to applied, for an applied job),
    ``forced``: an operator asked for it (compact now), and ``revertible``: the latest
    applied compaction of one of offpath's own threads (the page's Revert button)."""
    from ..sessions import job_json

    out = []
    for row in jobs_of(rt.engine, session_id):
        job = job_json(row)
        took = (utc_aware(row["updated_at"]) - utc_aware(row["created_at"])).total_seconds()
        job["took_s"] = round(took, 2)
        job["forced"] = bool((row.get("options") or {}).get("force"))
        job["revertible"] = False
        out.append((job, row))
    # the Revert button: the latest applied compaction, of one of offpath's own threads
    applied = [(job, row) for job, row in out if job["status"] == JobStatus.APPLIED]
    if applied:
        job, row = applied[-1]
        options = row.get("options") or {}
        own = options.get("patch", True) and not options.get("checkpoints")
        job["revertible"] = bool(own and not options.get("checkpoint_ns"))
    return [job for job, _ in out]


def waiting_job(rt: Runtime, jobs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The session's job that is still ``queued`` after
    :data:`~offpath.agent.middleware.PICKUP_WARN_S` (no worker took it), for the page's
    warning: ``job_id``, ``waited_s``, the ``queue`` and ``broker`` (without its password)
    it waits on, and ``published`` (False: the broker has not taken it yet); None if none
    waits so."""
    from kombu.utils.url import sanitize_url

    for job in reversed(jobs):
        if job["status"] != JobStatus.QUEUED or not job.get("created_at"):
            continue
        waited = _waited_s(datetime.fromisoformat(job["created_at"]))
        if waited >= _pickup_warn_s():
            s = rt.settings
            return {
                "job_id": job["job_id"],
                "waited_s": round(waited),
                "queue": s.celery_queue,
                "broker": sanitize_url(s.broker_url),
                "published": job.get("published", True),
            }
    return None


def _waited_s(created_at: datetime) -> float:
    return (datetime.now(UTC) - utc_aware(created_at)).total_seconds()


def _pickup_warn_s() -> float:
    """How long a queued job waits before it counts as not taken (the middleware's)."""
    from offpath.agent.middleware import claims

    return claims.PICKUP_WARN_S


def tokens_of(messages: Sequence[BaseMessage]) -> int | None:
    """The thread's size in tokens, counted offline in ``o200k_base`` (the page shows it
    beside its chars; :mod:`offpath.compaction.tokens`); None without a tokenizer."""
    from offpath.compaction.tokens import TokenCounter

    return TokenCounter(max_cached=0).count(messages)
