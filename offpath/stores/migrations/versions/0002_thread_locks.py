"""thread_locks: locks and job claims for LOCK_BACKEND=database

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "thread_locks",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("token", sa.String(200), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("thread_locks")
