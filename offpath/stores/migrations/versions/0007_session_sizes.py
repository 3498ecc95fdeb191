"""session sizes and threshold crossings: the session list sorts by size without reading
checkpoints; compaction lag is measured from the crossing

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("messages", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("chars", sa.Integer(), nullable=True))
    op.create_index("ix_sessions_last_activity", "sessions", ["last_activity"])
    with op.batch_alter_table("compaction_jobs") as batch:
        batch.add_column(sa.Column("crossed_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_compaction_jobs_updated_at", "compaction_jobs", ["updated_at"])


def downgrade() -> None:
    op.drop_index("ix_compaction_jobs_updated_at", "compaction_jobs")
    with op.batch_alter_table("compaction_jobs") as batch:
        batch.drop_column("crossed_at")
    op.drop_index("ix_sessions_last_activity", "sessions")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("chars")
        batch.drop_column("messages")
