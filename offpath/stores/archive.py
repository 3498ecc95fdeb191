"""The archive: every message a compaction removed, kept unchanged and searchable.

Each row is one removed message (``messages_to_dict`` form), with its thread, the
job and the summary that replaced it, and its position in the thread when it
was removed; or (``kind = "shortened"``) the original of a tool result offpath
shortened in place: as it arrived (no job: an empty job id; written with the update that
shortens it), or in a compaction (with the job, like its removed messages). Rows are written in the same transaction as the job's own record of
the summary, before the patch (:func:`store_record`), so a patch is never
applied without its originals archived; rows of a job that never applied are
not shown (its record may be replaced, or it ends ``stale``). DESIGN.md
invariant 1, "nothing is lost", means: in the thread, or in the archive
(invariant 12).

Search (``recall``, :mod:`offpath.stores.search`) uses the database's own full-text index:
SQLite FTS5, or a PostgreSQL ``tsvector`` column with a GIN index (``simple`` configuration,
so identifiers and error codes are kept as they are).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from langchain_core.messages import BaseMessage, messages_from_dict, messages_to_dict
from sqlalchemy.engine import Engine
from sqlmodel import JSON, Column, Field, SQLModel

from offpath.compaction.accounting import content_text
from offpath.compaction.fields import message_field
from offpath.stores.db.engine import json_bytes
from offpath.stores.db.tables import JOBS, JobStatus
from offpath.stores.values import REFUSED_ERRORS, refused_value

#: Archive kinds: a message a compaction removed, the original of a result shortened in place.
REMOVED, SHORTENED = "removed", "shortened"


class ArchivedMessage(SQLModel, table=True):
    """One original a compaction removed."""

    __tablename__ = "archive"

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(max_length=128)
    job_id: str = Field(max_length=64)
    summary_id: str = Field(max_length=200)
    position: int
    message_id: str = Field(max_length=200)
    message: dict[str, Any] = Field(sa_column=Column("message", JSON, nullable=False))
    text: str
    created_at: datetime = Field(sa_type=sa.DateTime(timezone=True))
    #: "removed" (a compaction removed it) or "shortened" (the original of a result offpath
    #: shortened in place). Migration 0008.
    kind: str = Field(default=REMOVED, max_length=16)


# the model's table (SQLModel sets ``__table__`` on a table model but does not declare it)
ARCHIVE: sa.Table = ArchivedMessage.__table__  # type: ignore[attr-defined]
#: Most chars a recall answer holds.
RECALL_MAX_CHARS = 4_000


def searchable(message: BaseMessage) -> str:
    """What full-text search sees of a message: its text, tool calls and tool name."""
    parts = [content_text(message.content)]
    for call in message_field(message, "tool_calls") or []:
        parts.append(f"{call.get('name')} {call.get('args')}")
    if message.name:
        parts.append(message.name)
    return "\n".join(p for p in parts if p)


def rows_for(
    session_id: str,
    job_id: str,
    summary_id: str,
    thread: Sequence[BaseMessage],
    removed: Sequence[str],
    shortened: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Archive rows for the messages ``removed`` (ids) of ``thread``, and for those it keeps
    but ``shortened`` (their originals, as the thread holds them now)."""
    now = datetime.now(UTC)
    kinds = {**{str(i): SHORTENED for i in shortened}, **{str(i): REMOVED for i in removed}}
    rows = []
    for position, m in enumerate(thread):
        kind = kinds.get(str(m.id))
        if kind is not None:
            rows.append(
                {
                    "session_id": session_id,
                    "job_id": job_id,
                    "summary_id": summary_id if kind == REMOVED else str(m.id),
                    "position": position,
                    "message_id": str(m.id),
                    "message": messages_to_dict([m])[0],
                    "text": searchable(m),
                    "created_at": now,
                    "kind": kind,
                }
            )
    return rows


def store_shortened(
    engine: Engine, session_id: str, originals: Sequence[tuple[int, BaseMessage]]
) -> None:
    """Archive the originals of results shortened in place outside a compaction
    (``(position, message)``), before the update that shortens them is written. A result
    archived already keeps its first row, the original: shortening it again (smaller) or a
    model call tried again writes nothing more. Only rows that stay count (those shown,
    :func:`_applied`): the rows of a job not applied (yet) are rewritten, from the thread as
    it is then, each time the job is applied, or never shown if it is not; an original
    found only there is stored again here."""
    if not originals:
        return
    now = datetime.now(UTC)
    ids = [str(m.id) for _, m in originals]
    with engine.begin() as conn:
        have: set[str] = set(
            conn.scalars(
                sa.select(ARCHIVE.c.message_id).where(
                    ARCHIVE.c.session_id == session_id,
                    ARCHIVE.c.message_id.in_(ids),
                    _applied(originals=True),
                )
            )
        )
        rows = [
            {
                "session_id": session_id,
                "job_id": "",
                "summary_id": str(m.id),
                "position": position,
                "message_id": str(m.id),
                "message": messages_to_dict([m])[0],
                "text": searchable(m),
                "created_at": now,
                "kind": SHORTENED,
            }
            for position, m in originals
            if str(m.id) not in have
        ]
        with refusing(rows):
            insert_rows(conn, rows)


@contextmanager
def refusing(rows: Sequence[dict[str, Any]], result: Any = None) -> Iterator[None]:
    """Raise :class:`~offpath.stores.values.Unstorable` naming the value when the database
    refuses a write of ``rows`` (archive rows) or ``result`` (a job's stored result) because
    one holds a value no store keeps (a NUL character on PostgreSQL); any other error as it
    is."""
    try:
        yield
    except REFUSED_ERRORS as exc:
        named = [(f"message {_quoted(r['message_id'])}", r["message"]) for r in rows]
        named += [(f"archived text of message {_quoted(r['message_id'])}", r["text"]) for r in rows]
        found = refused_value([*named, ("the job's stored result", result)])
        if found is None:
            raise
        raise found from exc


def _quoted(message_id: Any) -> str:
    """A message id as a job's reason names it: quoted, escaped, at most 60 chars."""
    text = json.dumps(str(message_id))
    return text if len(text) <= 60 else text[:57] + '..."'


def shorten_archived(
    engine: Engine,
    session_id: str,
    messages: Sequence[BaseMessage],
    caps: dict[str, int],
    *,
    recall: bool = True,
    offset: int = 0,
    floor: int | None = None,
) -> list[BaseMessage]:
    """:func:`offpath.compaction.shorten.shorten_each`, its originals archived first
    (:func:`store_shortened`). Raises the database's error, and then nothing is shortened.
    Returns ``messages`` itself when nothing is to shorten."""
    from offpath.compaction.shorten import shorten_each

    out, originals = shorten_each(messages, caps, recall=recall, offset=offset, floor=floor)
    if originals:
        store_shortened(engine, session_id, originals)
    return out


#: :func:`store_record`'s statements, made once and their values bound at each call: making
#: a statement, and the key it is looked up by among the compiled ones, costs more of a job's
#: CPU than running it.
_RECORD = (
    sa.update(JOBS)
    .where(JOBS.c.job_id == sa.bindparam("b_job"))
    .values(
        result=sa.bindparam("b_result", type_=JOBS.c.result.type),
        updated_at=sa.bindparam("b_now", type_=JOBS.c.updated_at.type),
    )
)
_UNARCHIVE = sa.delete(ARCHIVE).where(ARCHIVE.c.job_id == sa.bindparam("b_job"))
_ARCHIVE_ROWS = sa.insert(ARCHIVE)
#: The row fields :func:`insert_rows` writes (the table's columns but ``id`` and ``tsv``).
_ROW_FIELDS = (
    "session_id", "job_id", "summary_id", "position", "message_id", "message", "text",
    "created_at", "kind",
)  # fmt: skip
_ROW_KEYS = frozenset(_ROW_FIELDS)
#: On PostgreSQL, a job's rows in one statement with one parameter: their JSON, which the
#: server reads into rows (in the order given: ``id`` follows it). An executemany binds and
#: sends each row's nine values as a statement of its own: about twice the client's CPU.
_ARCHIVE_JSON_ROWS = sa.text(
    f"INSERT INTO archive ({', '.join(_ROW_FIELDS)}) "
    f"SELECT {', '.join(_ROW_FIELDS)} FROM ROWS FROM (json_to_recordset(CAST(:rows AS json)) AS ("
    "session_id text, job_id text, summary_id text, position integer, message_id text, "
    "message jsonb, text text, created_at timestamptz, kind text"
    ")) WITH ORDINALITY AS r(" + ", ".join(_ROW_FIELDS) + ", n) ORDER BY n"
)


def _plain_row(row: dict[str, Any]) -> bool:
    """``row`` holds the archive's columns but ``id`` (no more), its ``created_at`` aware."""
    at = row.keys() == _ROW_KEYS and row["created_at"]
    return isinstance(at, datetime) and at.tzinfo is not None


def insert_rows(conn: sa.Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert archive ``rows`` (:func:`rows_for`'s dicts: each column but ``id``, an aware
    ``created_at``) in their order: on PostgreSQL as one JSON parameter
    (:data:`_ARCHIVE_JSON_ROWS`), else (SQLite, other dicts, or values JSON does not carry:
    the driver's own error then names them, as :func:`refusing` expects) by an executemany.
    The same rows either way."""
    if not rows:
        return
    if conn.dialect.name == "postgresql" and all(_plain_row(r) for r in rows):
        try:  # the JSON the message column's own serializer writes, of all the rows at once
            data = json_bytes([{**r, "created_at": r["created_at"].isoformat()} for r in rows])
        except (TypeError, ValueError):
            pass  # a value JSON does not carry: bound row by row, its error named as before
        else:
            text = data.decode() if isinstance(data, bytes) else data
            conn.execute(_ARCHIVE_JSON_ROWS, {"rows": text})
            return
    conn.execute(_ARCHIVE_ROWS, list(rows))


def store_record(
    engine: Engine, job_id: str, result: dict[str, Any], rows: list[dict[str, Any]]
) -> None:
    """Write a job's record of the summary it is about to patch in, and the originals it
    removes, in one transaction (before the patch). Raises
    :class:`~offpath.stores.values.Unstorable` naming a value the database refused."""
    with refusing(rows, result), engine.begin() as conn:
        conn.execute(_RECORD, {"b_job": job_id, "b_result": result, "b_now": datetime.now(UTC)})
        conn.execute(_UNARCHIVE, {"b_job": job_id})
        insert_rows(conn, rows)


def store_loss(engine: Engine, job_id: str, summary_id: str, loss: dict[str, Any]) -> bool:
    """Put ``loss`` (a loss report) in the stored record of job ``job_id``, made after
    the swap (the middleware's in-run apply, off the model call's path). False (nothing
    written) when the job's stored record is no longer that of summary ``summary_id``: another
    apply of the job stored its own, with its own report."""
    with engine.begin() as conn:
        result = conn.execute(
            sa.select(JOBS.c.result).where(JOBS.c.job_id == job_id).with_for_update()
        ).scalar()
        record = (result or {}).get("record") or {}
        if record.get("summary_id") != summary_id:
            return False
        conn.execute(
            sa.update(JOBS)
            .where(JOBS.c.job_id == job_id)
            .values(result={**(result or {}), "record": {**record, "loss": loss}})
        )
    return True


def _applied(originals: bool = False) -> Any:
    """Rows that are shown: those of applied jobs, and results shortened as they arrived.
    ``originals``: also the results a compaction shortened that was reverted since: the result is
    whole in the thread again, but when it is shortened anew no second
    row is written (a result keeps its first row, :func:`store_shortened`), so its original
    must stay readable."""
    shown = sa.or_(
        ARCHIVE.c.job_id == "",
        ARCHIVE.c.job_id.in_(
            sa.select(JOBS.c.job_id).where(JOBS.c.status == JobStatus.APPLIED.value)
        ),
    )
    if not originals:
        return shown
    reverted = sa.select(JOBS.c.job_id).where(JOBS.c.status == JobStatus.REVERTED.value)
    return sa.or_(shown, sa.and_(ARCHIVE.c.kind == SHORTENED, ARCHIVE.c.job_id.in_(reverted)))


def read(
    engine: Engine,
    session_id: str,
    offset: int = 0,
    limit: int = 100,
    summary_id: str | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """A page of a thread's archived originals (oldest compaction first), and how many in all;
    ``summary_id``: only those the summary with that message id replaced."""
    where: tuple[Any, ...] = (ARCHIVE.c.session_id == session_id, _applied())
    if summary_id is not None:
        where = (*where, ARCHIVE.c.summary_id == summary_id)
    q = (
        sa.select(
            ARCHIVE.c.message_id,
            ARCHIVE.c.job_id,
            ARCHIVE.c.summary_id,
            ARCHIVE.c.position,
            ARCHIVE.c.message,
            ARCHIVE.c.created_at,
        )
        .where(*where)
        .order_by(ARCHIVE.c.id)
        .offset(offset)
        .limit(limit)
    )
    with engine.connect() as conn:
        total = conn.execute(sa.select(sa.func.count()).where(*where)).scalar() or 0
        return [dict(r._mapping) for r in conn.execute(q)], int(total)


def job_rows(engine: Engine, session_id: str, job_id: str) -> list[dict[str, Any]]:
    """What compaction job ``job_id`` archived of the thread, whatever the job's status: each
    row's ``kind`` (:data:`REMOVED` or :data:`SHORTENED`), ``position`` (its index in the thread
    then), ``message_id`` and ``message`` (``messages_to_dict`` form), in thread order."""
    q = (
        sa.select(ARCHIVE.c.kind, ARCHIVE.c.position, ARCHIVE.c.message_id, ARCHIVE.c.message)
        .where(ARCHIVE.c.session_id == session_id, ARCHIVE.c.job_id == job_id)
        .order_by(ARCHIVE.c.position, ARCHIVE.c.id)
    )
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(q)]


def originals_of(
    rows: Iterable[dict[str, Any]],
) -> tuple[list[tuple[int, BaseMessage]], list[BaseMessage]]:
    """:func:`job_rows`' rows as messages, in thread order: the removed ones with their
    positions then (``(position, message)``), and the results shortened in place. What a
    revert puts back, and what a fanned run hands its caller."""
    removed: list[tuple[int, BaseMessage]] = []
    shortened: list[BaseMessage] = []
    for row in rows:
        (message,) = messages_from_dict([row["message"]])
        if row["kind"] == REMOVED:
            removed.append((row["position"], message))
        elif row["kind"] == SHORTENED:
            shortened.append(message)
    return removed, shortened


def original(engine: Engine, session_id: str, message_id: str) -> dict[str, Any] | None:
    """The original of a thread's message by its id (``messages_to_dict`` form), or None: not
    archived, or its compaction never applied. The *first* row archived under the id: the
    message as it first was, never a later summary or shortened copy that reused its id
    (a summary takes the id of the first message it replaces)."""
    return _firsts(engine, session_id, [message_id]).get(message_id)


def originals(
    engine: Engine, session_id: str, message_ids: Sequence[str]
) -> dict[str, BaseMessage]:
    """The originals of a thread's messages by id, each as :func:`original` reads it, in one
    query: ``{message id: message}``, those not archived (or whose compaction never applied)
    left out."""
    found = _firsts(engine, session_id, message_ids)
    return {i: messages_from_dict([m])[0] for i, m in found.items()}


def _firsts(engine: Engine, session_id: str, message_ids: Sequence[str]) -> dict[str, Any]:
    """The first row archived under each of ``message_ids`` that is shown (or the original
    of a result shortened by a reverted job), ``{message id: message dict}``: one query."""
    if not message_ids:
        return {}
    q = (
        sa.select(ARCHIVE.c.message_id, ARCHIVE.c.message)
        .where(
            ARCHIVE.c.session_id == session_id,
            ARCHIVE.c.message_id.in_(list(dict.fromkeys(message_ids))),
            _applied(originals=True),
        )
        .order_by(ARCHIVE.c.id)
    )
    found: dict[str, Any] = {}
    with engine.connect() as conn:
        for row in conn.execute(q):
            found.setdefault(str(row.message_id), row.message)
    return found


def ids_cited(engine: Engine, session_id: str, prefix: str) -> list[str]:
    """The archived message ids of a thread that are UUIDs starting with ``prefix`` (how a
    summary cites them: :func:`offpath.compaction.summary.cite`), at most two (two: the
    prefix is ambiguous). ``prefix``: hex chars only (the caller checks)."""
    q = (
        sa.select(ARCHIVE.c.message_id)
        .where(
            ARCHIVE.c.session_id == session_id,
            ARCHIVE.c.message_id.startswith(prefix + "-", autoescape=True),
            _applied(),
        )
        .distinct()
        .limit(2)
    )
    with engine.connect() as conn:
        rows: Iterable[tuple[Any, ...]] = conn.execute(q)
        return [str(r) for (r,) in rows]


def purge(engine: Engine, days: int) -> int:
    """Delete archived originals older than ``days`` (``ARCHIVE_RETENTION_DAYS``; 0: keep)."""
    if days <= 0:
        return 0
    cutoff = datetime.now(UTC) - timedelta(days=days)
    with engine.begin() as conn:
        return conn.execute(sa.delete(ARCHIVE).where(ARCHIVE.c.created_at < cutoff)).rowcount


def forget(engine: Engine, session_id: str) -> int:
    """Delete a thread's archive (its session is deleted)."""
    with engine.begin() as conn:
        return conn.execute(sa.delete(ARCHIVE).where(ARCHIVE.c.session_id == session_id)).rowcount
