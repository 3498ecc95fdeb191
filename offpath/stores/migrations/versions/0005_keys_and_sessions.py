"""api_keys and sessions: API keys (hashed) and which tenant owns each session

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "sessions",
        sa.Column("session_id", sa.String(128), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_activity", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_sessions_tenant", "sessions", ["tenant"])
    # sessions that had jobs before keys existed belong to the "default" tenant
    op.execute(
        "INSERT INTO sessions (session_id, tenant, created_at, last_activity) "
        "SELECT session_id, 'default', min(created_at), max(updated_at) "
        "FROM compaction_jobs GROUP BY session_id"
    )


def downgrade() -> None:
    op.drop_table("sessions")
    op.drop_table("api_keys")
