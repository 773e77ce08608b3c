"""Admission operations on locked accounts: reserve, commit, release, preempt, return.

Each function runs inside one `Writer` (one transaction). The decisions are the core's pure quota
rules (`check`, `returnable`, `is_reclaimable` from `scheduling.quota`) applied to the balances the
writer has locked, so the ledger and the scheduler decide alike. A request is charged to its tenant
account and to its project account; only the accounts `QuotaBook.keys_for` names are checked
against their caps (a project without a quota of its own only counts its usage).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import select

from xirang_platform.ledger.errors import (
    InvalidAmount,
    InvalidName,
    InvalidTransition,
    PreemptForbidden,
    UnknownAllocation,
    UnknownProject,
    UnknownTenant,
)
from xirang_platform.ledger.tables import AllocationRow, AllocState, Bucket, EntryKind
from xirang_platform.ledger.writer import Alloc, Held, PendingId, Writer
from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.model import Allocation, GpuSlice, Placement, PreemptReason, Request, Tier
from xirang_platform.scheduling.quota import (
    AccountKey,
    OvercommitPolicy,
    QuotaBook,
    Verdict,
    check,
    is_reclaimable,
    returnable,
)

ALLOCATIONS = AllocationRow.__table__  # type: ignore[attr-defined]
REQUEST_ID_LENGTH = 200
CAUSE_LENGTH = 64


@dataclass(frozen=True)
class Reservation:
    """The ledger's answer to `reserve`: admitted in-quota, admitted as borrowed, or refused."""

    request_id: str
    verdict: Verdict
    allocation_id: int | PendingId | None
    ratio: float
    message: str = ""

    @property
    def admitted(self) -> bool:
        """Whether capacity was reserved (in-quota or borrowed)."""
        return self.allocation_id is not None

    @property
    def borrowed(self) -> bool:
        """Whether the capacity was admitted past the cap, as borrowed."""
        return self.admitted and self.verdict is Verdict.BORROW


def ratio_at(policy: OvercommitPolicy, allocated_fraction: float) -> float:
    """The cap ratio at `allocated_fraction`, refusing a fraction outside 0..1."""
    if isinstance(allocated_fraction, bool) or not isinstance(allocated_fraction, int | float):
        raise InvalidAmount(f"allocated_fraction must be a number in 0..1, got {allocated_fraction!r}")
    if not 0.0 <= allocated_fraction <= 1.0:
        raise InvalidAmount(
            f"allocated_fraction must be in 0..1 (the share of the pool's GPU milli allocated), got "
            f"{allocated_fraction}: pass allocated milli / capacity milli"
        )
    return policy.ratio(allocated_fraction)


def book_of(rows: dict[AccountKey, Held], tenant: str) -> QuotaBook:
    """The quota book of one tenant, from its locked account rows."""
    tenants = {k.tenant: h.quota or 0 for k, h in rows.items() if k.project is None and k.tenant == tenant}
    projects = {(k.tenant, k.project): h.quota for k, h in rows.items() if k.project is not None}
    return QuotaBook(tenants, projects)


def charged(request_tenant: str, request_project: str) -> tuple[AccountKey, AccountKey]:
    """The accounts whose balances an allocation moves: its tenant's and its project's."""
    return AccountKey(request_tenant), AccountKey(request_tenant, request_project)


def lock_for(w: Writer, tenant: str, project: str) -> dict[AccountKey, Held]:
    """Lock `tenant`'s accounts, refusing an unknown tenant or a project not in it."""
    rows = w.lock_tenant(tenant)
    if AccountKey(tenant) not in rows:
        raise UnknownTenant(tenant)
    if AccountKey(tenant, project) not in rows:
        raise UnknownProject(tenant, project)
    return rows


def reserve(
    w: Writer, policy: OvercommitPolicy, request: Request, allocated_fraction: float, allow_borrow: bool
) -> Reservation:
    """Reserve `request`'s milli in-quota if it fits its caps, else as borrowed (P1/P2), else refuse."""
    ratio = ratio_at(policy, allocated_fraction)
    if not 0 < len(request.id) <= REQUEST_ID_LENGTH:
        raise InvalidName(f"request id {request.id[:40]!r}... must be 1-{REQUEST_ID_LENGTH} characters: shorten it")
    rows = lock_for(w, request.tenant, request.project)
    # A second live allocation of the same request is refused by the unique index on live
    # request ids when the allocation is inserted (`Ledger.reserve` turns that into an error):
    # one statement fewer under the lock than checking first.
    book = book_of(rows, request.tenant)
    verdict = check(book, {k: h.balance() for k, h in rows.items()}, request, ratio)
    if verdict.verdict is Verdict.OVER_QUOTA or (verdict.verdict is Verdict.BORROW and not allow_borrow):
        message = verdict.message if verdict.verdict is Verdict.OVER_QUOTA else f"{verdict.message}, but no idle units"
        return Reservation(request.id, Verdict.OVER_QUOTA, None, ratio, message)
    borrowed = verdict.verdict is Verdict.BORROW
    milli = request.total_milli
    allocation_id = w.new_allocation(
        request_id=request.id,
        tenant=request.tenant,
        project=request.project,
        tier=request.tier.value,
        gpus=request.gpus,
        milli_per_gpu=request.milli_per_gpu,
        milli=milli,
        state=AllocState.RESERVED.value,
        borrowed=borrowed,
        reserved_at=w.now,
    ).id
    kind, bucket = (EntryKind.BORROW, Bucket.BORROWED) if borrowed else (EntryKind.RESERVE, Bucket.RESERVED)
    details = {"ratio": ratio, "allocated_fraction": allocated_fraction, "tier": request.tier.value}
    if borrowed:
        details["over_cap"] = {"account": str(verdict.account), "milli": verdict.over_by}
    for key in charged(request.tenant, request.project):
        w.entry(kind, key, bucket, milli, allocation_id=allocation_id, request_id=request.id, details=details)
    return Reservation(request.id, verdict.verdict, allocation_id, ratio, verdict.message)


def resolved(r: Reservation) -> Reservation:
    """`r` with its allocation id written (after the writer flushed)."""
    if isinstance(r.allocation_id, PendingId):
        return replace(r, allocation_id=r.allocation_id.value)
    return r


def already_reserved(request_id: str) -> InvalidTransition:
    """The error for a second reserve of a live request."""
    return InvalidTransition(
        f"request '{request_id}' is already reserved (it holds a live allocation): release it before "
        f"reserving it again, or give the new run its own request id"
    )


def commit(w: Writer, request_id: str) -> None:
    """Confirm the launch of a reserved request: its reserved milli becomes used."""
    row = _locked_live(w, request_id, "commit")
    if row.state != AllocState.RESERVED:
        raise InvalidTransition(
            f"request '{request_id}' is already committed (allocation {row.id}): commit each launch once; "
            f"release it when its run ends"
        )
    for key in charged(row.tenant, row.project):
        if row.borrowed:
            # Borrowed capacity stays borrowed when it launches; the entry records the launch.
            w.entry(EntryKind.COMMIT, key, Bucket.BORROWED, 0, allocation_id=row.id, request_id=request_id)
        else:
            w.entry(EntryKind.COMMIT, key, Bucket.RESERVED, -row.milli, allocation_id=row.id, request_id=request_id)
            w.entry(EntryKind.COMMIT, key, Bucket.USED, row.milli, allocation_id=row.id, request_id=request_id)
    w.change(row, state=AllocState.COMMITTED.value, committed_at=w.now)


def release(
    w: Writer,
    policy: OvercommitPolicy,
    request_id: str,
    *,
    cause: str,
    allocated_fraction: float,
    auto_return: bool,
    kind: EntryKind = EntryKind.RELEASE,
    details: dict[str, Any] | None = None,
) -> list[str]:
    """Give back a request's milli; then, if `auto_return`, return the tenant's borrowed
    allocations that fit under the cap now. Returns the request ids returned."""
    ratio = ratio_at(policy, allocated_fraction)
    action = "preempt" if kind is EntryKind.PREEMPT else "release"
    if len(cause) > CAUSE_LENGTH:
        raise InvalidName(f"{action} cause {cause[:40]!r}... is longer than {CAUSE_LENGTH} characters: shorten it")
    row = _locked_live(w, request_id, action)
    if kind is EntryKind.PREEMPT and not is_reclaimable(to_allocation(row)):
        what = (
            "inference (P0), which is never preempted"
            if row.tier == Tier.INFERENCE
            else (f"{row.tier} (P1) holding in-quota capacity, which is preempted only for its borrowed part")
        )
        raise PreemptForbidden(f"cannot preempt request '{request_id}': it is {what}; pick a P2 or borrowed victim")
    if row.borrowed:
        bucket = Bucket.BORROWED
    else:
        bucket = Bucket.USED if row.state == AllocState.COMMITTED else Bucket.RESERVED
    for key in charged(row.tenant, row.project):
        w.entry(
            kind, key, bucket, -row.milli, allocation_id=row.id, request_id=request_id, cause=cause, details=details
        )
    w.change(row, state=AllocState.RELEASED.value, released_at=w.now, end_cause=cause)
    if not auto_return:
        return []
    return _return(w, row.tenant, ratio)


def preempt(
    w: Writer,
    policy: OvercommitPolicy,
    victim: str,
    by: str,
    reason: PreemptReason,
    allocated_fraction: float,
    auto_return: bool,
) -> list[str]:
    """Take a victim's milli back (a `preempt` entry naming the preemptor and reason)."""
    reason = PreemptReason(reason)
    return release(
        w,
        policy,
        victim,
        cause=reason.value,
        allocated_fraction=allocated_fraction,
        auto_return=auto_return,
        kind=EntryKind.PREEMPT,
        details={"by": by, "reason": reason.value},
    )


def return_borrowed(w: Writer, policy: OvercommitPolicy, tenant: str, allocated_fraction: float) -> list[str]:
    """Turn `tenant`'s borrowed allocations in-quota, oldest first, while they fit under the cap."""
    ratio = ratio_at(policy, allocated_fraction)
    if AccountKey(tenant) not in w.lock_tenant(tenant):
        raise UnknownTenant(tenant)
    return _return(w, tenant, ratio)


def _return(w: Writer, tenant: str, ratio: float) -> list[str]:
    rows = w.lock_tenant(tenant)
    if rows[AccountKey(tenant)].borrowed == 0:
        return []  # nothing borrowed: skip the query
    borrowed = w.live_borrowed(tenant)
    if not borrowed:
        return []
    by_request = {a.request_id: a for a in borrowed}
    book = book_of(rows, tenant)
    chosen = returnable(book, {k: h.balance() for k, h in rows.items()}, [to_allocation(a) for a in borrowed], ratio)
    out = []
    for a in chosen:
        row = by_request[a.id]
        into = Bucket.USED if row.state == AllocState.COMMITTED else Bucket.RESERVED
        details = {"ratio": ratio}
        for key in charged(row.tenant, row.project):
            w.entry(EntryKind.RETURN, key, Bucket.BORROWED, -row.milli, allocation_id=row.id, request_id=a.id)
            w.entry(EntryKind.RETURN, key, into, row.milli, allocation_id=row.id, request_id=a.id, details=details)
        w.change(row, borrowed=False, returned_at=w.now)
        out.append(a.id)
    return out


def to_allocation(row: Alloc | Any) -> Allocation:
    """The core's view of an allocation row (placement is not the ledger's: one slice per GPU)."""
    request = Request(
        id=row.request_id,
        tenant=row.tenant,
        project=row.project,
        tier=Tier(row.tier),
        submit_time=row.reserved_at,
        gpus=row.gpus,
        milli_per_gpu=row.milli_per_gpu or MILLI_PER_GPU,
    )
    slices = tuple(GpuSlice("", i, row.milli_per_gpu) for i in range(row.gpus))
    return Allocation(
        request,
        Placement(slices, ()),
        start=row.reserved_at,
        borrowed=bool(row.borrowed),
        confirmed=row.state == AllocState.COMMITTED,
    )


def _locked_live(w: Writer, request_id: str, action: str) -> Alloc:
    """The live allocation of `request_id`, read after its tenant's accounts are locked."""
    if request_id not in w.tenant_of:
        # A batch locks its tenants up front and no others, to keep the global lock order.
        tenant = None if w.prelocked else w.lock_tenant_of(request_id)
        if tenant is None:
            raise UnknownAllocation(request_id, action)
        w.tenant_of[request_id] = tenant
    # Read after the lock: another writer may have changed it while this one waited.
    row = w.live(request_id)
    if row is None:
        raise UnknownAllocation(request_id, action)
    return row


def lock_tenants(w: Writer, tenants: Iterable[str]) -> None:
    """Lock several tenants' accounts up front, in tenant name order (the global lock order)."""
    for tenant in sorted(set(tenants)):
        w.lock_tenant(tenant)


def lock_tenants_of(w: Writer, request_ids: Iterable[str]) -> None:
    """Lock, in tenant name order, the tenants whose live allocations these requests hold, then
    read those allocations in one query."""
    ids = sorted(set(request_ids))
    if not ids:
        return
    owners = w.conn.execute(
        select(ALLOCATIONS.c.request_id, ALLOCATIONS.c.tenant).where(
            ALLOCATIONS.c.request_id.in_(ids), ALLOCATIONS.c.state != AllocState.RELEASED.value
        )
    ).all()
    lock_tenants(w, (tenant for _, tenant in owners))
    w.prelocked = True
    # The tenant of an allocation never changes, so this map stays true under the lock.
    w.tenant_of.update({rid: tenant for rid, tenant in owners})
    w.load_live([rid for rid, _ in owners])
