"""The ledger's tables (sqlmodel), on their own metadata so migrations compare against exactly these.

- `tenants`, `projects`: a project name is unique across the ledger, so it lives in exactly one tenant.
- `accounts`: one row per tenant (`key` = tenant) and per project (`key` = tenant/project), with
  `quota` (None for a project without a limit of its own), `used`, `reserved`, `borrowed` in milli-GPU.
- `allocations`: which request holds what, in-quota or borrowed, and its state; with the request's
  fields, so the row is the scheduler's `Allocation` again when read back.
- `allocation_slices`, `allocation_shares`: where an allocation sits (migration 0002): one row per GPU
  slice (node, GPU index, milli, GPU memory) and one per node share (CPU, memory), in placement
  order, written in the transaction that writes the allocation and its entries.
- `resumptions`: which run resumes each preemption (migration 0006), one row per (victim, time it
  was preempted), so two runs claiming the same victim at once cannot both inherit from it.
- `allocations` of elastic requests keep their range (migration 0007); a resize releases the row and
  writes the new size as a new row of the same request, with `resize` entries for both.
- `entries`: append-only; every balance change is one row (`bucket` += `amount`), so a balance is the
  sum of its entries. The rows one operation writes share an `op` id and are written in the same
  transaction as the balances.
"""

from __future__ import annotations

from enum import StrEnum

from sqlalchemy import CheckConstraint, Column, Index, MetaData, Table, Text, text
from sqlalchemy.orm import registry
from sqlmodel import Field, SQLModel

NAME_LENGTH = 64
KEY_LENGTH = 2 * NAME_LENGTH + 1
NODE_LENGTH = 253  # a Kubernetes node name (a DNS subdomain)

ledger_registry = registry(metadata=MetaData())


class EntryKind(StrEnum):
    """What an entry records."""

    RESERVE = "reserve"  # in-quota capacity admitted, launch not yet confirmed
    COMMIT = "commit"  # launch confirmed: reserved -> used
    RELEASE = "release"  # capacity given back (run ended, launch failed)
    BORROW = "borrow"  # capacity admitted past the cap on idle units
    RETURN = "return"  # a borrowed allocation turned in-quota
    PREEMPT = "preempt"  # capacity taken back from a victim
    QUOTA = "quota"  # an account's quota set (created or changed)
    RESIZE = "resize"  # an elastic run restarted at a new size: the old size given back, the new one charged


class Bucket(StrEnum):
    """Which balance column an entry changes."""

    QUOTA = "quota"
    USED = "used"
    RESERVED = "reserved"
    BORROWED = "borrowed"


class AllocState(StrEnum):
    """An allocation's life: reserved -> committed -> released (or reserved -> released)."""

    RESERVED = "reserved"
    COMMITTED = "committed"
    RELEASED = "released"


def _in(column: str, values: type[StrEnum]) -> str:
    return f"{column} IN ({', '.join(repr(v.value) for v in values)})"


class LedgerModel(SQLModel, registry=ledger_registry):
    """Base of the ledger's tables (their own metadata, apart from any other sqlmodel tables)."""


class Tenant(LedgerModel, table=True):
    """A tenant: who pays."""

    __tablename__ = "tenants"

    name: str = Field(primary_key=True, max_length=NAME_LENGTH)
    created_at: float


class Project(LedgerModel, table=True):
    """A project, in exactly one tenant."""

    __tablename__ = "projects"

    name: str = Field(primary_key=True, max_length=NAME_LENGTH)
    tenant: str = Field(foreign_key="tenants.name", index=True, max_length=NAME_LENGTH)
    created_at: float


class Account(LedgerModel, table=True):
    """The balances of one tenant or project, in milli-GPU."""

    __tablename__ = "accounts"
    __table_args__ = (
        CheckConstraint("quota IS NULL OR quota >= 0", name="ck_accounts_quota"),
        CheckConstraint("used >= 0 AND reserved >= 0 AND borrowed >= 0", name="ck_accounts_balances"),
    )

    key: str = Field(primary_key=True, max_length=KEY_LENGTH)
    tenant: str = Field(foreign_key="tenants.name", index=True, max_length=NAME_LENGTH)
    project: str | None = Field(default=None, foreign_key="projects.name", max_length=NAME_LENGTH)
    quota: int | None = None
    used: int = 0
    reserved: int = 0
    borrowed: int = 0


class AllocationRow(LedgerModel, table=True):
    """Which request holds what: `milli` in-quota, or borrowed past the cap."""

    __tablename__ = "allocations"
    __table_args__ = (
        CheckConstraint(_in("state", AllocState), name="ck_allocations_state"),
        CheckConstraint("milli >= 0", name="ck_allocations_milli"),
        # At most one live allocation per request; a released request may be reserved again
        # (a preempted request resumes under its own id).
        Index(
            "ux_allocations_live_request",
            "request_id",
            unique=True,
            postgresql_where=text("state <> 'released'"),
            sqlite_where=text("state <> 'released'"),
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    request_id: str = Field(index=True, max_length=200)
    tenant: str = Field(foreign_key="tenants.name", index=True, max_length=NAME_LENGTH)
    project: str = Field(foreign_key="projects.name", max_length=NAME_LENGTH)
    tier: str = Field(max_length=32)
    gpus: int
    milli_per_gpu: int
    milli: int
    state: str = Field(max_length=16)
    borrowed: bool
    reserved_at: float
    committed_at: float | None = None
    returned_at: float | None = None
    released_at: float | None = None
    end_cause: str | None = Field(default=None, max_length=64)
    # The request as the scheduler saw it and when the cycle admitted it (migration 0002). `placed`
    # is False only on rows reserved before placements were stored.
    started_at: float = Field(sa_column_kwargs={"server_default": "0"})
    submit_time: float = Field(sa_column_kwargs={"server_default": "0"})
    cpu_milli: int = Field(sa_column_kwargs={"server_default": "0"})
    memory_mib: int = Field(sa_column_kwargs={"server_default": "0"})
    gpu_memory_mib: int = Field(sa_column_kwargs={"server_default": "0"})
    min_compute_level: int = Field(sa_column_kwargs={"server_default": "0"})
    gpu_models: str = Field(sa_column=Column(Text, nullable=False, server_default="[]"))  # JSON list
    single_node: bool = Field(sa_column_kwargs={"server_default": text("false")})
    preempted: int = Field(sa_column_kwargs={"server_default": "0"})
    placed: bool = Field(sa_column_kwargs={"server_default": text("false")})
    # When the request was last reclaimed and how often (migration 0003): its borrow back-off.
    reclaimed_at: float | None = None
    reclaims: int = Field(sa_column_kwargs={"server_default": "0"})
    # When the run last reported a checkpoint (migration 0005): preempting it loses only the work since.
    checkpointed_at: float | None = None
    # An elastic request's range (migration 0007): None for a fixed one.
    gpus_min: int | None = None
    gpus_max: int | None = None
    gpus_step: int | None = None


class SliceRow(LedgerModel, table=True):
    """One GPU slice of an allocation's placement: `milli` of GPU `gpu` on `node`."""

    __tablename__ = "allocation_slices"
    __table_args__ = (
        CheckConstraint("gpu >= 0 AND milli > 0 AND milli <= 1000", name="ck_allocation_slices_gpu"),
        CheckConstraint("gpu_memory_mib >= 0", name="ck_allocation_slices_memory"),
    )

    allocation_id: int = Field(foreign_key="allocations.id", primary_key=True)
    position: int = Field(primary_key=True)
    node: str = Field(max_length=NODE_LENGTH)
    gpu: int
    milli: int
    gpu_memory_mib: int


class ShareRow(LedgerModel, table=True):
    """The CPU and memory an allocation holds on one node."""

    __tablename__ = "allocation_shares"
    __table_args__ = (CheckConstraint("cpu_milli >= 0 AND memory_mib >= 0", name="ck_allocation_shares_amounts"),)

    allocation_id: int = Field(foreign_key="allocations.id", primary_key=True)
    position: int = Field(primary_key=True)
    node: str = Field(max_length=NODE_LENGTH)
    cpu_milli: int
    memory_mib: int


class Entry(LedgerModel, table=True):
    """One balance change: `bucket` of `account` += `amount`. Append-only."""

    __tablename__ = "entries"
    __table_args__ = (
        CheckConstraint(_in("kind", EntryKind), name="ck_entries_kind"),
        CheckConstraint(_in("bucket", Bucket), name="ck_entries_bucket"),
    )

    id: int | None = Field(default=None, primary_key=True)
    op: str = Field(index=True, max_length=32)
    at: float = Field(index=True)  # migration 0004: the tick reads the entries of a recent span
    kind: str = Field(index=True, max_length=16)
    account: str = Field(foreign_key="accounts.key", index=True, max_length=KEY_LENGTH)
    bucket: str = Field(max_length=16)
    amount: int
    allocation_id: int | None = Field(default=None, foreign_key="allocations.id", index=True)
    request_id: str | None = Field(default=None, max_length=200)
    cause: str = Field(default="", max_length=64)
    details: str = Field(default="{}", sa_column=Column(Text, nullable=False, server_default="{}"))


class ResumptionRow(LedgerModel, table=True):
    """The run that resumes one preemption of `victim` (a request id): written once, first come."""

    __tablename__ = "resumptions"

    victim: str = Field(primary_key=True, max_length=200)
    preempted_at: float = Field(primary_key=True)
    run_id: str = Field(max_length=200)
    claimed_at: float


TABLES = (
    "tenants",
    "projects",
    "accounts",
    "allocations",
    "allocation_slices",
    "allocation_shares",
    "entries",
    "resumptions",
)


def _table(name: str) -> Table:
    return ledger_registry.metadata.tables[name]


# The table handles every ledger module reads and writes through (SQLAlchemy Core).
TENANTS = _table("tenants")
PROJECTS = _table("projects")
ACCOUNTS = _table("accounts")
ALLOCATIONS = _table("allocations")
SLICES = _table("allocation_slices")
SHARES = _table("allocation_shares")
ENTRIES = _table("entries")
RESUMPTIONS = _table("resumptions")
