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

from xirang_platform.ledger.balances import AccountView
from xirang_platform.ledger.errors import (
    InvalidAmount,
    InvalidName,
    InvalidPlacement,
    InvalidTransition,
    PreemptForbidden,
    StaleCycle,
    UnknownAllocation,
    UnknownProject,
    UnknownTenant,
)
from xirang_platform.ledger.placements import (
    NO_PLACEMENT,
    check_columns,
    check_placement,
    read_placements,
    request_columns,
    to_allocation,
)
from xirang_platform.ledger.tables import ALLOCATIONS, AllocState, Bucket, EntryKind
from xirang_platform.ledger.writer import Alloc, PendingId, Writer
from xirang_platform.scheduling.model import Allocation, PreemptReason, Tier
from xirang_platform.scheduling.quota import (
    AccountKey,
    OvercommitPolicy,
    QuotaBook,
    Verdict,
    check,
    is_reclaimable,
    returnable,
)

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


def book_of(rows: dict[AccountKey, AccountView], tenant: str) -> QuotaBook:
    """The quota book of one tenant, from its locked account rows."""
    tenants = {k.tenant: h.quota or 0 for k, h in rows.items() if k.project is None and k.tenant == tenant}
    projects = {(k.tenant, k.project): h.quota for k, h in rows.items() if k.project is not None}
    return QuotaBook(tenants, projects)


def charged(request_tenant: str, request_project: str) -> tuple[AccountKey, AccountKey]:
    """The accounts whose balances an allocation moves: its tenant's and its project's."""
    return AccountKey(request_tenant), AccountKey(request_tenant, request_project)


def lock_for(w: Writer, tenant: str, project: str) -> dict[AccountKey, AccountView]:
    """Lock `tenant`'s accounts, refusing an unknown tenant or a project not in it."""
    rows = w.lock_tenant(tenant)
    if AccountKey(tenant) not in rows:
        raise UnknownTenant(tenant)
    if AccountKey(tenant, project) not in rows:
        raise UnknownProject(tenant, project)
    return rows


def reserve(
    w: Writer, policy: OvercommitPolicy, allocation: Allocation, allocated_fraction: float, allow_borrow: bool
) -> Reservation:
    """Reserve the placed milli of a cycle's `allocation`: borrowed when the cycle admitted it
    borrowed; else in-quota if it fits its caps, else borrowed (P1/P2, when `allow_borrow`), else refused."""
    request = allocation.request
    ratio = ratio_at(policy, allocated_fraction)
    if not 0 < len(request.id) <= REQUEST_ID_LENGTH:
        raise InvalidName(f"request id {request.id[:40]!r}... must be 1-{REQUEST_ID_LENGTH} characters: shorten it")
    if allocation.confirmed:
        raise InvalidTransition(
            f"allocation '{request.id}' is already confirmed: reserve the cycle's unconfirmed allocation, "
            f"then commit it when its launch is confirmed"
        )
    if allocation.borrowed and not request.tier.may_borrow:
        raise InvalidPlacement(f"allocation '{request.id}' is marked borrowed, but {request.tier.value} never borrows")
    check_placement(allocation)
    check_columns(allocation)
    rows = lock_for(w, request.tenant, request.project)
    # A second live allocation of the same request is refused by the unique index on live
    # request ids when the allocation is inserted (`Ledger.reserve_allocations` turns that into an
    # error): one statement fewer under the lock than checking first.
    book = book_of(rows, request.tenant)
    milli = allocation.milli
    verdict = check(book, {k: h.balance for k, h in rows.items()}, request, ratio, milli)
    if allocation.borrowed:
        decided, message = Verdict.BORROW, verdict.message or "admitted as borrowed by the scheduling cycle"
    else:
        decided, message = verdict.verdict, verdict.message
    if decided is Verdict.OVER_QUOTA or (decided is Verdict.BORROW and not allow_borrow):
        message = message if decided is Verdict.OVER_QUOTA else f"{message}, but no idle units"
        return Reservation(request.id, Verdict.OVER_QUOTA, None, ratio, message)
    borrowed = decided is Verdict.BORROW
    allocation_id = w.new_allocation(
        request_id=request.id,
        tenant=request.tenant,
        project=request.project,
        milli=milli,
        state=AllocState.RESERVED.value,
        borrowed=borrowed,
        reserved_at=w.now,
        placed=True,
        placement=allocation.placement,
        **request_columns(allocation),
    ).id
    kind, bucket = (EntryKind.BORROW, Bucket.BORROWED) if borrowed else (EntryKind.RESERVE, Bucket.RESERVED)
    details: dict[str, Any] = {"ratio": ratio, "allocated_fraction": allocated_fraction, "tier": request.tier.value}
    if borrowed and verdict.account is not None:
        details["over_cap"] = {"account": str(verdict.account), "milli": verdict.over_by}
    for key in charged(request.tenant, request.project):
        w.entry(kind, key, bucket, milli, allocation_id=allocation_id, request_id=request.id, details=details)
    return Reservation(request.id, decided, allocation_id, ratio, message)


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
    row = locked_live(w, request_id, "commit")
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
    row = locked_live(w, request_id, action)
    # Only the tier and the borrowed flag decide whether an allocation may be preempted.
    if kind is EntryKind.PREEMPT and not is_reclaimable(to_allocation(row, NO_PLACEMENT)):
        what = (
            "inference (P0), which is never preempted"
            if row.tier == Tier.INFERENCE
            else (f"{row.tier} (P1) holding in-quota capacity, which is preempted only for its borrowed part")
        )
        raise PreemptForbidden(f"cannot preempt request '{request_id}': it is {what}; pick a P2 or borrowed victim")
    bucket = Bucket.BORROWED if row.borrowed else in_quota_bucket(row)
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
    chosen = _returnable(w, rows, borrowed, ratio)
    for a in chosen:
        _write_return(w, by_request[a.id], ratio)
    return [a.id for a in chosen]


def return_allocation(w: Writer, policy: OvercommitPolicy, request_id: str, allocated_fraction: float) -> None:
    """Turn one borrowed allocation in-quota, as a cycle decided; `StaleCycle` if the ledger
    does not hold it borrowed or its accounts have no room for it under the cap."""
    ratio = ratio_at(policy, allocated_fraction)
    row = locked_live(w, request_id, "return")
    if not row.borrowed:
        raise StaleCycle(
            f"the cycle returns '{request_id}', which the ledger holds in-quota already: rebuild the snapshot from "
            f"the ledger and run the cycle again"
        )
    if not _returnable(w, w.lock_tenant(row.tenant), [row], ratio):
        raise StaleCycle(
            f"the cycle returns '{request_id}', but its accounts have no room for it under the cap at ratio "
            f"{ratio:.3f} in the ledger: rebuild the snapshot from the ledger and run the cycle again"
        )
    _write_return(w, row, ratio)


def _returnable(
    w: Writer, rows: dict[AccountKey, AccountView], borrowed: list[Alloc], ratio: float
) -> list[Allocation]:
    """The core's return rule over the writer's locked balances."""
    tenant = borrowed[0].tenant
    placements = read_placements(w.conn, borrowed, for_accounting=True)
    views = [to_allocation(a, p) for a, p in zip(borrowed, placements, strict=True)]
    return returnable(book_of(rows, tenant), {k: h.balance for k, h in rows.items()}, views, ratio)


def _write_return(w: Writer, row: Alloc, ratio: float) -> None:
    into = in_quota_bucket(row)
    details = {"ratio": ratio}
    for key in charged(row.tenant, row.project):
        w.entry(EntryKind.RETURN, key, Bucket.BORROWED, -row.milli, allocation_id=row.id, request_id=row.request_id)
        w.entry(
            EntryKind.RETURN, key, into, row.milli, allocation_id=row.id, request_id=row.request_id, details=details
        )
    w.change(row, borrowed=False, returned_at=w.now)


def in_quota_bucket(row: Alloc) -> Bucket:
    """Where an allocation's in-quota milli sits: used once its launch is confirmed, else reserved."""
    return Bucket.USED if row.state == AllocState.COMMITTED else Bucket.RESERVED


def locked_live(w: Writer, request_id: str, action: str) -> Alloc:
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


def lock_tenants_of(w: Writer, request_ids: Iterable[str], also: Iterable[str] = ()) -> None:
    """Lock, in tenant name order, the tenants whose live allocations these requests hold (and the
    tenants `also` names), then read those allocations in one query."""
    ids = sorted(set(request_ids))
    also = set(also)
    if not ids and not also:
        return
    owners = (
        w.conn.execute(
            select(ALLOCATIONS.c.request_id, ALLOCATIONS.c.tenant).where(
                ALLOCATIONS.c.request_id.in_(ids), ALLOCATIONS.c.state != AllocState.RELEASED.value
            )
        ).all()
        if ids
        else []
    )
    lock_tenants(w, also | {tenant for _, tenant in owners})
    w.prelocked = True
    # The tenant of an allocation never changes, so this map stays true under the lock.
    w.tenant_of.update({rid: tenant for rid, tenant in owners})
    w.load_live([rid for rid, _ in owners])
