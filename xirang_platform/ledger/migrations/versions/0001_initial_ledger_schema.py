"""Initial ledger schema: tenants, projects, accounts, allocations, append-only entries.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

NAME = 64
KEY = 129
LIVE = sa.text("state <> 'released'")


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("name", sa.String(NAME), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "projects",
        sa.Column("name", sa.String(NAME), nullable=False),
        sa.Column("tenant", sa.String(NAME), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["tenant"], ["tenants.name"]),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_index("ix_projects_tenant", "projects", ["tenant"])
    op.create_table(
        "accounts",
        sa.Column("key", sa.String(KEY), nullable=False),
        sa.Column("tenant", sa.String(NAME), nullable=False),
        sa.Column("project", sa.String(NAME), nullable=True),
        sa.Column("quota", sa.Integer(), nullable=True),
        sa.Column("used", sa.Integer(), nullable=False),
        sa.Column("reserved", sa.Integer(), nullable=False),
        sa.Column("borrowed", sa.Integer(), nullable=False),
        sa.CheckConstraint("quota IS NULL OR quota >= 0", name="ck_accounts_quota"),
        sa.CheckConstraint("used >= 0 AND reserved >= 0 AND borrowed >= 0", name="ck_accounts_balances"),
        sa.ForeignKeyConstraint(["project"], ["projects.name"]),
        sa.ForeignKeyConstraint(["tenant"], ["tenants.name"]),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_index("ix_accounts_tenant", "accounts", ["tenant"])
    op.create_table(
        "allocations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.String(200), nullable=False),
        sa.Column("tenant", sa.String(NAME), nullable=False),
        sa.Column("project", sa.String(NAME), nullable=False),
        sa.Column("tier", sa.String(32), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("milli_per_gpu", sa.Integer(), nullable=False),
        sa.Column("milli", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("borrowed", sa.Boolean(), nullable=False),
        sa.Column("reserved_at", sa.Float(), nullable=False),
        sa.Column("committed_at", sa.Float(), nullable=True),
        sa.Column("returned_at", sa.Float(), nullable=True),
        sa.Column("released_at", sa.Float(), nullable=True),
        sa.Column("end_cause", sa.String(64), nullable=True),
        sa.CheckConstraint("state IN ('reserved', 'committed', 'released')", name="ck_allocations_state"),
        sa.CheckConstraint("milli >= 0", name="ck_allocations_milli"),
        sa.ForeignKeyConstraint(["project"], ["projects.name"]),
        sa.ForeignKeyConstraint(["tenant"], ["tenants.name"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_allocations_request_id", "allocations", ["request_id"])
    op.create_index("ix_allocations_tenant", "allocations", ["tenant"])
    op.create_index(
        "ux_allocations_live_request",
        "allocations",
        ["request_id"],
        unique=True,
        postgresql_where=LIVE,
        sqlite_where=LIVE,
    )
    op.create_table(
        "entries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("op", sa.String(32), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("account", sa.String(KEY), nullable=False),
        sa.Column("bucket", sa.String(16), nullable=False),
        sa.Column("amount", sa.Integer(), nullable=False),
        sa.Column("allocation_id", sa.Integer(), nullable=True),
        sa.Column("request_id", sa.String(200), nullable=True),
        sa.Column("cause", sa.String(64), nullable=False),
        sa.Column("details", sa.Text(), server_default="{}", nullable=False),
        sa.CheckConstraint("bucket IN ('quota', 'used', 'reserved', 'borrowed')", name="ck_entries_bucket"),
        sa.CheckConstraint(
            "kind IN ('reserve', 'commit', 'release', 'borrow', 'return', 'preempt', 'quota')", name="ck_entries_kind"
        ),
        sa.ForeignKeyConstraint(["account"], ["accounts.key"]),
        sa.ForeignKeyConstraint(["allocation_id"], ["allocations.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    for column in ("account", "allocation_id", "kind", "op"):
        op.create_index(f"ix_entries_{column}", "entries", [column])


def downgrade() -> None:
    op.drop_table("entries")
    op.drop_table("allocations")
    op.drop_table("accounts")
    op.drop_table("projects")
    op.drop_table("tenants")
