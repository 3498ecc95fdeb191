"""compaction_jobs: reason_code, published, result (leases, reconciler, own records)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("compaction_jobs") as batch:
        batch.add_column(sa.Column("reason_code", sa.String(32), nullable=True))
        batch.add_column(
            sa.Column("published", sa.Boolean(), nullable=False, server_default=sa.true())
        )
        batch.add_column(sa.Column("result", sa.JSON(), nullable=True))
    op.create_index(
        "ix_compaction_jobs_session_created", "compaction_jobs", ["session_id", "created_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_compaction_jobs_session_created", "compaction_jobs")
    with op.batch_alter_table("compaction_jobs") as batch:
        batch.drop_column("result")
        batch.drop_column("published")
        batch.drop_column("reason_code")
