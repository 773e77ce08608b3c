"""One ledger operation inside one transaction: lock the accounts, append entries, write balances.

Concurrency (PostgreSQL): every operation that changes a tenant's accounts first locks all of that
tenant's account rows with `SELECT ... WHERE tenant = :t ORDER BY key FOR UPDATE`. The tenant's own
row (`key` = tenant) sorts before its projects (`tenant/project`); an operation on several tenants
(the `*_many` batches) locks them all up front in tenant name order. Every writer thus locks in
one global order, (tenant, key), so two writers can never wait on each other in a cycle: no
deadlocks. The lock makes
writers of one tenant take turns; they see the balances the previous one committed (READ
COMMITTED re-reads after the lock is granted), so the cap check and the write it guards are
atomic and no interleaving can over-admit. Writers of different tenants do not block each other.

Row locks were chosen over SERIALIZABLE transactions with retry: the rows one operation must
protect are known up front (its tenant's accounts), conflicts on a tenant near its cap are the
normal case rather than the exception, and under SERIALIZABLE those would be aborted and retried
(wasted work growing with the number of writers), while a lock queue serves them in turn with no
retry loop and no unbounded latency. SQLite needs no row locks: `BEGIN IMMEDIATE` (see `db.py`)
takes the database's write lock when the transaction starts.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, fields
from typing import Any

from sqlalchemy import Connection, bindparam, insert, select, update

from xirang_platform.ledger.balances import AccountView
from xirang_platform.ledger.tables import ACCOUNTS, ALLOCATIONS, ENTRIES, SHARES, SLICES, AllocState, Bucket, EntryKind
from xirang_platform.scheduling.model import Placement
from xirang_platform.scheduling.quota import AccountKey

_UPDATE_BALANCES = (
    update(ACCOUNTS)
    .where(ACCOUNTS.c.key == bindparam("k"))
    .values(quota=bindparam("q"), used=bindparam("u"), reserved=bindparam("r"), borrowed=bindparam("b"))
)


def account_key(tenant: str, project: str | None = None) -> str:
    """The `accounts.key` of a tenant (`acme`) or project (`acme/vision`) account."""
    return tenant if project is None else f"{tenant}/{project}"


class PendingId:
    """The id of an allocation row inserted when the writer flushes."""

    value: int | None = None

    def __repr__(self) -> str:
        return f"PendingId({self.value})"


@dataclass
class Alloc:
    """An allocation row as a writer holds it (read under its tenant's lock, changed in place)."""

    id: int | PendingId
    request_id: str
    tenant: str
    project: str
    tier: str
    gpus: int
    milli_per_gpu: int
    milli: int
    state: str
    borrowed: bool
    reserved_at: float
    committed_at: float | None = None
    returned_at: float | None = None
    released_at: float | None = None
    end_cause: str | None = None
    started_at: float = 0.0
    submit_time: float = 0.0
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_memory_mib: int = 0
    min_compute_level: int = 0
    gpu_models: str = "[]"
    single_node: bool = False
    preempted: int = 0
    placed: bool = False
    reclaimed_at: float | None = None
    reclaims: int = 0
    checkpointed_at: float | None = None
    gpus_min: int | None = None
    gpus_max: int | None = None
    gpus_step: int | None = None
    placement: Placement | None = field(default=None, repr=False)  # written to its tables with a new row

    @classmethod
    def from_row(cls, row: Any) -> Alloc:
        """From an `allocations` row (its placement is read separately, where needed)."""
        return cls(**row._mapping)

    def columns(self) -> dict[str, Any]:
        """The `allocations` columns of a new row (all but the id)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("id", "placement")}


def _resolve(value: Any) -> Any:
    return value.value if isinstance(value, PendingId) else value


class Writer:
    """The entries and balance changes of one operation; `flush` writes them in its transaction."""

    def __init__(self, conn: Connection, now: float) -> None:  # noqa: D107
        self.conn = conn
        self.now = now
        self.op = uuid.uuid4().hex
        self.rows: dict[AccountKey, AccountView] = {}
        self._locked: set[str] = set()
        self.tenant_of: dict[str, str] = {}  # request id -> tenant, for requests whose tenant is locked
        self.prelocked = False  # a batch that locked all its tenants up front locks no more
        self._touched: set[AccountKey] = set()
        self._entries: list[dict[str, Any]] = []
        self._live: dict[str, Alloc] = {}  # request id -> live allocation read under the lock
        self._new: list[Alloc] = []
        self._changed: dict[int, dict[str, Any]] = {}  # allocation id -> columns to update

    def lock_tenant(self, tenant: str) -> dict[AccountKey, AccountView]:
        """Lock every account of `tenant` (tenant row first, then projects by key) and return them.

        Empty when the tenant does not exist."""
        if tenant not in self._locked:
            rows = self.conn.execute(
                select(ACCOUNTS).where(ACCOUNTS.c.tenant == tenant).order_by(ACCOUNTS.c.key).with_for_update()
            ).all()
            for row in rows:
                held = AccountView.from_row(row)
                self.rows[held.key] = held
            self._locked.add(tenant)
        return {k: v for k, v in self.rows.items() if k.tenant == tenant}

    def lock_tenant_of(self, request_id: str) -> str | None:
        """Lock the accounts of the tenant holding `request_id`'s live allocation (one statement);
        its tenant, or None when no live allocation has that id."""
        owner = (
            select(ALLOCATIONS.c.tenant)
            .where(ALLOCATIONS.c.request_id == request_id, ALLOCATIONS.c.state != AllocState.RELEASED.value)
            .scalar_subquery()
        )
        rows = self.conn.execute(
            select(ACCOUNTS).where(ACCOUNTS.c.tenant == owner).order_by(ACCOUNTS.c.key).with_for_update()
        ).all()
        if not rows:
            return None
        tenant = rows[0].tenant
        if tenant not in self._locked:
            for row in rows:
                held = AccountView.from_row(row)
                self.rows[held.key] = held
            self._locked.add(tenant)
        return tenant

    def load_live(self, request_ids: list[str]) -> None:
        """Read the live allocations of these requests in one query (call with their tenants locked)."""
        missing = sorted({r for r in request_ids if r not in self._live})
        if missing:
            rows = self.conn.execute(
                select(ALLOCATIONS).where(
                    ALLOCATIONS.c.request_id.in_(missing), ALLOCATIONS.c.state != AllocState.RELEASED.value
                )
            ).all()
            for row in rows:
                self._live[row.request_id] = Alloc.from_row(row)

    def live(self, request_id: str) -> Alloc | None:
        """The live allocation of `request_id` (call with its tenant locked), or None."""
        if request_id not in self._live:
            self.load_live([request_id])
        a = self._live.get(request_id)
        return None if a is None or a.state == AllocState.RELEASED else a

    def live_borrowed(self, tenant: str) -> list[Alloc]:
        """`tenant`'s live borrowed allocations, oldest first (call with the tenant locked)."""
        self.flush_allocations()  # the query must see this writer's own changes
        rows = self.conn.execute(
            select(ALLOCATIONS)
            .where(
                ALLOCATIONS.c.tenant == tenant,
                ALLOCATIONS.c.borrowed.is_(True),
                ALLOCATIONS.c.state != AllocState.RELEASED.value,
            )
            .order_by(ALLOCATIONS.c.reserved_at, ALLOCATIONS.c.request_id, ALLOCATIONS.c.id)
        ).all()
        return [self._live.setdefault(r.request_id, Alloc.from_row(r)) for r in rows]

    def new_allocation(self, **values: Any) -> Alloc:
        """An allocation row to insert at flush; its `id` is a `PendingId` until then."""
        a = Alloc(id=PendingId(), **values)
        self._new.append(a)
        return a

    def change(self, a: Alloc, **values: Any) -> None:
        """Change columns of an existing allocation (in place now, in the table at flush)."""
        for name, value in values.items():
            setattr(a, name, value)
        if isinstance(a.id, PendingId):
            return  # not inserted yet: the insert writes the new values
        self._changed.setdefault(a.id, {}).update(values)

    def flush_allocations(self) -> None:
        """Insert the new allocations and write the changed ones."""
        if self._new:
            rows = [a.columns() for a in self._new]
            ids = (
                self.conn.execute(insert(ALLOCATIONS).returning(ALLOCATIONS.c.id, sort_by_parameter_order=True), rows)
                .scalars()
                .all()
            )
            for a, new_id in zip(self._new, ids, strict=True):
                assert isinstance(a.id, PendingId)
                a.id.value = new_id
                a.id = new_id
            self._insert_placements(self._new)
            self._new.clear()
        groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for alloc_id, values in sorted(self._changed.items()):
            groups.setdefault(tuple(sorted(values)), []).append(
                {"alloc_id": alloc_id, **{f"new_{c}": v for c, v in values.items()}}
            )
        for columns, params in groups.items():
            stmt = (
                update(ALLOCATIONS)
                .where(ALLOCATIONS.c.id == bindparam("alloc_id"))
                .values({c: bindparam(f"new_{c}") for c in columns})
            )
            self.conn.execute(stmt, params)
        self._changed.clear()

    def _insert_placements(self, allocations: list[Alloc]) -> None:
        slices, shares = [], []
        for a in allocations:
            if a.placement is None:
                continue
            slices += [
                {
                    "allocation_id": a.id,
                    "position": i,
                    "node": s.node,
                    "gpu": s.gpu,
                    "milli": s.milli,
                    "gpu_memory_mib": s.gpu_memory_mib,
                }
                for i, s in enumerate(a.placement.slices)
            ]
            shares += [
                {
                    "allocation_id": a.id,
                    "position": i,
                    "node": s.node,
                    "cpu_milli": s.cpu_milli,
                    "memory_mib": s.memory_mib,
                }
                for i, s in enumerate(a.placement.shares)
            ]
        if slices:
            self.conn.execute(insert(SLICES), slices)
        if shares:
            self.conn.execute(insert(SHARES), shares)

    def add_account(self, key: AccountKey) -> None:
        """Create the (empty, unlimited) account row of `key`; its quota comes by a quota entry."""
        self.conn.execute(
            insert(ACCOUNTS).values(
                key=str(key), tenant=key.tenant, project=key.project, quota=None, used=0, reserved=0, borrowed=0
            )
        )
        self.rows[key] = AccountView(key)

    def entry(
        self,
        kind: EntryKind,
        key: AccountKey,
        bucket: Bucket,
        amount: int,
        *,
        allocation_id: int | PendingId | None = None,
        request_id: str | None = None,
        cause: str = "",
        details: dict[str, Any] | None = None,
    ) -> None:
        """Append one entry (`bucket` of `key` += `amount`) and apply it to the held balance."""
        self._entries.append(
            {
                "op": self.op,
                "at": self.now,
                "kind": kind.value,
                "account": str(key),
                "bucket": bucket.value,
                "amount": amount,
                "allocation_id": allocation_id,
                "request_id": request_id,
                "cause": cause,
                "details": json.dumps(details or {}, sort_keys=True),
            }
        )
        self.rows[key] = self.rows[key].bump(bucket, amount)
        self._touched.add(key)

    def set_quota(self, key: AccountKey, quota: int | None, cause: str) -> None:
        """Set the quota of `key` (None: no limit of its own), recorded as a `quota` entry."""
        old = self.rows[key].quota
        self.entry(
            EntryKind.QUOTA,
            key,
            Bucket.QUOTA,
            (quota or 0) - (old or 0),
            cause=cause,
            details={"quota": quota, "previous": old},
        )
        self.rows[key] = self.rows[key].with_quota(quota)

    def flush(self) -> None:
        """Write the allocations, the entries and the new balances of every touched account."""
        self.flush_allocations()
        if self._entries:
            for e in self._entries:
                e["allocation_id"] = _resolve(e["allocation_id"])
            self.conn.execute(insert(ENTRIES), self._entries)
        if self._touched:
            rows = [
                {"k": str(h.key), "q": h.quota, "u": h.used, "r": h.reserved, "b": h.borrowed}
                for h in (self.rows[key] for key in sorted(self._touched, key=str))
            ]
            self.conn.execute(_UPDATE_BALANCES, rows)
        self._entries.clear()
        self._touched.clear()
