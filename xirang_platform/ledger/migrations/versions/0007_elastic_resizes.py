"""Elastic training (DESIGN.md section 11): the range an allocation may be resized within, and the
`resize` entry kind.

An allocation row keeps its request's elastic range (`gpus_min`, `gpus_max`, `gpus_step`; NULL for
a fixed request), so the snapshot built from the ledger sees the run as elastic again. A resize
releases the allocation's row and writes the new size as a new row of the same request, with one
`resize` entry per account for each (the old size given back, the new one charged), in one
transaction.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_KINDS = ("reserve", "commit", "release", "borrow", "return", "preempt", "quota")


def _kinds(*extra: str) -> str:
    return f"kind IN ({', '.join(repr(k) for k in (*_KINDS, *extra))})"


def upgrade() -> None:
    for column in ("gpus_min", "gpus_max", "gpus_step"):
        op.add_column("allocations", sa.Column(column, sa.Integer(), nullable=True))
    # Nothing references `entries`, so a batch copy (SQLite) keeps every other table.
    with op.batch_alter_table("entries", recreate="auto") as batch:
        batch.drop_constraint("ck_entries_kind", type_="check")
        batch.create_check_constraint("ck_entries_kind", _kinds("resize"))


def downgrade() -> None:
    # Resize entries cannot be kept under the old constraint: they are history of a feature going away.
    op.execute("DELETE FROM entries WHERE kind = 'resize'")
    with op.batch_alter_table("entries", recreate="auto") as batch:
        batch.drop_constraint("ck_entries_kind", type_="check")
        batch.create_check_constraint("ck_entries_kind", _kinds())
    for column in ("gpus_step", "gpus_max", "gpus_min"):
        op.drop_column("allocations", column)
