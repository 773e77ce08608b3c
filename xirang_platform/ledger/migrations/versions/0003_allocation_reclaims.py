"""Reclaims on each allocation: when its request was last reclaimed and how many times.

The scheduler lets a reclaimed request borrow again only after a back-off that doubles with every
reclaim (`SchedulerConfig.reclaim_backoff_s`); without these columns a tick that rebuilds its state
from the ledger would forget them and let the request borrow straight back into the same reclaim.
Rows from before this revision were never reclaimed as far as the ledger knows (NULL, 0).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("allocations", sa.Column("reclaimed_at", sa.Float(), nullable=True))
    op.add_column("allocations", sa.Column("reclaims", sa.Integer(), server_default=sa.text("0"), nullable=False))


def downgrade() -> None:
    # Plain ALTER TABLE, as in 0002: a batch copy would drop the table `entries` references.
    op.drop_column("allocations", "reclaims")
    op.drop_column("allocations", "reclaimed_at")
