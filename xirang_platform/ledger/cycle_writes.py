"""A scheduling cycle's decisions written in one ledger transaction (`Ledger.apply_cycle`).

Its preemptions, its resizes (`resizes.py`: the old row released, the new size reserved), its
admissions (reserved as the cycle admitted them), then its returns, the order the cycle decides
them in; each admission's cap is checked at the pool's allocated share the cycle has reached by
then (`_moving_fraction`) and its placement against the pool's capacity. A decision the ledger
cannot do as made raises, and the caller's transaction writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.exc import DBAPIError

from xirang_platform.ledger import admission, resizes
from xirang_platform.ledger.admission import Reservation
from xirang_platform.ledger.capacity import CapacityCheck, live_usage, lock_capacity
from xirang_platform.ledger.errors import BadRequest, LedgerBusy, LedgerError, OverCapacity, StaleCycle
from xirang_platform.ledger.writer import Writer
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.model import Allocation
from xirang_platform.scheduling.quota import OvercommitPolicy
from xirang_platform.scheduling.result import CycleResult


def write_cycle(
    w: Writer,
    policy: OvercommitPolicy,
    result: CycleResult,
    allocated_fraction: float,
    capacity_milli: int | None,
    pool: Pool | None,
    *,
    isolate: bool,
) -> list[Reservation]:
    """Write `result`'s decisions with `w`, as `Ledger.apply_cycle` says; `isolate`: flush after each
    admission, so a statement the database refuses names it. Returns the admissions' reservations,
    in order, before their allocation ids are resolved (`admission.resolved`, once committed)."""
    admits = [a.allocation for a in result.admits]
    touched = [r.request_id for r in result.returns] + [p.victim.id for p in result.preempts]
    touched += [r.request_id for r in result.resizes]
    freed = sum(p.victim.milli for p in result.preempts) + sum(r.old.milli - r.new.milli for r in result.resizes)
    fraction = _moving_fraction(allocated_fraction, capacity_milli, freed)
    returns_at = min(allocated_fraction, fraction(sum(a.milli for a in admits)))
    placing = bool(admits or result.resizes)
    if pool is not None and placing:
        lock_capacity(w.conn)  # before any tenant's accounts: the global lock order
    admission.lock_tenants_of(w, touched, also=(a.request.tenant for a in admits))
    # The cycle returns at its end, with the room its admissions left: its returns are
    # written after its admissions, but for one it also preempts (written before that).
    victims = {p.victim.id for p in result.preempts}
    for r in result.returns:
        if r.request_id in victims:
            admission.return_allocation(w, policy, r.request_id, returns_at)
    for p in result.preempts:
        admission.preempt(w, policy, p.victim.id, p.by, p.reason, allocated_fraction, False)
    resized = [(rz, resizes.release_old(w, rz)) for rz in result.resizes]
    room = None
    if placing:
        w.flush_allocations()  # the victims' and resized rows released, so their slices leave the usage
    if pool is not None and placing:
        room = CapacityCheck(pool, live_usage(w.conn))
    for rz, old in resized:
        if why := resizes.charge_new(w, policy, rz, old, fraction(0), room):
            raise StaleCycle(
                f"the cycle resizes '{rz.request_id}' to {rz.new.request.gpus} GPUs, but the pool has no room for its "
                f"new placement: {why}; rebuild the snapshot from the ledger and run the cycle again"
            )
    got, admitted = [], 0
    for a in admits:
        answer = _reserve_one(w, policy, a, fraction(admitted), room, flush=isolate)
        if not answer.admitted or answer.borrowed != a.borrowed:
            raise _stale_admission(a, answer)
        got.append(answer)
        admitted += a.milli
    for r in result.returns:
        if r.request_id not in victims:
            admission.return_allocation(w, policy, r.request_id, returns_at)
    return got


def _moving_fraction(start: float, capacity_milli: int | None, victims_milli: int) -> Callable[[int], float]:
    """The pool's allocated share after a cycle's victims left and `admitted` milli arrived (the
    start share throughout when the capacity is not given)."""
    if not capacity_milli:
        return lambda admitted: start
    start_milli = round(start * capacity_milli)
    return lambda admitted: min(1.0, max(0.0, (start_milli - victims_milli + admitted) / capacity_milli))


def _reserve_one(
    w: Writer, policy: OvercommitPolicy, a: Allocation, fraction: float, room: CapacityCheck | None, *, flush: bool
) -> Reservation:
    """Reserve one admission of a cycle, refusing it alone (`RequestRefused`, naming it) when the
    ledger cannot hold it or the pool has no room for its placement; `flush`: write it at once, so
    a statement the database refuses is this admission's."""
    try:
        answer = admission.reserve(w, policy, a, fraction, True)
    except (StaleCycle, LedgerBusy):
        raise
    except LedgerError as e:
        raise BadRequest(a.id, str(e)) from e
    if room is not None and (why := room.take(a.placement)):
        raise no_room(a.id, why)
    if flush:
        try:
            w.flush()
        except DBAPIError as e:
            raise BadRequest(a.id, f"the database refused its row: {_first_line(e)}") from e
    return answer


def no_room(request_id: str, why: str) -> OverCapacity:
    """The refusal of admission `request_id` whose placement the pool has no room for (`why`)."""
    return OverCapacity(request_id, f"no room for its placement in the pool: {why}")


def _first_line(e: DBAPIError) -> str:
    lines = str(e.orig).strip().splitlines() if e.orig is not None else []
    return lines[0] if lines else type(e).__name__


def _stale_admission(a: Allocation, r: Reservation) -> StaleCycle:
    said = "borrowed" if a.borrowed else "in-quota"
    found = "refused" if not r.admitted else ("borrowed" if r.borrowed else "in-quota")
    return StaleCycle(
        f"the cycle admitted '{a.id}' {said}, but the ledger's balances make it {found} ({r.message}): the "
        f"snapshot is stale; rebuild it from the ledger and run the cycle again"
    )
