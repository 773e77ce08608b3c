"""Preemption plans: the cheapest victim set the budget finds whose freed units really form a valid
placement within the request's cap (DESIGN.md section 5.2).

`PreemptionPlanner.plan`, for one request:

1. `_scopes`: where a plan may free room (a node for a single-node request, a (domain, model) group
   for a gang, the whole pool last for a P2 gang's mixed fallback, or the whole pool with the
   request's own work as victims where only its cap stands in the way), each with a lower bound on
   the cost of any plan there, cheapest bound first;
2. the first scope's greedy set (`ScopeSearch.greedy`) is the incumbent; every scope whose bound does
   not exceed the best plan then gets its bounded improvement (`ScopeSearch.improve`), until the
   budget's steps are spent;
3. the best set is placed for real on the state it frees, within the cap it leaves (`place`), so
   neither "admitted but cannot run" (the Kueue #5243 failure: eight freed GPUs scattered over four
   nodes do not admit an 8-GPU gang) nor "admitted past its cap" can happen.

Cheapest is `victim_cost`, within a scope and between scopes alike; scope order breaks exact ties.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.config import DEFAULT_CONFIG, SchedulerConfig
from xirang_platform.scheduling.feasibility import eligible_nodes, single_node_fit, unit_rounded
from xirang_platform.scheduling.model import Allocation, Placement, PreemptReason, Request
from xirang_platform.scheduling.placement import as_placed, is_single_node, place, usable_whole_gpus
from xirang_platform.scheduling.preemption.cost import Parts, Plan, VictimCost
from xirang_platform.scheduling.preemption.scope_search import (
    CapRoom,
    ScopeRows,
    ScopeSearch,
    Steps,
    need_bounds,
    room_after,
    within,
)
from xirang_platform.scheduling.preemption.victims import CycleVictims
from xirang_platform.scheduling.scorers import NodeScorer
from xirang_platform.scheduling.state import ClusterState


@dataclass(frozen=True)
class Scope:
    """Where a plan may free room: a lower bound on any plan's cost there, its place in the scope
    order (ties), its nodes (pool indices, those the request may use), and whose work is a victim."""

    bound: Parts
    order: float
    rows: np.ndarray
    only_own: bool = False  # only the request's own work may be a victim (its cap alone is in the way)


class PreemptionPlanner:
    """The preemption plans of one cycle, over its victims (`CycleVictims`) and its step budget."""

    def __init__(self, victims: CycleVictims, scorer: NodeScorer, priority: np.ndarray, steps: Steps) -> None:
        self.victims, self.scorer, self.priority, self.steps = victims, scorer, priority, steps

    def plan(
        self,
        state: ClusterState,
        request: Request,
        mask: np.ndarray,
        room: CapRoom,
        allowed: np.ndarray | None = None,
    ) -> tuple[tuple[int, ...], Placement] | None:
        """The cheapest plan the budget finds for `request` on `state` (the cycle's): the positions of
        its victims and the placement it gets, or None. `mask`: the victims it may take
        (`CycleVictims.eligible`); `room`: its cap room once victims are gone; `allowed`: the nodes
        it may use (None: all)."""
        table = self.victims.listed(state)
        if not (mask & table.active).any():
            return None
        own = mask & (table.tenant == table.tenant_code.get(request.tenant, -1)) & ~table.borrowed
        return _RequestSearch(self, state, request, mask, own, room, allowed).run()


def plan_preemption(
    state: ClusterState,
    request: Request,
    candidates: Sequence[tuple[Allocation, PreemptReason]],
    room: CapRoom,
    now: float,
    scorer: NodeScorer,
    priority: np.ndarray,
    allowed: np.ndarray | None = None,
    config: SchedulerConfig = DEFAULT_CONFIG,
    steps: Steps | None = None,
) -> Plan | None:
    """`PreemptionPlanner.plan` over `candidates`, every one a victim `request` may take with the
    reason given (for tests and tools; the cycle lists its victims itself), at `now`, within
    `steps` (None: `config`'s budget; given, the caller reads what the search spent)."""
    if place(state, request, scorer, priority, allowed, room_after(room, [])) is not None:
        return None  # it fits within its cap as it is
    victims = CycleVictims(
        {a.id: a for a, _ in candidates}, now, replace(config, min_runtime_s=0.0, min_runtime_by_level=())
    )
    table = victims.listed(state)
    steps = steps or Steps(config.plan_steps_per_request, config.plan_steps_per_cycle)
    steps.begin()
    found = PreemptionPlanner(victims, scorer, priority, steps).plan(state, request, table.active.copy(), room, allowed)
    if found is None:
        return None
    reasons = {a.id: reason for a, reason in candidates}
    return Plan(tuple((table.ordered[k], reasons[table.ordered[k].id]) for k in found[0]), found[1])


class _RequestSearch:
    """One request's plan: its scopes in bound order, searched until the budget is spent or no scope
    left can beat the best plan."""

    def __init__(
        self,
        planner: PreemptionPlanner,
        state: ClusterState,
        request: Request,
        mask: np.ndarray,
        own: np.ndarray,
        room: CapRoom,
        allowed: np.ndarray | None,
    ) -> None:
        self.planner, self.table, self.state, self.request = planner, planner.victims, state, request
        self.mask, self.room, self.allowed = mask, room, allowed
        self.placed = as_placed(request)
        self.everywhere = np.ones(len(state.names), dtype=bool) if allowed is None else allowed
        # Relief can matter only when the cap binds some placement (each GPU's need is at most a GPU).
        self.quota_free = not self.placed.gpus or room.after(0, [0] * room.accounts) >= self.placed.gpus * MILLI_PER_GPU
        self.own = own if not self.quota_free else np.zeros_like(own)
        self.nothing = (0,) * room.accounts
        self.price: tuple[int, float] | None = None  # `_relief_price`
        self._groups = state.domain_id * (len(state.model_names) + 1) + state.model_id  # per node, its group
        self.reliefs = planner.victims.reliefs_for(request)  # per own victim, its relief (`_relief_of`)
        self.best: tuple[VictimCost, float, tuple[int, ...], np.ndarray] | None = None  # cost, order, set, rows

    def run(self) -> tuple[tuple[int, ...], Placement] | None:
        """The best set found (positions) and its placement, or None: the greedy set of each scope
        its bound lets win, then each one's bounded improvement, while the budget lasts."""
        steps = self.planner.steps
        searched: list[tuple[Scope, ScopeSearch]] = []
        for scope in self._scopes():
            if self.best is not None and (scope.bound > self.best[0][:4] or steps.spent):
                steps.cut = steps.cut or steps.spent
                break
            search = self._scope_search(scope)
            self._offer(scope, search.greedy())
            searched.append((scope, search))
        for scope, search in searched:
            if self.best is None or scope.bound > self.best[0][:4]:
                continue
            if steps.spent:
                steps.cut = True
                break
            search.improve(self.best[0][:4])
            self._offer(scope, search.best)
        if self.best is None:
            return None
        chosen, rows = self._minimal(self.best[2], self.best[3])
        placement = self._placement(chosen, rows)
        if placement is None:
            raise AssertionError(f"preemption plan for {self.request.id} left no placement within its cap")
        return chosen, placement

    def _minimal(self, chosen: tuple[int, ...], rows: np.ndarray) -> tuple[tuple[int, ...], np.ndarray]:
        """`chosen` less every victim the request does not need, dearest first: a set minimal in its
        scope may not be in the pool, where victims elsewhere (relief) free room too. (An exact set
        loses none: the set without one would be a cheaper plan of some scope.)"""
        for k in sorted(chosen, reverse=True):
            rest = tuple(x for x in chosen if x != k)
            if not rest:
                break
            self.planner.steps.spend()
            mixed = not is_single_node(self.request) and self.request.tier.rules.mixed_fallback
            nodes = np.flatnonzero(self.everywhere) if mixed else np.union1d(rows, self._nodes_of(rest))
            if self._placement(rest, nodes) is not None:
                chosen, rows = rest, nodes
        return chosen, rows

    def _nodes_of(self, chosen: tuple[int, ...]) -> np.ndarray:
        """The nodes the victims `chosen` hold units on that the request may use."""
        table = self.table
        nodes = table.pair_node[np.isin(table.pair_victim, chosen)]
        return np.unique(nodes[self.everywhere[nodes]])

    def _placement(self, chosen: tuple[int, ...], rows: np.ndarray) -> Placement | None:
        """Where the request runs on `rows` once the victims `chosen` are gone, within its cap then."""
        victims = [self.table.ordered[k] for k in chosen]
        trial = self.state.rows(rows)
        trial.release_all([v.placement for v in victims])  # victims elsewhere move only the totals
        priority = self.planner.priority[rows]
        return place(trial, self.request, self.planner.scorer, priority, None, room_after(self.room, victims))

    # -- one scope -----------------------------------------------------------------------------------

    def _scope_search(self, scope: Scope) -> ScopeSearch:
        """The search of `scope`: its victims there, the relief elsewhere, its rows."""
        table, rows = self.table, scope.rows
        inside = np.zeros(len(self.state.names), dtype=bool)
        inside[rows] = True
        live = (self.own if scope.only_own else self.mask) & table.active
        local = np.unique(table.pair_victim[live[table.pair_victim] & inside[table.pair_node]]).tolist()
        need_range = need_bounds(self.state, self.request, rows)
        relief = self._relief(need_range[1], set(local))
        trial = ScopeRows(self.state, rows, self.request)
        steps, price = self.planner.steps, self._relief_price(self.own & table.active)[1]
        return ScopeSearch(trial, table, local, relief, need_range, self.room, self._relief_of, steps, price)

    def _relief_of(self, k: int) -> tuple[int, ...]:
        """What victim `k` gives back to the request's accounts: only its own tenant's in-quota work
        gives anything."""
        if not self.own[k]:
            return self.nothing
        known = self.reliefs.get(k)
        if known is None:
            known = self.reliefs[k] = self.room.relief(self.table.ordered[k])
        return known

    def _offer(self, scope: Scope, found: tuple[Parts, tuple[int, ...]] | None) -> None:
        """Keep the set `found` in `scope` if it is the cheapest so far (scope order breaks ties)."""
        if found is None:
            return
        key = (self.table.cost([self.table.ordered[k] for k in found[1]]), scope.order)
        if self.best is None or key < self.best[:2]:
            self.best = (*key, found[1], scope.rows)

    def _relief(self, need_max: int, local: set[int]) -> list[int]:
        """The request's own in-quota victims outside the scope that a cheapest set may hold: of each
        kind (the same milli and relief) no more than cover the cap's shortfall (a kind that relieves
        only some of the request's accounts: all of it)."""
        short = need_max - self.room.after(0, [0] * self.room.accounts)
        if short <= 0 or not self.own.any():
            return []
        own, active = self.own, self.table.active
        out: list[int] = []
        for each, ks in self.table.relief_kinds(self.request, self.room):
            wanted = -(-short // each) if each else len(ks)
            for k in ks:
                if wanted <= 0:
                    break
                if own[k] and active[k] and k not in local:
                    out.append(k)
                    wanted -= 1
        out.sort()
        return out

    # -- the scopes, cheapest bound first ------------------------------------------------------------

    def _scopes(self) -> Iterator[Scope]:
        """Every scope where the request fits with all its live victims gone, by bound, then order."""
        state, request, table = self.state, self.request, self.table
        every = np.flatnonzero(self.everywhere)
        if place(state, request, self.planner.scorer, self.planner.priority, self.allowed) is not None:
            if not self.quota_free and (self.own & table.active).any():  # only quota stands in the way
                yield Scope((0, 0, 0, 0), 0.0, every, only_own=True)
            return
        potential = table.potential(self.mask, state)
        eligible = eligible_nodes(state, self.placed) & self.everywhere
        cheapest = table.cheapest(self.mask)
        if is_single_node(request):
            nodes = single_node_fit(potential, self.placed, eligible)
            nodes = nodes[cheapest[nodes] < len(table.ordered)]
            bounds = self._with_relief(table.parts_rows[cheapest[nodes]], nodes, single=True)
            for at in np.lexsort((nodes, *bounds.T[::-1])).tolist():
                yield Scope(_parts(bounds[at]), float(nodes[at]), nodes[at : at + 1])
            return
        groups = self._groups
        usable = np.bincount(groups, usable_whole_gpus(potential, self.placed, eligible), minlength=groups.max() + 1)
        live = np.flatnonzero(usable >= self.placed.gpus)
        first = np.full(len(usable), len(table.ordered), dtype=np.int64)
        np.minimum.at(first, groups, cheapest)
        live = live[first[live] < len(table.ordered)]
        bounds = np.maximum(self._gang_floors(groups, eligible)[live], 0)
        bounds = _lex_max(bounds, table.parts_rows[first[live]])
        bounds = self._with_relief(bounds, live, single=False)
        for at in np.lexsort((live, *bounds.T[::-1])).tolist():
            yield Scope(_parts(bounds[at]), float(live[at]), np.flatnonzero((groups == live[at]) & self.everywhere))
        if request.tier.rules.mixed_fallback:  # any plan holds one victim at least
            yield Scope(_parts(table.parts_rows[np.flatnonzero(self.mask & table.active)[0]]), math.inf, every)

    def _gang_floors(self, groups: np.ndarray, eligible: np.ndarray) -> np.ndarray:
        """Per group, a lower bound on any set that frees the whole GPUs the gang misses there (each
        victim frees at most the GPUs it holds on the group's eligible nodes) and, where the cap
        binds, gives the relief it needs (`_least_relief`), on in-quota work lost and on all work
        lost: by weak duality with the cheapest own work per milli as the price of relief, the
        relief at that price plus the missing GPUs at the cheapest cost per GPU, each victim's cost
        less the relief it gives at that price (a fractional knapsack)."""
        table = self.table
        missing = self.placed.gpus - np.bincount(
            groups, usable_whole_gpus(self.state, self.placed, eligible), minlength=groups.max() + 1
        )
        pairs = (self.mask & table.active)[table.pair_victim] & eligible[table.pair_node] & (table.pair_gpus > 0)
        victim, held, group = table.pair_victim[pairs], table.pair_gpus[pairs], groups[table.pair_node[pairs]]
        total = np.bincount(victim, held, minlength=len(table.ordered))
        own = self.own & table.active
        relief, price = self._relief_price(own)
        floors = np.zeros((len(missing), 4), dtype=np.int64)
        floors[:, 3] = missing > 0
        for part in (0, 2):
            cost = table.parts_rows[victim, part] - price * table.milli_of[victim] * own[victim]
            rate = cost / np.maximum(total[victim], 1)
            floors[:, part] = np.floor(_fractional_floor(group, held, rate, missing) + price * relief * (1 - 1e-9))
        return floors

    def _relief_price(self, own: np.ndarray) -> tuple[int, float]:
        """The relief every plan needs (where the cap binds), and the least own work loses per milli
        (asked once per request: what it reads does not change while the request is planned)."""
        if self.price is not None:
            return self.price
        self.price = self._price(own)
        return self.price

    def _price(self, own: np.ndarray) -> tuple[int, float]:
        if self.quota_free or not own.any():
            return 0, 0.0
        ks = np.flatnonzero(own)
        need = int(unit_rounded(self.state, self.placed.milli_per_gpu).min()) * self.placed.gpus
        live = (self.mask & self.table.active)[self.table.pair_victim]
        on_node = np.bincount(
            self.table.pair_node[live], self.table.milli_of[self.table.pair_victim[live]], len(self.state.names)
        )
        freed = int(np.bincount(self._groups, on_node).max(initial=0))
        relief = self._least_relief(need, freed, int(self.table.milli_of[ks].sum()))
        rate = self.table.parts_rows[ks, 2] / np.maximum(self.table.milli_of[ks], 1)
        return relief, float(rate.min()) * (1 - 1e-9)

    def _with_relief(self, bounds: np.ndarray, scopes: np.ndarray, single: bool) -> np.ndarray:
        """`bounds` raised where every valid set must hold some of the request's own in-quota work:
        where the cap binds even with every victim of the scope gone (the milli they free raise the
        cap ratio), a set holds one of them at least; on a node, one there or one more elsewhere
        besides the node's cheapest victim. And where the cap binds with every victim of the pool
        gone, such work costs at least its cheapest per milli times what is short."""
        table, placed = self.table, self.placed
        own = self.own & table.active
        if self.quota_free or not own.any():
            return bounds
        ks = np.flatnonzero(own)
        need = int(unit_rounded(self.state, placed.milli_per_gpu).min()) * placed.gpus
        live = (self.mask & table.active)[table.pair_victim]
        on_node = np.bincount(table.pair_node[live], table.milli_of[table.pair_victim[live]], len(self.state.names))
        freed = on_node[scopes] if single else np.bincount(self._groups, on_node)[scopes]
        least = self._least_freed(need)
        if least is not None and (freed >= least).all():
            return bounds
        bound_free = math.inf if least is None else least
        cheapest_own = table.parts_rows[ks[0]]
        if single:  # an own victim on the node, or one elsewhere beside the node's cheapest
            here = table.cheapest(own)[scopes]
            there = table.parts_rows[np.minimum(here, len(table.ordered) - 1)]
            there[here == len(table.ordered)] = np.iinfo(np.int64).max // 4
            raised = _lex_min(there, bounds + cheapest_own)
        else:
            raised = np.broadcast_to(cheapest_own, bounds.shape)
        bounds = np.where((freed < bound_free)[:, None], _lex_max(bounds, raised), bounds)
        relief = self._least_relief(need, int(freed.max(initial=0)), int(table.milli_of[ks].sum()))
        if relief:  # what the cheapest own work per milli loses for that relief, at least
            lost = int(((table.parts_rows[ks, 2] * relief) // np.maximum(table.milli_of[ks], 1)).min())
            bounds = _lex_max(bounds, np.broadcast_to(np.array([lost, 1, lost, 1], dtype=np.int64), bounds.shape))
        return bounds

    def _least_relief(self, need: int, freed: int, most: int) -> int:
        """The least relief (milli of own in-quota work, freed too) that gives the cap room for `need`
        beside `freed` milli of other work (the most any scope frees); `most` + 1 where none does."""
        room = self.room

        def enough(relief: int) -> bool:
            return within(need, room.after(freed + relief, [relief] * room.accounts))

        if enough(0):
            return 0
        if not enough(most):
            return most + 1
        low, high = 0, most
        while high - low > 1:  # the room rises with the relief
            middle = (low + high) // 2
            low, high = (middle, high) if not enough(middle) else (low, middle)
        return high

    def _least_freed(self, need: int) -> int | None:
        """The least milli freed without relief that gives the request's cap room for `need` (the
        cap ratio rises as allocation falls); None where no amount does."""
        room, nothing = self.room, [0] * self.room.accounts
        low, high = 0, self.state.allocated_milli
        if within(need, room.after(low, nothing)):
            return 0
        if not within(need, room.after(high, nothing)):
            return None
        while high - low > 1:  # room.after rises with the milli freed
            middle = (low + high) // 2
            low, high = (middle, high) if not within(need, room.after(middle, nothing)) else (low, middle)
        return high


def _parts(row: np.ndarray) -> Parts:
    a, b, c, d = (int(x) for x in row)
    return (a, b, c, d)


def _lex_less(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row, whether `a`'s is lexicographically less than `b`'s."""
    differ = a != b
    first = differ.argmax(axis=1)
    rows = np.arange(len(a))
    return differ[rows, first] & (a[rows, first] < b[rows, first])


def _lex_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(_lex_less(a, b)[:, None], b, a)


def _lex_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(_lex_less(a, b)[:, None], a, b)


def _fractional_floor(group: np.ndarray, held: np.ndarray, rate: np.ndarray, missing: np.ndarray) -> np.ndarray:
    """Per group, the least cost of `missing` GPUs from items (`group`, GPUs `held`, cost per GPU
    `rate`) taken fractionally, cheapest first; 0 where nothing is missing."""
    out = np.zeros(len(missing), dtype=float)
    order = np.lexsort((rate, group))
    group, held, rate = group[order], held[order], rate[order]
    want = np.maximum(missing[group], 0)
    before = np.cumsum(held) - held
    start = np.zeros(len(group), dtype=np.int64)
    if len(group):
        firsts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
        start = np.repeat(before[firsts], np.diff(np.r_[firsts, len(group)]))
    take = np.clip(want - (before - start), 0, held)  # of each item, the GPUs taken after the group's cheaper ones
    np.add.at(out, group, take * rate)
    return out * (1 - 1e-9)
