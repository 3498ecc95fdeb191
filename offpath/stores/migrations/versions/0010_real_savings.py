"""real savings: each job row records the thread's size just before its compaction was applied
(``compaction_jobs.chars_at_apply``: the dashboard's size chart draws real peaks), and each
compaction's usage event its real reduction (``metadata.chars_saved``: the thread's size
before less its size after, so that a summary folded again into the next one is not counted
as saved twice).

Rows written before this revision are filled from the job's own record where it holds the
sizes (``chars_before``, ``chars_after``; else ``chars_removed`` less ``summary_chars``).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def _json(value: object) -> dict:
    if isinstance(value, str):  # a driver that hands JSON back as text
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


def saved_of(record: dict) -> int | None:
    """As :func:`offpath.stores.db.chars_saved` (kept here: a migration does not import the
    code it precedes)."""
    before, after = record.get("chars_before"), record.get("chars_after")
    if isinstance(before, int) and isinstance(after, int):
        return max(0, before - after)
    removed, summary = record.get("chars_removed"), record.get("summary_chars")
    if isinstance(removed, int) and isinstance(summary, int):
        return max(0, removed - summary)
    return None


def upgrade() -> None:
    with op.batch_alter_table("compaction_jobs") as batch:
        batch.add_column(sa.Column("chars_at_apply", sa.Integer(), nullable=True))
    conn = op.get_bind()
    jobs = sa.table(
        "compaction_jobs",
        sa.column("job_id", sa.String),
        sa.column("status", sa.String),
        sa.column("result", sa.JSON),
        sa.column("chars_at_apply", sa.Integer),
    )
    events = sa.table(
        "usage_events",
        sa.column("id", sa.Integer),
        sa.column("job_id", sa.String),
        sa.column("metadata", sa.JSON),
    )
    records: dict[str, dict] = {}
    for job_id, result in conn.execute(
        sa.select(jobs.c.job_id, jobs.c.result).where(jobs.c.status.in_(("applied", "reverted")))
    ):
        record = _json(_json(result).get("record"))
        if not record:
            continue
        records[job_id] = record
        if isinstance(record.get("chars_before"), int):
            conn.execute(
                sa.update(jobs)
                .where(jobs.c.job_id == job_id)
                .values(chars_at_apply=record["chars_before"])
            )
    for event_id, job_id, metadata in conn.execute(
        sa.select(events.c.id, events.c.job_id, events.c.metadata).where(
            events.c.job_id.is_not(None)
        )
    ):
        meta = _json(metadata)
        if not meta.get("summarization") or "chars_saved" in meta:
            continue
        saved = saved_of({**meta, **records.get(job_id, {})})
        if saved is not None:
            conn.execute(
                sa.update(events)
                .where(events.c.id == event_id)
                .values(metadata={**meta, "chars_saved": saved})
            )


def downgrade() -> None:
    with op.batch_alter_table("compaction_jobs") as batch:
        batch.drop_column("chars_at_apply")
