"""One scheduling cycle: `cycle(snapshot, pending, now, config) -> CycleResult` (DESIGN.md section 5).

Pure and deterministic: it works on a copy of the snapshot's state, reads no clock but `now`, and
returns its decisions as data. The simulator and the Dagster layer call this same function and
apply the decisions themselves (preempts before admits).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from xirang_platform.scheduling import quota
from xirang_platform.scheduling.config import DEFAULT_CONFIG, SchedulerConfig
from xirang_platform.scheduling.feasibility import eligible_nodes
from xirang_platform.scheduling.model import (
    Admit,
    Allocation,
    CycleResult,
    Hold,
    HoldReason,
    Preempt,
    PreemptReason,
    Request,
    Return,
)
from xirang_platform.scheduling.order import queue_order
from xirang_platform.scheduling.placement import fits, is_single_node, place, usable_whole_gpus
from xirang_platform.scheduling.preemption import plan_preemption, victim_reason
from xirang_platform.scheduling.snapshot import Snapshot
from xirang_platform.scheduling.state import ClusterState


def cycle(
    snapshot: Snapshot, pending: Sequence[Request], now: float, config: SchedulerConfig = DEFAULT_CONFIG
) -> CycleResult:
    """Decide, for every pending request, admit (maybe after preempting), or hold with a reason."""
    run = _CycleRun(snapshot, now, config)
    # 1. Borrowed allocations whose accounts are back under their caps turn in-quota.
    run.return_borrowed()
    # 2. Order: tier, resumed first, fair share between tenants, submit time, id; 3. admit what fits.
    for request in queue_order(pending, snapshot.book, run.balances):
        run.consider(request)
    return run.result()


@dataclass
class _CycleRun:
    """The working state of one cycle: a private copy of capacity, allocations and balances."""

    snapshot: Snapshot
    now: float
    config: SchedulerConfig
    state: ClusterState = field(init=False)
    balances: quota.Balances = field(init=False)
    returned: dict[str, Allocation] = field(default_factory=dict)  # borrowed allocations now in-quota
    priority: np.ndarray = field(init=False)
    allowed: np.ndarray | None = None  # nodes open to backfill; None = all
    reserved_for: str | None = None
    admits: list[Admit] = field(default_factory=list)
    preempts: list[Preempt] = field(default_factory=list)
    holds: list[Hold] = field(default_factory=list)
    returns: list[Return] = field(default_factory=list)
    # Shapes that found no room (or no preemption plan) since capacity last grew: admissions only
    # take capacity, so a miss stays a miss until a preemption frees some.
    no_fit: set[tuple] = field(default_factory=set)
    no_plan: set[tuple] = field(default_factory=set)
    never_fits_memo: dict[tuple, bool] = field(default_factory=dict)
    fits_anywhere: dict[tuple, bool] = field(default_factory=dict)  # for hold reasons; reset on admit
    _preemptible: dict[str, Allocation] | None = None  # possible victims by id, listed on first need
    capacity_state: ClusterState | None = None

    def __post_init__(self) -> None:
        self.state = self.snapshot.state.copy()
        # Nothing here walks every allocation unless it has to: a caller that keeps balances (the
        # simulator's fill mode) hands them over, and victims are listed only when preemption is tried.
        given = self.snapshot.balances
        self.balances = (
            dict(given) if given is not None else quota.balances_from(self.book, self.snapshot.allocations.values())
        )
        self.priority = self.config.node_priority(len(self.state.names))

    @property
    def book(self) -> quota.QuotaBook:
        return self.snapshot.book

    @property
    def ratio(self) -> float:
        """The cap ratio at the cluster's allocation right now (it moves as the cycle admits)."""
        return self.config.overcommit.ratio(self.state.allocated_fraction)

    def return_borrowed(self) -> None:
        """Step 1: automatic return, oldest first."""
        if not any(b.borrowed for b in self.balances.values()):
            return
        borrowed = [a for a in self.snapshot.allocations.values() if a.borrowed]
        for a in quota.returnable(self.book, self.balances, borrowed, self.ratio):
            self._uncharge(a)
            self.returned[a.id] = replace(a, borrowed=False)
            self._charge(self.returned[a.id])
            self.returns.append(Return(a.id, a.milli))

    @property
    def preemptible(self) -> dict[str, Allocation]:
        """Allocations that may be victims at all this cycle (reclaimable, past the minimum runtime)."""
        if self._preemptible is None:
            current = (self.returned.get(a.id, a) for a in self.snapshot.allocations.values())
            self._preemptible = {
                a.id: a
                for a in sorted(current, key=lambda a: a.id)
                if quota.is_reclaimable(a) and self.now - a.start >= self.config.min_runtime_s
            }
        return self._preemptible

    def consider(self, request: Request) -> None:
        """Quota check, placement, and if needed a preemption plan, for one request."""
        check = quota.check(self.book, self.balances, request, self.ratio)
        if check.verdict is quota.Verdict.UNKNOWN_ACCOUNT:
            self._hold(request, HoldReason.UNKNOWN_ACCOUNT, check.message)
            return
        if check.verdict is not quota.Verdict.OVER_QUOTA:
            placement = self._place(request)
            if placement is not None and placement.milli != request.total_milli:
                # Rounded up to whole compute units: the quota check counts what is really held.
                check = quota.check(self.book, self.balances, request, self.ratio, placement.milli)
            if placement is not None and check.verdict is not quota.Verdict.OVER_QUOTA:
                self._admit(request, placement, borrowed=check.verdict is quota.Verdict.BORROW)
                return
        if self._never_fits(request):
            self._hold(request, HoldReason.NEVER_FITS, _never_fits_message(request))
            return
        if self._try_preemption(request, check):
            return
        if check.verdict is quota.Verdict.OVER_QUOTA:
            self._hold(request, HoldReason.OVER_QUOTA, check.message)
            return
        self._guard_starving_gang(request)
        blocked = self.allowed is not None and self.reserved_for != request.id
        reason = (
            HoldReason.RESERVED_FOR_GANG if blocked and self._fits_ignoring_reservation(request) else HoldReason.NO_FIT
        )
        message = (
            f"units are held back for the starving gang {self.reserved_for}"
            if reason is HoldReason.RESERVED_FOR_GANG
            else f"no free units fit {_shape_text(request)} now; it waits for capacity"
        )
        self._hold(request, reason, message)

    def result(self) -> CycleResult:
        return CycleResult(
            admits=tuple(self.admits),
            preempts=tuple(self.preempts),
            holds=tuple(self.holds),
            returns=tuple(self.returns),
            reserved_for=self.reserved_for,
        )

    # -- placement ---------------------------------------------------------------------------

    def _place(self, request: Request):
        allowed = None if self.reserved_for == request.id else self.allowed
        shape = (request.shape, allowed is None)
        if shape in self.no_fit:
            return None
        found = place(self.state, request, self.config.scorer, self.priority, allowed)
        if found is None:
            self.no_fit.add(shape)
        return found

    def _fits_ignoring_reservation(self, request: Request) -> bool:
        shape = request.shape
        if shape not in self.fits_anywhere:
            self.fits_anywhere[shape] = fits(self.state, request, self.priority)
        return self.fits_anywhere[shape]

    def _never_fits(self, request: Request) -> bool:
        """Whether no node or domain of the pool could hold the request even with nothing running."""
        shape = request.shape
        if shape not in self.never_fits_memo:
            if self.capacity_state is None:
                self.capacity_state = self.state.empty_like()
            empty = place(self.capacity_state, request, self.config.scorer, self.priority)
            self.never_fits_memo[shape] = empty is None
        return self.never_fits_memo[shape]

    # -- preemption ----------------------------------------------------------------------------

    def _try_preemption(self, request: Request, check: quota.QuotaCheck) -> bool:
        """Plan and record a preemption for `request`; True if it was admitted that way."""
        if not self.config.preemption:
            return False
        if check.verdict is quota.Verdict.BORROW and not request.tier.rules.may_preempt:
            return False  # past its cap, a tier that may not preempt runs on idle units only
        key = (request.shape, request.tenant, request.project, check.verdict)
        if key in self.no_plan:
            return False
        candidates = list(self._victim_candidates(request))
        if not candidates:
            self.no_plan.add(key)
            return False

        def quota_ok(victims: Sequence[Allocation], milli: int) -> bool:
            relieved = dict(self.balances)
            for v in victims:
                for key in self.book.keys_for(v.request.tenant, v.request.project):
                    if key in relieved:
                        relieved[key] = quota.charge(
                            relieved[key], -v.milli, borrowed=v.borrowed, confirmed=v.confirmed
                        )
            return quota.check(self.book, relieved, request, self.ratio, milli).verdict is quota.Verdict.IN_QUOTA

        plan = plan_preemption(self.state, request, candidates, quota_ok, self.config.scorer, self.priority)
        if plan is None:
            self.no_plan.add(key)
            return False
        for victim, reason in plan.victims:
            self.state.release(victim.placement)
            self._uncharge(victim)
            del self.preemptible[victim.id]
            self.preempts.append(Preempt(victim, request.id, reason))
        self.no_fit.clear()  # capacity grew: earlier misses may fit now
        self.no_plan.clear()
        self.fits_anywhere.clear()
        self._admit(request, plan.placement, borrowed=False)
        return True

    def _victim_candidates(self, request: Request) -> Iterator[tuple[Allocation, PreemptReason]]:
        """Allocations `request` may preempt now, with the reason: never one admitted in this cycle or
        younger than the minimum runtime."""
        ratio = self.ratio
        for a in self.preemptible.values():
            reason = victim_reason(request, a, self.book, self.balances, ratio)
            if reason is not None:
                yield a, reason

    # -- starvation guard ----------------------------------------------------------------------

    def _guard_starving_gang(self, request: Request) -> None:
        """Hold units back from backfill for the first gang that has waited past the bound."""
        if self.reserved_for is not None or request.gpus <= 1:
            return
        if self.now - request.submit_time < self.config.starvation_wait_s:
            return
        scope = _reservation_scope(self.state, request, self.priority)
        if scope is None:
            return
        self.reserved_for = request.id
        self.allowed = ~scope
        self.no_fit.clear()

    # -- bookkeeping ---------------------------------------------------------------------------

    def _admit(self, request: Request, placement, *, borrowed: bool) -> None:
        allocation = Allocation(request, placement, start=self.now, borrowed=borrowed, confirmed=False)
        self.state.apply(placement)
        self.fits_anywhere.clear()
        self._charge(allocation)
        self.admits.append(Admit(allocation))

    def _hold(self, request: Request, reason: HoldReason, message: str) -> None:
        self.holds.append(Hold(request.id, reason, message))

    def _charge(self, a: Allocation) -> None:
        self._apply_charge(a, a.milli)

    def _uncharge(self, a: Allocation) -> None:
        self._apply_charge(a, -a.milli)

    def _apply_charge(self, a: Allocation, milli: int) -> None:
        quota.charge_allocation(self.book, self.balances, a, milli)


def _reservation_scope(state: ClusterState, request: Request, priority: np.ndarray) -> np.ndarray | None:
    """Nodes to hold back for a starving gang: the node (single-node gang) or (domain, model)
    group that already has the most usable whole GPUs and could hold the gang when empty."""
    eligible = eligible_nodes(state, request)
    usable = usable_whole_gpus(state, request, eligible)
    if is_single_node(request):
        big_enough = np.flatnonzero(eligible & (state.gpu_count >= request.gpus))
        if len(big_enough) == 0:
            return None
        best = big_enough[np.lexsort((priority[big_enough], -usable[big_enough]))[0]]
        mask = np.zeros(len(state.names), dtype=bool)
        mask[best] = True
        return mask
    best_key, best_mask = None, None
    for domain, model in sorted(
        {(int(d), int(m)) for d, m in zip(state.domain_id[eligible], state.model_id[eligible], strict=True)}
    ):
        mask = eligible & (state.domain_id == domain) & (state.model_id == model)
        if state.gpu_count[mask].sum() < request.gpus:
            continue
        key = (-int(usable[mask].sum()), domain, model)
        if best_key is None or key < best_key:
            best_key, best_mask = key, mask
    return best_mask


def _shape_text(r: Request) -> str:
    gpu = f"{r.gpus} GPU" if r.whole_gpus else f"{r.milli_per_gpu} milli-GPU"
    return f"{r.id} ({r.tier.value}, {gpu}, {r.cpu_milli} milli-CPU, {r.memory_mib} MiB)"


def _never_fits_message(r: Request) -> str:
    if is_single_node(r):
        rule = "one node"
    elif r.tier.rules.mixed_fallback:
        rule = "the whole pool"
    else:
        rule = "one interconnect domain of one GPU model"
    constraints = []
    if r.gpu_models:
        constraints.append(f"models {sorted(r.gpu_models)}")
    if r.min_compute_level:
        constraints.append(f"compute level >= {r.min_compute_level}")
    if r.gpu_memory_mib:
        constraints.append(f">= {r.gpu_memory_mib} MiB GPU memory")
    extra = f" with {', '.join(constraints)}" if constraints else ""
    return (
        f"{_shape_text(r)} cannot fit on {rule}{extra} of this pool even when it is empty; "
        "ask for fewer GPUs, CPU or memory, or relax the GPU model / compute level / memory tags"
    )


def apply_result(state: ClusterState, allocations: dict[str, Allocation], result: CycleResult) -> None:
    """Apply a cycle's decisions to a caller's state and allocation map: returns, preempts, admits
    (the order the cycle made them in: a returned allocation may still be preempted later)."""
    for r in result.returns:
        allocations[r.request_id] = replace(allocations[r.request_id], borrowed=False)
    for p in result.preempts:
        state.release(p.victim.placement)
        del allocations[p.victim.id]
    for a in result.admits:
        state.apply(a.allocation.placement)
        allocations[a.request_id] = a.allocation


def pending_after(pending: Iterable[Request], result: CycleResult) -> list[Request]:
    """The requests still waiting after a cycle: held ones (not never-fits) plus preempted victims, requeued."""
    admitted = {a.request_id for a in result.admits}
    dropped = {h.request_id for h in result.holds if h.reason is HoldReason.NEVER_FITS}
    still = [r for r in pending if r.id not in admitted and r.id not in dropped]
    still.extend(replace(p.victim.request, preempted=p.victim.request.preempted + 1) for p in result.preempts)
    return still
