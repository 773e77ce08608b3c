"""When each allocation's run last reported a checkpoint (issue 23): victim cost is the work since it.

A run reports checkpoints through `GpuPoolResource.checkpointed` and each asset it materializes
counts as one; the tick reads the column into `Allocation.checkpointed_at`, so preempting the run
loses only the GPU-seconds since then. Rows from before this revision reported none (NULL).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("allocations", sa.Column("checkpointed_at", sa.Float(), nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE, as in 0002: a batch copy would drop the table `entries` references.
    op.drop_column("allocations", "checkpointed_at")
