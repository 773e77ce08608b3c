"""Which run resumes each preemption: the claim a resumption makes, once, first come.

The coordinator accepted a run as a preempted run's resumption after reading the victim's
`xirang/resume=pending` tag, and marked it `requested` after: two runs submitted at the same moment
with the same `xirang/parent-run` both read `pending` and both inherited the victim's submit time
and preemptions. A row per (victim, when it was preempted), written in one INSERT, lets exactly one
of them win on any backend.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "resumptions",
        sa.Column("victim", sa.String(length=200), nullable=False),
        sa.Column("preempted_at", sa.Float(), nullable=False),
        sa.Column("run_id", sa.String(length=200), nullable=False),
        sa.Column("claimed_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("victim", "preempted_at"),
    )


def downgrade() -> None:
    op.drop_table("resumptions")
