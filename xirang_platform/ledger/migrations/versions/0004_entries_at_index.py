"""An index on `entries.at`: every scheduling tick reads the entries written in the last
`lend_after_s` (`Ledger.idle_history`); without it that read scans the whole append-only log, which
only grows (`bench/ledger_idle.py` measures the read with and without it).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_entries_at", "entries", ["at"])


def downgrade() -> None:
    op.drop_index("ix_entries_at", table_name="entries")
