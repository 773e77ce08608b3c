"""An elastic run's resize in the ledger (DESIGN.md sections 6 and 11): `resize` entries and the
allocation's placement replaced, in the transaction that writes the cycle.

A resize restarts the run at its new size, so its allocation is a new launch: the old row is
released (`end_cause` `resize`) and the new size is a new row of the same request, reserved (the
resumption's launch commits it). Each charged account gets one `resize` entry giving back the old
milli from its bucket and one charging the new milli to the new bucket, both with the old and new
size in `details` and the direction (`grow`, `shrink`) as their cause, so the balances stay the sum
of the entries (`rebuild.py`). The cycle decides whether the new size is in-quota or borrowed: a
size past the account's cap is borrowed like any other borrowed allocation (reclaimable, returned
when the tenant has room); the ledger checks it with the core's quota rule, as it checks an
admission, and refuses a resize it cannot do as made (`StaleCycle`).
"""

from __future__ import annotations

from typing import Any

from xirang_platform.ledger.admission import book_of, charged, in_quota_bucket, locked_live, ratio_at
from xirang_platform.ledger.capacity import CapacityCheck
from xirang_platform.ledger.errors import InvalidPlacement, StaleCycle
from xirang_platform.ledger.placements import check_columns, check_placement, request_columns
from xirang_platform.ledger.tables import AllocState, Bucket, EntryKind
from xirang_platform.ledger.writer import Alloc, Writer
from xirang_platform.scheduling.model import Resize
from xirang_platform.scheduling.quota import OvercommitPolicy, Verdict, check

RESIZE_CAUSE = "resize"  # the `end_cause` of an allocation row a resize replaced


def release_old(w: Writer, r: Resize) -> tuple[Alloc, Bucket]:
    """Release the row `r` resizes (returned, with the bucket its milli sat in), checked against the
    cycle's view of it (`StaleCycle` when the ledger holds another size; `InvalidPlacement` when the
    new size is outside the request's range)."""
    row = locked_live(w, r.request_id, "resize")
    elastic = r.new.request.elastic
    if r.new.id != r.old.id or elastic is None or not elastic.contains(r.new.request.gpus):
        raise InvalidPlacement(
            f"the cycle resizes '{r.request_id}' to {r.new.request.gpus} GPUs, outside its elastic range "
            f"{elastic}: a resize keeps the request and stays within its range"
        )
    if row.gpus != r.old.request.gpus or row.milli != r.old.milli:
        raise StaleCycle(
            f"the cycle resizes '{r.request_id}' from {r.old.request.gpus} GPUs, but the ledger holds "
            f"{row.gpus}: rebuild the snapshot from the ledger and run the cycle again"
        )
    if r.new.borrowed and not r.new.request.tier.may_borrow:
        raise InvalidPlacement(
            f"resize of '{r.request_id}' is marked borrowed, but {r.new.request.tier.value} never borrows"
        )
    check_placement(r.new)
    check_columns(r.new)
    bucket = Bucket.BORROWED if row.borrowed else in_quota_bucket(row)
    w.change(row, state=AllocState.RELEASED.value, released_at=w.now, end_cause=RESIZE_CAUSE)
    return row, bucket


def charge_new(
    w: Writer,
    policy: OvercommitPolicy,
    r: Resize,
    old: tuple[Alloc, Bucket],
    allocated_fraction: float,
    room: CapacityCheck | None,
) -> str:
    """Write `r`'s new size as a reserved row (after `release_old` and a flush of the writer's
    allocations) and the `resize` entries of both rows; `room`: the pool's free capacity, which the
    new placement must fit. Returns why the pool has no room for it ('' when it had, and all was written)."""
    ratio = ratio_at(policy, allocated_fraction)
    request = r.new.request
    row, old_bucket = old
    if room is not None and (why := room.take(r.new.placement)):
        return why
    details: dict[str, Any] = {
        "old_gpus": row.gpus,
        "new_gpus": request.gpus,
        "old_milli": row.milli,
        "new_milli": r.new.milli,
        "resize": r.kind.value,
        "ratio": ratio,
        "tier": request.tier.value,
    }
    if r.by is not None:
        details["by"] = r.by
    if r.reason is not None:
        details["reason"] = r.reason.value
    for key in charged(request.tenant, request.project):
        w.entry(
            EntryKind.RESIZE,
            key,
            old_bucket,
            -row.milli,
            allocation_id=row.id,
            request_id=r.request_id,
            cause=r.kind.value,
            details=details,
        )
    rows = w.lock_tenant(request.tenant)
    balances = {k: h.balance for k, h in rows.items()}
    verdict = check(book_of(rows, request.tenant), balances, request, ratio, r.new.milli)
    if not r.new.borrowed and verdict.verdict is not Verdict.IN_QUOTA:
        raise StaleCycle(
            f"the cycle resizes '{r.request_id}' in-quota to {request.gpus} GPUs, but the ledger's balances put it "
            f"past its cap ({verdict.message}): rebuild the snapshot from the ledger and run the cycle again"
        )
    new_bucket = Bucket.BORROWED if r.new.borrowed else Bucket.RESERVED
    new_id = w.new_allocation(
        request_id=request.id,
        tenant=request.tenant,
        project=request.project,
        milli=r.new.milli,
        state=AllocState.RESERVED.value,
        borrowed=r.new.borrowed,
        reserved_at=w.now,
        placed=True,
        placement=r.new.placement,
        checkpointed_at=row.checkpointed_at,
        **request_columns(r.new),
    ).id
    for key in charged(request.tenant, request.project):
        w.entry(
            EntryKind.RESIZE,
            key,
            new_bucket,
            r.new.milli,
            allocation_id=new_id,
            request_id=r.request_id,
            cause=r.kind.value,
            details=details,
        )
    return ""
