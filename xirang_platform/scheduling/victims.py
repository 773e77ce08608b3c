"""The victims of one cycle: the running allocations a request may preempt, and the victim lists the
preemption planner reads (DESIGN.md section 5.2; the rules themselves: `preemption.victim_reason`,
`candidates.victim_cost`)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from operator import attrgetter

from xirang_platform.scheduling import quota
from xirang_platform.scheduling.candidates import Candidates, VictimCost, victim_cost
from xirang_platform.scheduling.config import SchedulerConfig
from xirang_platform.scheduling.model import Allocation, Placement, PreemptReason, Request
from xirang_platform.scheduling.preemption import victim_reason
from xirang_platform.scheduling.state import ClusterState

_START = attrgetter("start")


class CycleVictims:
    """What one cycle may preempt, listed on first need, and per kind of request the victim list
    sorted once (`Candidates`), kept up to date as the cycle admits (`taken`) and preempts (`gone`)."""

    def __init__(
        self,
        allocations: Mapping[str, Allocation],
        now: float,
        config: SchedulerConfig,
        reclaimable: dict[str, Allocation] | None = None,
    ) -> None:
        self.allocations, self.now, self.config = allocations, now, config
        self._reclaimable = reclaimable  # given when a memo kept them
        self._preemptible: dict[str, Allocation] | None = None
        self._oldest_start: float | None = None
        self._tenants: set[str] | None = None  # tenants with preemptible work at the cycle's start
        self._any_borrowed: bool | None = None  # whether any of it is borrowed
        self._borrowers: dict[float, set[str]] = {}  # per minimum runtime: tenants with borrowed work that old
        # Victim lists per what decides them (tenant, tier, whether under its cap).
        self.tables: dict[tuple, Candidates] = {}
        self.single_costs: dict[str, VictimCost] = {}

    @property
    def reclaimable(self) -> dict[str, Allocation]:
        """The snapshot's allocations that may ever be preempted (`quota.is_reclaimable`), by id."""
        if self._reclaimable is None:
            self._reclaimable = {a.id: a for a in self.allocations.values() if quota.is_reclaimable(a)}
        return self._reclaimable

    @property
    def listed_reclaimable(self) -> dict[str, Allocation] | None:
        """`reclaimable` if it was listed this cycle or handed over by a memo, else None (lists nothing)."""
        return self._reclaimable

    @property
    def preemptible(self) -> dict[str, Allocation]:
        """Allocations that may be victims at all this cycle (reclaimable, past the smallest minimum
        runtime of any tier; `candidates` applies the preemptor's own)."""
        if self._preemptible is None:
            youngest = self.config.min_runtimes()[0]
            self._preemptible = {
                a.id: a for a in sorted(self.reclaimable.values(), key=lambda a: a.id) if self.now - a.start >= youngest
            }
        return self._preemptible

    def none_for(
        self,
        request: Request,
        book: quota.QuotaBook,
        balances: Mapping[quota.AccountKey, quota.Balance],
        ratio: float,
    ) -> bool:
        """Whether `request` can have no victim at all (then there is no plan, and no victim list
        needs to be built): every reclaimable allocation is younger than its tier's minimum runtime;
        or, for a tier that may not preempt (it may only reclaim), its accounts are not under their
        caps or no other tenant has borrowed work old enough (`victim_reason`'s rules)."""
        min_runtime = self.config.min_runtime_for(request.tier.rules)
        if self._oldest_start is None:
            self._oldest_start = min(map(_START, self.reclaimable.values()), default=math.inf)
        if self.now - self._oldest_start < min_runtime:
            return True
        if request.tier.rules.may_preempt:
            return False
        if not quota.under_cap(book, balances, request.tenant, request.project, ratio):
            return True
        if min_runtime not in self._borrowers:  # victims preempted later only shrink it: still a superset
            old_enough = (a for a in self.reclaimable.values() if a.borrowed and self.now - a.start >= min_runtime)
            self._borrowers[min_runtime] = {a.request.tenant for a in old_enough}
        return not self._borrowers[min_runtime] - {request.tenant}

    def cost(self, victims: Sequence[Allocation]) -> VictimCost:
        """`victim_cost` at the cycle's time."""
        if len(victims) == 1:  # single victims are costed again and again: once per cycle is enough
            only = victims[0]
            known = self.single_costs.get(only.id)
            if known is None:
                known = self.single_costs[only.id] = victim_cost(victims, self.now, self.config.checkpoint_interval_s)
            return known
        return victim_cost(victims, self.now, self.config.checkpoint_interval_s)

    def table(
        self,
        request: Request,
        state: ClusterState,
        book: quota.QuotaBook,
        balances: Mapping[quota.AccountKey, quota.Balance],
        ratio: float,
    ) -> Candidates:
        """The victims `request` may preempt, cheapest first, shared by every request that has the
        same answer to each question `victim_reason` asks."""
        under = quota.under_cap(book, balances, request.tenant, request.project, ratio)
        # A tenant without preemptible work of its own sees every victim as another tenant's: the
        # same list whichever such tenant asks.
        if self._tenants is None:
            self._tenants = {a.request.tenant for a in self.preemptible.values()}
        who = request.tenant if request.tenant in self._tenants else None
        if self._any_borrowed is None:
            self._any_borrowed = any(a.borrowed for a in self.preemptible.values())
        if not self._any_borrowed:
            # Who asks and whether under its cap only decide borrowed victims (`victim_reason`);
            # victims preempted later only shrink the list, so none turn up.
            who, under = None, False
        key = (who, request.tier.rank, request.tier.rules.may_preempt, under)
        table = self.tables.get(key)
        if table is None:
            listed = list(self.candidates(request, book, balances, ratio))
            # Kinds of request that may preempt the same victims share the list (all of it where
            # the reasons are the same too: then their plans are the same).
            for other in self.tables.values():
                same, same_reasons = other.lists(listed)
                if same:
                    table = other if same_reasons else other.relisted(listed)
                    break
            else:
                table = Candidates(state, listed, self.cost)
            self.tables[key] = table
        return table

    def candidates(
        self,
        request: Request,
        book: quota.QuotaBook,
        balances: Mapping[quota.AccountKey, quota.Balance],
        ratio: float,
    ) -> Iterator[tuple[Allocation, PreemptReason]]:
        """Allocations `request` may preempt now, with the reason: never one admitted in this cycle or
        younger than the minimum runtime of the request's tier."""
        under = quota.under_cap(book, balances, request.tenant, request.project, ratio)
        min_runtime = self.config.min_runtime_for(request.tier.rules)
        for a in self.preemptible.values():
            if self.now - a.start < min_runtime:
                continue
            reason = victim_reason(request, a, book, balances, ratio, under)
            if reason is not None:
                yield a, reason

    def taken(self, placement: Placement) -> None:
        """The cycle admitted `placement`: no victim list may count on its units."""
        for table in self._distinct():
            table.taken(placement)

    def gone(self, victim: Allocation) -> None:
        """The cycle preempted `victim`: no later plan lists it."""
        del self.preemptible[victim.id]
        for table in self._distinct():
            table.freed(victim)

    def _distinct(self) -> Iterator[Candidates]:
        """Each victim list once, and none that shares its live victims with another (`relisted`)."""
        seen: set[int] = set()
        for table in self.tables.values():
            if table.origin is None and id(table) not in seen:
                seen.add(id(table))
                yield table


class Headroom:
    """The in-quota milli `request` may take once victims are gone (`victim_sets.CapRoom`): per
    account it is charged to, the cap at the ratio of the allocation the victims leave, less what
    it holds, plus what the victims give back in quota (the book's one rule, `keys_for`). Built once
    per plan; each answer is a few integer operations, so the search may ask it at every step."""

    def __init__(
        self,
        request: Request,
        state: ClusterState,
        book: quota.QuotaBook,
        balances: Mapping[quota.AccountKey, quota.Balance],
        config: SchedulerConfig,
    ) -> None:
        self.book, self.policy = book, config.overcommit
        self.allocated, self.capacity = state.allocated_milli, state.capacity_milli
        self.keys = [key for key in book.keys_for(request.tenant, request.project) if key in balances]
        self.balances = [balances[key] for key in self.keys]
        self.accounts = len(self.keys)
        self._charged: dict[tuple[str, str], tuple[bool, ...]] = {}

    def relief(self, victim: Allocation) -> tuple[int, ...]:
        """Per account of the request, the in-quota milli `victim` gives back to it."""
        if victim.borrowed:
            return (0,) * self.accounts
        owner = (victim.request.tenant, victim.request.project)
        charged = self._charged.get(owner)
        if charged is None:
            theirs = self.book.keys_for(*owner)
            charged = self._charged[owner] = tuple(key in theirs for key in self.keys)
        return tuple(victim.milli if c else 0 for c in charged)

    def after(self, freed: int, relieved: Sequence[int]) -> int:
        """The room once `freed` milli are released, `relieved` of them per account in-quota."""
        if not self.balances:
            return 0
        ratio = self.policy.ratio((self.allocated - freed) / self.capacity if self.capacity else 0.0)
        return min(quota.cap(b.quota, ratio) - b.in_quota + r for b, r in zip(self.balances, relieved, strict=True))
