"""Allocation placements: the request's fields on each allocation, its GPU slices and node shares.

Rows reserved before this revision keep `placed = false` (their placement was never stored) and
`started_at = reserved_at`; downgrading drops the placements and the added columns.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

NODE = 253
ZERO = sa.text("0")
FALSE = sa.text("false")


def added_columns() -> list[sa.Column]:
    """The columns this revision adds to `allocations` (new objects on each call)."""
    return [
        sa.Column("started_at", sa.Float(), server_default=ZERO, nullable=False),
        sa.Column("submit_time", sa.Float(), server_default=ZERO, nullable=False),
        sa.Column("cpu_milli", sa.Integer(), server_default=ZERO, nullable=False),
        sa.Column("memory_mib", sa.Integer(), server_default=ZERO, nullable=False),
        sa.Column("gpu_memory_mib", sa.Integer(), server_default=ZERO, nullable=False),
        sa.Column("min_compute_level", sa.Integer(), server_default=ZERO, nullable=False),
        sa.Column("gpu_models", sa.Text(), server_default="[]", nullable=False),
        sa.Column("single_node", sa.Boolean(), server_default=FALSE, nullable=False),
        sa.Column("preempted", sa.Integer(), server_default=ZERO, nullable=False),
        sa.Column("placed", sa.Boolean(), server_default=FALSE, nullable=False),
    ]


def upgrade() -> None:
    for column in added_columns():
        op.add_column("allocations", column)
    # What the old rows know: the reservation time stands in for the start and the submit time.
    op.execute("UPDATE allocations SET started_at = reserved_at, submit_time = reserved_at")
    op.create_table(
        "allocation_slices",
        sa.Column("allocation_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(NODE), nullable=False),
        sa.Column("gpu", sa.Integer(), nullable=False),
        sa.Column("milli", sa.Integer(), nullable=False),
        sa.Column("gpu_memory_mib", sa.Integer(), nullable=False),
        sa.CheckConstraint("gpu >= 0 AND milli > 0 AND milli <= 1000", name="ck_allocation_slices_gpu"),
        sa.CheckConstraint("gpu_memory_mib >= 0", name="ck_allocation_slices_memory"),
        sa.ForeignKeyConstraint(["allocation_id"], ["allocations.id"]),
        sa.PrimaryKeyConstraint("allocation_id", "position"),
    )
    op.create_table(
        "allocation_shares",
        sa.Column("allocation_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(NODE), nullable=False),
        sa.Column("cpu_milli", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.Integer(), nullable=False),
        sa.CheckConstraint("cpu_milli >= 0 AND memory_mib >= 0", name="ck_allocation_shares_amounts"),
        sa.ForeignKeyConstraint(["allocation_id"], ["allocations.id"]),
        sa.PrimaryKeyConstraint("allocation_id", "position"),
    )


def downgrade() -> None:
    op.drop_table("allocation_shares")
    op.drop_table("allocation_slices")
    # Plain ALTER TABLE (SQLite >= 3.35 drops columns in place): a batch copy of `allocations` would
    # drop the table that `entries` references, which SQLite's foreign keys refuse.
    for column in reversed(added_columns()):
        op.drop_column("allocations", column.name)
