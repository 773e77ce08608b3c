"""The one applier of a cycle's decisions: `apply_cycle(result, state, allocations)`.

A cycle decides on a copy of its snapshot and returns its decisions as data; every caller that keeps
a cluster state (the replay loop, the fill loop, the tests, the cycle bench, the live scheduling
tick) applies them here, in the order the cycle made them: returns, then preemptions (victims free
their units), then shrinks of elastic runs (they free units too), then admissions, then growths
(into what the admissions left). A returned allocation may still be preempted later in the same
cycle; a resized run keeps its id, its allocation replaced by the resize's `new`.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass, replace

from xirang_platform.scheduling import quota
from xirang_platform.scheduling.model import Allocation, HoldReason, Preempt, Request, Resize, ResizeKind
from xirang_platform.scheduling.result import CycleResult
from xirang_platform.scheduling.state import ClusterState


@dataclass(frozen=True)
class Applied:
    """What `apply_cycle` did, in order: the allocations returned (now in-quota), the preemptions
    with each victim as the caller held it, the allocations admitted (as stored), and the resizes
    (shrinks, then growths) with each run's new allocation as stored."""

    returned: tuple[Allocation, ...] = ()
    preempted: tuple[tuple[Preempt, Allocation], ...] = ()
    admitted: tuple[Allocation, ...] = ()
    resized: tuple[tuple[Resize, Allocation], ...] = ()

    @property
    def requeued(self) -> list[Request]:
        """The preempted requests, to wait again (a preempted request resumes first)."""
        return [p.requeued() for p, _ in self.preempted]


def apply_cycle(
    result: CycleResult,
    state: ClusterState,
    allocations: MutableMapping[str, Allocation],
    *,
    confirm: bool = False,
    balances: quota.Balances | None = None,
    book: quota.QuotaBook | None = None,
) -> Applied:
    """Apply `result` to `state` and `allocations` (and to `balances` kept for `book`, when given):
    returns, then preemptions, then shrinks, then admissions, then growths. `confirm` stores the admitted allocations as
    confirmed (a caller that launches at once, as the simulator does).

    Checked before anything changes: a return or victim the map does not hold, or an admission of a
    request it already holds, or a resize of a run it does not hold as the resize's `old`, is a bug in
    the caller's bookkeeping and raises `ValueError`."""
    if (balances is None) != (book is None):
        raise ValueError("apply_cycle keeps balances only with their quota book: pass both or neither")
    _check(result, allocations)
    returned = []
    for r in result.returns:
        before = allocations[r.request_id]
        after = allocations[r.request_id] = replace(before, borrowed=False)
        _recharge(book, balances, before, after)
        returned.append(after)
    preempted = []
    for p in result.preempts:
        victim = allocations.pop(p.victim.id)
        state.release(victim.placement)
        _recharge(book, balances, victim, None)
        preempted.append((p, victim))
    resized = []

    def resize(r: Resize) -> None:
        old = allocations[r.old.id]
        new = replace(r.new, confirmed=True) if confirm else r.new
        state.release(old.placement)
        state.apply(new.placement)
        allocations[new.id] = new
        _recharge(book, balances, old, new)
        resized.append((r, new))

    for rz in result.resizes:
        if rz.kind is ResizeKind.SHRINK:
            resize(rz)
    admitted = []
    for a in result.admits:
        allocation = replace(a.allocation, confirmed=True) if confirm else a.allocation
        state.apply(allocation.placement)
        allocations[allocation.id] = allocation
        _recharge(book, balances, None, allocation)
        admitted.append(allocation)
    for rz in result.resizes:
        if rz.kind is ResizeKind.GROW:
            resize(rz)
    return Applied(tuple(returned), tuple(preempted), tuple(admitted), tuple(resized))


def pending_after(pending: Iterable[Request], result: CycleResult) -> list[Request]:
    """The requests still waiting after a cycle: held ones (not never-fits) plus the preempted
    victims, requeued; a request held `deferred` is marked so (it goes first in its tier next
    cycle), and one held for any other reason is not."""
    admitted = {a.request_id for a in result.admits}
    reasons = {h.request_id: h.reason for h in result.holds}
    still = []
    for r in pending:
        reason = reasons.get(r.id)
        if r.id in admitted or reason is HoldReason.NEVER_FITS:
            continue
        deferred = reason is HoldReason.DEFERRED
        still.append(r if r.deferred == deferred else replace(r, deferred=deferred))
    return still + [p.requeued() for p in result.preempts]


def _check(result: CycleResult, allocations: MutableMapping[str, Allocation]) -> None:
    # What the caller will hold after each step, as `allocations` less the victims plus the admitted,
    # without copying the map (a fill holds every admission ever made): O(decisions).
    gone: set[str] = set()
    added: set[str] = set()
    for r in result.returns:
        if r.request_id not in allocations:
            raise ValueError(f"the cycle returns {r.request_id}, which the caller's allocations do not hold")
    for p in result.preempts:
        if p.victim.id not in allocations or p.victim.id in gone:
            raise ValueError(f"the cycle preempts {p.victim.id}, which the caller's allocations do not hold")
        gone.add(p.victim.id)
    for a in result.admits:
        rid = a.request_id
        if rid in added or (rid in allocations and rid not in gone):
            raise ValueError(f"the cycle admits {rid}, which the caller's allocations already hold")
        added.add(rid)
    resized: set[str] = set()
    for rz in result.resizes:
        rid = rz.old.id
        held = allocations.get(rid)
        if held is None or rid in gone or rid in resized or held.placement != rz.old.placement:
            raise ValueError(f"the cycle resizes {rid}, which the caller's allocations do not hold as it was")
        resized.add(rid)


def _recharge(
    book: quota.QuotaBook | None, balances: quota.Balances | None, old: Allocation | None, new: Allocation | None
) -> None:
    if book is None or balances is None:
        return
    if old is not None:
        quota.charge_allocation(book, balances, old, -old.milli)
    if new is not None:
        quota.charge_allocation(book, balances, new)
