"""archive: the originals every compaction removed, full-text searchable (recall)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "archive",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("summary_id", sa.String(200), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("message_id", sa.String(200), nullable=False),
        sa.Column(
            "message",
            sa.dialects.postgresql.JSONB() if postgres else sa.JSON(),
            nullable=False,
        ),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_archive_session_id", "archive", ["session_id", "position"])
    op.create_index("ix_archive_job_id", "archive", ["job_id"])
    op.create_index("ix_archive_created_at", "archive", ["created_at"])
    if postgres:
        op.execute(
            "ALTER TABLE archive ADD COLUMN tsv tsvector "
            "GENERATED ALWAYS AS (to_tsvector('simple', text)) STORED"
        )
        op.execute("CREATE INDEX ix_archive_tsv ON archive USING gin (tsv)")
    else:
        op.execute(
            "CREATE VIRTUAL TABLE archive_fts USING fts5(text, content='archive', "
            "content_rowid='id')"
        )
        op.execute(
            "CREATE TRIGGER archive_ai AFTER INSERT ON archive BEGIN "
            "INSERT INTO archive_fts(rowid, text) VALUES (new.id, new.text); END"
        )
        op.execute(
            "CREATE TRIGGER archive_ad AFTER DELETE ON archive BEGIN "
            "INSERT INTO archive_fts(archive_fts, rowid, text) VALUES ('delete', old.id, old.text); END"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        op.execute("DROP TRIGGER IF EXISTS archive_ad")
        op.execute("DROP TRIGGER IF EXISTS archive_ai")
        op.execute("DROP TABLE IF EXISTS archive_fts")
    op.drop_table("archive")
