"""archive kinds: a row is an original a compaction removed ("removed") or the original of a
tool result offpath shortened in place ("shortened": as it arrived, or in a compaction). A result
shortened as it arrived has no job: its rows have an empty job id.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("archive") as batch:
        batch.add_column(sa.Column("kind", sa.String(16), nullable=False, server_default="removed"))
    op.create_index("ix_archive_message_id", "archive", ["session_id", "message_id"])


def downgrade() -> None:
    op.drop_index("ix_archive_message_id", "archive")
    with op.batch_alter_table("archive") as batch:
        batch.drop_column("kind")
