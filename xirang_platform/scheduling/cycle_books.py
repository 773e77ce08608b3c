"""The books of one scheduling cycle (`CycleBooks`): its private copy of capacity and balances, the
decisions it made so far, and the one way each decision is recorded (`_admit_on`, `_preempt`,
`_return`, `_hold`), which keeps the copy, the balances and the cache (`cycle_cache.CycleCache`) in
step with them. The rules that decide (DESIGN.md section 5) are `cycle._CycleRun`'s, built on these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from xirang_platform.scheduling import quota
from xirang_platform.scheduling.config import SchedulerConfig
from xirang_platform.scheduling.cycle_cache import CycleCache
from xirang_platform.scheduling.cycle_memo import CycleMemo, applied, carried_books
from xirang_platform.scheduling.holds import HoldOutcome, MessageBuilder
from xirang_platform.scheduling.lending import Lending
from xirang_platform.scheduling.model import (
    Admit,
    Allocation,
    Hold,
    HoldReason,
    Placement,
    Preempt,
    PreemptReason,
    Request,
    Return,
)
from xirang_platform.scheduling.order import Queues
from xirang_platform.scheduling.preemption.planner import PreemptionPlanner
from xirang_platform.scheduling.preemption.scope_search import Steps
from xirang_platform.scheduling.preemption.victims import CycleVictims
from xirang_platform.scheduling.snapshot import Snapshot
from xirang_platform.scheduling.state import ClusterState
from xirang_platform.scheduling.tiers import TIERS_IN_ORDER


@dataclass
class CycleBooks:
    """The working state of one cycle: a private copy of capacity, allocations and balances, and the
    decisions so far."""

    snapshot: Snapshot
    now: float
    config: SchedulerConfig
    memo: CycleMemo | None = None
    out_of_time: Callable[[], bool] | None = None  # the live tick's wall-clock guard (DESIGN.md 5.6)
    state: ClusterState = field(init=False)
    balances: quota.Balances = field(init=False)
    start_balances: quota.Balances = field(init=False)
    start_ratio: float = field(init=False)
    priority: np.ndarray = field(init=False)
    admitted_milli: list[int] = field(default_factory=lambda: [0] * len(TIERS_IN_ORDER))  # per tier rank
    admits: list[Admit] = field(default_factory=list)
    preempts: list[Preempt] = field(default_factory=list)
    holds: list[Hold] = field(default_factory=list)
    returns: list[Return] = field(default_factory=list)
    queues: Queues | None = None  # the pending queues, once ordered
    victims: CycleVictims = field(init=False)
    steps: Steps = field(init=False)  # the preemption planner's budget (`SchedulerConfig.plan_steps_*`)
    planner: PreemptionPlanner = field(init=False)
    lending: Lending = field(init=False)
    cache: CycleCache = field(init=False)  # every answer the cycle re-uses (`cycle_cache`)
    class_no: int = -1  # the class of the request being considered (`CycleCache.class_of`)
    last_hold: HoldOutcome | None = None  # the hold the request being considered met, if any
    _ratio_at: int | None = None  # the allocated milli `_ratio` was computed at
    _ratio: float = 0.0
    _seen_ratio: float = 0.0  # the ratio the epoch last moved at

    def __post_init__(self) -> None:
        self.state = self.snapshot.state.copy()
        self.state.gpu_model_order = self.config.gpu_model_order  # placement on this copy follows it
        # Nothing here walks every allocation unless it has to: a caller that keeps balances (the
        # simulator's fill mode) hands them over, a memo is brought up to date by the difference, and
        # victims are listed only when preemption is tried.
        given, memo = self.snapshot.balances, self.memo
        carried, reclaimable = carried_books(memo, self.snapshot.allocations) if memo is not None else (None, None)
        if given is not None:
            self.balances = dict(given)
        elif carried is not None:
            self.balances = carried
        else:
            self.balances = quota.balances_from(self.book, self.snapshot.allocations.values())
        self.victims = CycleVictims(self.snapshot.allocations, self.now, self.config, reclaimable)
        self.lending = Lending(self.snapshot, self.config, self.now)
        self.start_balances = dict(self.balances)
        self.start_ratio = self._seen_ratio = self.ratio
        self.priority = self.config.node_priority(len(self.state.names))
        self.steps = Steps(self.config.plan_steps_per_request, self.config.plan_steps_per_cycle, self.out_of_time)
        self.planner = PreemptionPlanner(self.victims, self.config.scorer, self.priority, self.steps)
        self.cache = CycleCache(memo, self.state, self.config, self.priority)

    @property
    def book(self) -> quota.QuotaBook:
        return self.snapshot.book

    @property
    def ratio(self) -> float:
        """The cap ratio at the cluster's allocation right now (it moves as the cycle admits)."""
        allocated = self.state.allocated_milli
        if allocated != self._ratio_at:  # computed again only when the allocation moved
            self._ratio_at, self._ratio = allocated, self.config.overcommit.ratio(self.state.allocated_fraction)
        return self._ratio

    def headroom(self, request: Request) -> int:
        """In-quota milli `request` may still take now (negative when its account is past its cap)."""
        return quota.headroom(self.book, self.balances, request.tenant, request.project, self.ratio)

    def may_borrow(self, request: Request) -> bool:
        """Whether `request` may run past its cap now (`lending.Lending.may_borrow`)."""
        return self.lending.may_borrow(request, self.balances, self.state)

    def _admit_on(self, request: Request, placement: Placement, headroom: int | None = None) -> Allocation:
        """Admit `request` on `placement`, in quota if it fits its caps there, else borrowed (the
        one place where an admission is checked against its caps, on the placement it gets).
        `headroom`: the request's headroom now, where the caller has it."""
        milli = placement.milli
        borrowed = milli > (self.headroom(request) if headroom is None else headroom)
        if borrowed and not self.may_borrow(request):
            raise AssertionError(f"{request.id} would be admitted past its cap but may not borrow: a scheduler bug")
        allocation = Allocation(request, placement, self.now, borrowed, False)  # not confirmed yet
        self.state.apply(placement)
        self.victims.taken(placement)
        self.cache.capacity_taken()
        self._charge(allocation, milli)
        self.admits.append(Admit(allocation))
        self.admitted_milli[request.tier.rank] += milli
        return allocation

    def _preempt(self, victim: Allocation, request: Request, reason: PreemptReason) -> None:
        """Stop `victim` for `request`: its units are free and its accounts no longer charged."""
        self.state.release(victim.placement)
        self._uncharge(victim)
        self.victims.gone(victim)
        self.preempts.append(Preempt(victim, request.id, reason, self.now))

    def _return(self, a: Allocation) -> None:
        """Turn the borrowed `a` in-quota."""
        self._uncharge(a)
        self._charge(replace(a, borrowed=False))
        self.returns.append(Return(a.id, a.milli))

    def _hold(self, request: Request, reason: HoldReason, token: object, build: MessageBuilder | None = None) -> None:
        """Hold `request`; its message is `build(request, token)` (None: `token` is the message), built
        only when the request's last hold (in the memo) had another reason, token or request."""
        outcome = HoldOutcome(reason, token, build)
        self.holds.append(self.cache.hold(request, outcome, self.class_no))
        self.last_hold = outcome

    def _charge(self, a: Allocation, milli: int | None = None) -> None:
        """Charge `a` (`milli`: its milli, where the caller has it) to its accounts."""
        quota.charge_allocation(self.book, self.balances, a, milli)
        self._moved(a)

    def _uncharge(self, a: Allocation) -> None:
        quota.charge_allocation(self.book, self.balances, a, -a.milli)
        self._moved(a)

    def _moved(self, a: Allocation) -> None:
        """Balances of `a`'s tenant moved (and maybe the cap ratio): the holds its classes met no longer stand."""
        self.cache.tenant_moved(a.request.tenant)
        ratio = self.ratio
        if ratio != self._seen_ratio:
            self._seen_ratio = ratio
            self.cache.new_epoch()

    def _memo(self) -> CycleMemo:
        """This cycle's end, as its decisions leave the pool, for the next cycle (`cycle_memo`). The books
        (allocations, balances, reclaimable) are carried only when this cycle kept them itself: a
        caller that hands over its balances (fill mode, the replay) and a cycle that listed no victim
        leave nothing to carry, so a cycle costs the same with 10 allocations running as with 10,000."""
        allocations: Mapping[str, Allocation] | None = None
        balances: quota.Balances | None = None
        reclaimable = self.victims.listed_reclaimable
        if reclaimable is not None or self.snapshot.balances is None:
            allocations, reclaimable = applied(
                self.snapshot.allocations, reclaimable, self.preempts, self.returns, self.admits
            )
            balances = self.balances
        return CycleMemo(
            pool=self.snapshot.pool,
            book=self.book,
            config=self.config,
            state=self.state,
            allocations=allocations,
            balances=balances,
            reclaimable=reclaimable,
            no_fit=self.cache.misses_to_carry(),
            never_fits=self.cache.never_fits_seen,
            queues=self.queues,
            holds=self.cache.kept_holds,
            classes=self.cache.class_numbers,
        )
