"""session kinds: a team's own agent's threads (the middleware) are sessions too, listed,
shown and compactable like the API's, per tenant

``sessions.kind``: ``api`` (offpath's own checkpointer) or ``own agent`` (the agent's own
checkpointer, at ``sessions.checkpoints``). Threads of own agents compacted before this
revision (job rows, no ``sessions`` row) become sessions of tenant ``default``.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(
            sa.Column("kind", sa.String(length=16), nullable=False, server_default="api")
        )
        batch.add_column(sa.Column("checkpoints", sa.Text(), nullable=True))
    # the threads only the middleware knew: their job rows, with no sessions row
    op.execute(
        """
        INSERT INTO sessions (session_id, tenant, created_at, last_activity, kind)
        SELECT session_id, 'default', MIN(created_at), MAX(updated_at), 'own agent'
        FROM compaction_jobs
        WHERE session_id NOT IN (SELECT session_id FROM sessions)
        GROUP BY session_id
        """
    )


def downgrade() -> None:
    op.execute("DELETE FROM sessions WHERE kind = 'own agent'")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("checkpoints")
        batch.drop_column("kind")
