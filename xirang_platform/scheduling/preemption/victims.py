"""Who may be a victim (DESIGN.md section 5.2): the rule for one victim (`victim_reason`), the
victims of one cycle in the victim order with the arrays the planner reads (`CycleVictims`), and the
cap room a request has once victims are gone (`Headroom`).

`CycleVictims` lists every allocation that may ever be preempted once per cycle, cheapest first, and
answers per request which of them it may take (`eligible`: a mask, one per kind of request) and, per
mask, the pool as it would be with all of them gone (`potential`), kept up to date as the cycle admits
(`taken`) and preempts (`gone`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from operator import attrgetter

import numpy as np

from xirang_platform.scheduling import quota
from xirang_platform.scheduling.config import SchedulerConfig
from xirang_platform.scheduling.model import Allocation, NodeShare, Placement, PreemptReason, Request
from xirang_platform.scheduling.preemption.cost import Parts, VictimCost, victim_cost, victim_parts
from xirang_platform.scheduling.preemption.scope_search import CapRoom
from xirang_platform.scheduling.state import ClusterState

_START = attrgetter("start")


def victim_reason(
    request: Request,
    victim: Allocation,
    book: quota.QuotaBook,
    balances: Mapping[quota.AccountKey, quota.Balance],
    ratio: float,
    under_cap: bool | None = None,
) -> PreemptReason | None:
    """Why `request` may preempt `victim`, or None if it may not (`reason_for`); `under_cap`: whether
    the request's accounts are under their caps, when the caller already knows."""
    if under_cap is None:
        under_cap = quota.under_cap(book, balances, request.tenant, request.project, ratio)
    return reason_for(request, victim, under_cap)


def reason_for(request: Request, victim: Allocation, under_cap: bool) -> PreemptReason | None:
    """The rule (`CycleVictims.eligible` applies it to every victim at once):

    - P0/P1 may preempt any P2 work and any borrowed work (priority; reclaim when the victim
      borrowed from another tenant);
    - any request whose accounts are under their caps (`under_cap`) may reclaim another tenant's
      borrowed work.
    """
    if not quota.is_reclaimable(victim):
        return None
    if victim.borrowed and victim.request.tenant != request.tenant and under_cap:
        return PreemptReason.RECLAIM
    if request.tier.rules.may_preempt and (victim.borrowed or victim.request.tier.rank > request.tier.rank):
        return PreemptReason.PRIORITY
    return None


class CycleVictims:
    """What one cycle may preempt: the allocations that may ever be preempted (`reclaimable`) and,
    listed on the first plan, those past the smallest minimum runtime, cheapest first (positions in
    that order are what the planner works with), with per victim its cost alone (`parts`), GPU milli,
    owner, tier, start, nodes, and whether it is still running in this cycle (`active`)."""

    def __init__(
        self,
        allocations: Mapping[str, Allocation],
        now: float,
        config: SchedulerConfig,
        reclaimable: dict[str, Allocation] | None = None,
    ) -> None:
        self.allocations, self.now, self.config = allocations, now, config
        self._reclaimable = reclaimable  # given when a memo kept them
        self._oldest_start: float | None = None
        self._borrowers: dict[float, set[str]] = {}  # per minimum runtime: tenants with borrowed work that old
        self._listed = False
        self._masks: dict[tuple, np.ndarray] = {}  # per kind of request, its victims (live or not)
        self._views: dict[bytes, MaskView] = {}  # per mask, what the planner reads of its live victims
        self._kinds: dict[tuple[str, str], list[tuple[int, list[int]]]] = {}  # `relief_kinds`
        self._reliefs: dict[tuple[str, str], dict[int, tuple[int, ...]]] = {}  # `reliefs_for`
        # Per (request shape, victims, scope), with its rows' stamps then (a victim goes, an admission
        # lands: the stamps change, the scope is searched again): its exact answer, or a floor every
        # set there costs more than (`planner._RequestSearch.run`).
        self.scope_answers: dict[tuple, tuple[bytes, tuple[Parts, tuple[int, ...]] | None, Parts | None]] = {}
        # Per kind of gang request: its groups' stamps and floors (`planner._RequestSearch._gang_floors`).
        self.gang_floors: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

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

    def none_for(
        self,
        request: Request,
        book: quota.QuotaBook,
        balances: Mapping[quota.AccountKey, quota.Balance],
        ratio: float,
    ) -> bool:
        """Whether `request` can have no victim at all (then nothing needs listing): every reclaimable
        allocation is younger than its tier's minimum runtime; or, for a tier that may only reclaim,
        its accounts are not under their caps or no other tenant has borrowed work old enough."""
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
        return victim_cost(victims, self.now, self.config.checkpoint_interval_s)

    def listed(self, state: ClusterState) -> CycleVictims:
        """List the victims (once per cycle; `state` is the cycle's, for node positions)."""
        if self._listed:
            return self
        self._listed = True
        youngest = self.config.min_runtimes()[0]
        old = [a for a in self.reclaimable.values() if self.now - a.start >= youngest]
        interval = self.config.checkpoint_interval_s
        keyed = sorted((victim_parts(a, self.now, interval), a.id, a) for a in old)
        self.ordered: list[Allocation] = [a for _, _, a in keyed]
        self.parts: list[Parts] = [p for p, _, _ in keyed]
        self.parts_rows = np.array(self.parts, dtype=np.int64).reshape(-1, 4)
        self.milli = [a.milli for a in self.ordered]
        self.milli_of = np.array(self.milli, dtype=np.int64)
        self.gpus = [len({(s.node, s.gpu) for s in a.placement.slices}) for a in self.ordered]
        self.position = {a.id: k for k, a in enumerate(self.ordered)}
        self.active = np.ones(len(self.ordered), dtype=bool)
        tenants = sorted({a.request.tenant for a in self.ordered})
        self.tenant_code = {t: k for k, t in enumerate(tenants)}
        self.tenant = np.array([self.tenant_code[a.request.tenant] for a in self.ordered], dtype=np.int64)
        self.borrowed = np.array([a.borrowed for a in self.ordered], dtype=bool)
        self.rank = np.array([a.request.tier.rank for a in self.ordered], dtype=np.int64)
        self.start = np.array([a.start for a in self.ordered], dtype=float)
        index = state.index
        # (victim, node) pairs, victim by victim: where each victim holds units, and how many GPUs there.
        pairs = [(k, index[s.node], gpus) for k, a in enumerate(self.ordered) for s, gpus in _per_node(a.placement)]
        self.pair_victim, self.pair_node, self.pair_gpus = np.array(pairs, dtype=np.int64).reshape(-1, 3).T.copy()
        self.nodes = len(state.names)
        self.on_node: dict[int, list[int]] = {}  # per node, the victims holding units there (ascending)
        self.nodes_of: list[list[int]] = [[] for _ in self.ordered]  # per victim, the nodes it holds
        for k, i in zip(self.pair_victim.tolist(), self.pair_node.tolist(), strict=True):
            self.on_node.setdefault(i, []).append(k)
            self.nodes_of[k].append(i)
        return self

    def eligible(
        self,
        request: Request,
        book: quota.QuotaBook,
        balances: Mapping[quota.AccountKey, quota.Balance],
        ratio: float,
    ) -> np.ndarray:
        """Per listed victim, whether `request` may preempt it (`victim_reason`, and old enough for
        the request's tier), live or not: one mask per kind of request."""
        under = quota.under_cap(book, balances, request.tenant, request.project, ratio)
        rules = request.tier.rules
        code = self.tenant_code.get(request.tenant, -1)
        key = (code, rules.rank, rules.may_preempt, under)
        mask = self._masks.get(key)
        if mask is None:
            old = self.start <= self.now - self.config.min_runtime_for(rules)
            reclaim = self.borrowed & (self.tenant != code) & under
            priority = (self.borrowed | (self.rank > rules.rank)) & rules.may_preempt
            mask = self._masks[key] = old & (reclaim | priority)
        return mask

    def reliefs_for(self, request: Request) -> dict[int, tuple[int, ...]]:
        """Per victim position, what it gives back to the accounts of `request` (filled by the
        planner as it asks): the same for every request charged to the same accounts."""
        return self._reliefs.setdefault((request.tenant, request.project), {})

    def relief_kinds(self, request: Request, room: CapRoom) -> list[tuple[int, list[int]]]:
        """The in-quota victims of `request`'s tenant by kind of relief (the same milli, relieving the
        same accounts of the request, `room`), cheapest first within one: interchangeable as relief,
        so a cheapest set holds a prefix of each kind's usable ones. Per kind: the milli each one
        relieves on every account (0: not every one), its victims, live or not. Kept per account."""
        key = (request.tenant, request.project)
        found = self._kinds.get(key)
        if found is None:
            kinds: dict[tuple[int, tuple[int, ...]], list[int]] = {}
            code = self.tenant_code.get(request.tenant, -1)
            for k in np.flatnonzero((self.tenant == code) & ~self.borrowed).tolist():
                kinds.setdefault((self.milli[k], room.relief(self.ordered[k])), []).append(k)
            found = self._kinds[key] = [(milli if all(relief) else 0, ks) for (milli, relief), ks in kinds.items()]
        return found

    def candidates(
        self,
        request: Request,
        state: ClusterState,
        book: quota.QuotaBook,
        balances: Mapping[quota.AccountKey, quota.Balance],
        ratio: float,
    ) -> list[tuple[Allocation, PreemptReason]]:
        """The live victims `request` may preempt now, cheapest first, with the reason."""
        self.listed(state)
        under = quota.under_cap(book, balances, request.tenant, request.project, ratio)
        live = self.eligible(request, book, balances, ratio) & self.active
        return [(self.ordered[k], self.reason(request, k, under)) for k in np.flatnonzero(live).tolist()]

    def reason(self, request: Request, k: int, under_cap: bool) -> PreemptReason:
        """Why `request` may preempt victim `k` (an eligible one)."""
        found = reason_for(request, self.ordered[k], under_cap)
        if found is None:
            raise AssertionError(f"{request.id} may not preempt {self.ordered[k].id}: a planner bug")
        return found

    def view(self, mask: np.ndarray, state: ClusterState) -> MaskView:
        """What the planner reads of the live victims of `mask` (`MaskView`), kept in step with the
        cycle from here on (`state`: the cycle's)."""
        key = mask.tobytes()
        found = self._views.get(key)
        if found is None:
            found = self._views[key] = MaskView(self, mask, state)
        return found

    def taken(self, placement: Placement) -> None:
        """The cycle admitted `placement`: no victim can free its units."""
        for view in self._views.values():
            view.taken(placement)

    def gone(self, victim: Allocation) -> None:
        """The cycle preempted `victim`: no later plan lists it."""
        k = self.position[victim.id]
        self.active[k] = False
        for view in self._views.values():
            view.gone(k, victim)


class MaskView:
    """The live victims of one mask (a kind of request's, or its tenant's own) as the planner reads
    them, kept in step as the cycle preempts and admits (per node: nothing recomputed for the pool):
    `potential`, the pool with all of them gone; `cheapest`, per node its cheapest one (`none` where
    none); `milli_on`, per node the GPU milli they hold there. `state` is the cycle's (it changes)."""

    def __init__(self, victims: CycleVictims, mask: np.ndarray, state: ClusterState) -> None:
        self.victims, self.mask, self.state = victims, mask, state
        self._potential: ClusterState | None = None
        pairs = (mask & victims.active)[victims.pair_victim]
        self.none = len(victims.ordered)
        self.cheapest = np.full(victims.nodes, self.none, dtype=np.int64)
        np.minimum.at(self.cheapest, victims.pair_node[pairs], victims.pair_victim[pairs])
        self.milli_on = np.bincount(
            victims.pair_node[pairs], victims.milli_of[victims.pair_victim[pairs]], victims.nodes
        ).astype(np.int64)

    @property
    def potential(self) -> ClusterState:
        """The cycle's state with every live victim of the mask gone (read-only; made on first use)."""
        if self._potential is None:
            self._potential = self.state.copy()
            live = np.flatnonzero(self.mask & self.victims.active).tolist()
            self._potential.release_all([self.victims.ordered[k].placement for k in live])
        return self._potential

    def taken(self, placement: Placement) -> None:
        """The cycle admitted `placement`."""
        if self._potential is not None:
            self._potential.apply(placement)

    def gone(self, k: int, victim: Allocation) -> None:
        """Victim `k` was preempted: released in `potential` already if it is one of the mask's."""
        if not self.mask[k]:
            if self._potential is not None:
                self._potential.release(victim.placement)
            return
        victims = self.victims
        for i in victims.nodes_of[k]:
            self.milli_on[i] -= victims.milli[k]
            if self.cheapest[i] == k:
                rest = [j for j in victims.on_node[i] if victims.active[j] and self.mask[j]]
                self.cheapest[i] = rest[0] if rest else self.none


def _per_node(placement: Placement) -> list[tuple[NodeShare, int]]:
    """Per node of `placement`, its share and the GPUs it touches there."""
    gpus: dict[str, set[int]] = {}
    for s in placement.slices:
        gpus.setdefault(s.node, set()).add(s.gpu)
    return [(share, len(gpus.get(share.node, ()))) for share in placement.shares]


class Headroom:
    """The in-quota milli `request` may take once victims are gone (`scope_search.CapRoom`): per account
    it is charged to, the cap at the ratio of the allocation the victims leave, less what it holds,
    plus what the victims give back in quota (the book's one rule, `keys_for`). Each answer is a
    few integer operations, so the search may ask it at every step."""

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
        self.held = [(balances[key].quota, balances[key].in_quota) for key in self.keys]
        self.accounts = len(self.keys)
        self._base: dict[int, tuple[int, ...]] = {}  # per milli freed: each account's room before relief
        self._charged: dict[tuple[str, str], tuple[bool, ...]] = {}
        self._known: dict[str, tuple[int, ...]] = {}  # per victim id, its relief

    def relief(self, victim: Allocation) -> tuple[int, ...]:
        """Per account of the request, the in-quota milli `victim` gives back to it."""
        known = self._known.get(victim.id)
        if known is not None:
            return known
        if victim.borrowed:
            found: tuple[int, ...] = (0,) * self.accounts
        else:
            owner = (victim.request.tenant, victim.request.project)
            charged = self._charged.get(owner)
            if charged is None:
                theirs = self.book.keys_for(*owner)
                charged = self._charged[owner] = tuple(key in theirs for key in self.keys)
            milli = victim.milli
            found = tuple(milli if c else 0 for c in charged)
        self._known[victim.id] = found
        return found

    def after(self, freed: int, relieved: Sequence[int]) -> int:
        """The room once `freed` milli are released, `relieved` of them per account in-quota."""
        base = self._base.get(freed)
        if base is None:  # the searches ask for the same few amounts freed again and again
            ratio = self.policy.ratio((self.allocated - freed) / self.capacity if self.capacity else 0.0)
            base = self._base[freed] = tuple(quota.cap(q, ratio) - held for q, held in self.held)
        if len(base) == 1:
            return base[0] + relieved[0]
        return min((b + r for b, r in zip(base, relieved, strict=True)), default=0)
