"""session fixed parts: what no compaction removes from a thread's model calls (its system
prompt) and the threshold it is compacted under, so that ``/readyz`` and the session's page
can say when the fixed part alone is over the threshold

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("fixed_chars", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("threshold_chars", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("threshold_chars")
        batch.drop_column("fixed_chars")
