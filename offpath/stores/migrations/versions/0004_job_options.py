"""compaction_jobs.options (how a job may apply its compaction); fallback_maskings

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("compaction_jobs") as batch:
        batch.add_column(sa.Column("options", sa.JSON(), nullable=True))
    op.create_table(
        "fallback_maskings",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("results", sa.Integer(), nullable=False),
        sa.Column("chars", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_fallback_maskings_session_id", "fallback_maskings", ["session_id"])


def downgrade() -> None:
    op.drop_table("fallback_maskings")
    with op.batch_alter_table("compaction_jobs") as batch:
        batch.drop_column("options")
