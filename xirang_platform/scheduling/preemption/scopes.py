"""The scopes of one request's preemption plan, cheapest lower bound first (DESIGN.md section 5.2).

A scope is where a plan may free room: a node for a single-node request, a (domain, model) group for
a gang, the whole pool last for a P2 gang's mixed fallback, or the whole pool with the request's own
work as victims where only its cap stands in the way. Only scopes where the request fits with all
their live victims gone are listed. A scope's bound is no more than the cost of any plan there:

- its cheapest victim (a plan holds one at least);
- for a gang, the whole GPUs it misses there at the least cost per GPU (a fractional knapsack);
- where the cap binds, the relief it needs at the least cost per milli of the request's own work,
  priced into the gang's bound by weak duality; on a node, an own victim there or one more elsewhere.

Bounds are compared as costs are (`cost.victim_cost`'s parts, lexicographically); a gang's bounds are
kept per kind of request and worked out again only for the groups whose rows changed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from xirang_platform.scheduling.feasibility import eligible_nodes, single_node_fit, unit_rounded
from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.placement import as_placed, is_single_node, place, usable_whole_gpus
from xirang_platform.scheduling.preemption.cost import Parts
from xirang_platform.scheduling.preemption.scope_search import CapRoom, within
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


class ScopeOrder:
    """The scopes of one request, by bound, over the cycle's victims (`mask`: those it may take;
    `own`: its tenant's in-quota ones), its cap `room`, the nodes it may use (`allowed`; None: all)."""

    def __init__(
        self,
        table: CycleVictims,
        state: ClusterState,
        request: Request,
        mask: np.ndarray,
        own: np.ndarray,
        room: CapRoom,
        allowed: np.ndarray | None,
        scorer: NodeScorer,
        priority: np.ndarray,
        quota_free: bool,
    ) -> None:
        self.table, self.state, self.request, self.mask, self.own, self.room = table, state, request, mask, own, room
        self.allowed, self.scorer, self.priority, self.quota_free = allowed, scorer, priority, quota_free
        self.placed = as_placed(request)
        self.everywhere = np.ones(len(state.names), dtype=bool) if allowed is None else allowed
        self._groups = state.domain_id * (len(state.model_names) + 1) + state.model_id  # per node, its group
        self.price: tuple[int, float] | None = None  # `relief_price`
        self.victims_key_: bytes | None = None  # `victims_key`

    def victims_key(self) -> bytes:
        """The request's victims (its mask), as a key."""
        if self.victims_key_ is None:
            self.victims_key_ = self.mask.tobytes()
        return self.victims_key_

    def scopes(self) -> Iterator[Scope]:
        """Every scope where the request fits with all its live victims gone, by bound, then order."""
        state, request, table = self.state, self.request, self.table
        every = np.flatnonzero(self.everywhere)
        if place(state, request, self.scorer, self.priority, self.allowed) is not None:
            if not self.quota_free and (self.own & table.active).any():  # only quota stands in the way
                yield Scope((0, 0, 0, 0), 0.0, every, only_own=True)
            return
        view = table.view(self.mask, state)
        potential, cheapest = view.potential, view.cheapest
        eligible = eligible_nodes(state, self.placed) & self.everywhere
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
        less the relief it gives at that price (a fractional knapsack). Kept per kind of request and
        worked out again only for the groups whose rows changed since (`CycleVictims.gang_floors`)."""
        table = self.table
        relief, price = self.relief_price()
        # Row stamps only grow, so a group's sum of them grows whenever one of its rows changes.
        stamps = np.bincount(groups, self.state.row_stamp.astype(float), minlength=groups.max() + 1)
        key = None
        if self.allowed is None:
            key = (self.placed.shape, self.victims_key(), relief, price)
            kept = table.gang_floors.get(key)
            if kept is not None:
                changed = kept[0] != stamps
                if changed.any():
                    kept[1][changed] = self._floors(groups, eligible, changed, relief, price)[changed]
                    kept[0][:] = stamps
                return kept[1]
        floors = self._floors(groups, eligible, np.ones(len(stamps), dtype=bool), relief, price)
        if key is not None:
            table.gang_floors[key] = (stamps, floors)
        return floors

    def _floors(
        self, groups: np.ndarray, eligible: np.ndarray, which: np.ndarray, relief: int, price: float
    ) -> np.ndarray:
        """`_gang_floors` of the groups `which` (the others' rows are left 0)."""
        table = self.table
        nodes = which[groups]
        missing = self.placed.gpus - np.bincount(
            groups[nodes],
            usable_whole_gpus(self.state, self.placed, eligible[nodes], np.flatnonzero(nodes)),
            minlength=len(which),
        )
        pairs = (self.mask & table.active)[table.pair_victim] & eligible[table.pair_node] & (table.pair_gpus > 0)
        total = np.bincount(table.pair_victim[pairs], table.pair_gpus[pairs], minlength=len(table.ordered))
        pairs &= nodes[table.pair_node]
        victim, held, group = table.pair_victim[pairs], table.pair_gpus[pairs], groups[table.pair_node[pairs]]
        own = self.own & table.active
        floors = np.zeros((len(which), 4), dtype=np.int64)
        floors[:, 3] = (missing > 0) & which
        for part in (0, 2):
            cost = table.parts_rows[victim, part] - price * table.milli_of[victim] * own[victim]
            rate = cost / np.maximum(total[victim], 1)
            fractional = _fractional_floor(group, held, rate, np.where(which, missing, 0))
            floors[:, part] = np.where(which, np.floor(fractional + price * relief * (1 - 1e-9)), 0)
        return floors

    def relief_price(self) -> tuple[int, float]:
        """The relief every plan needs (where the cap binds), and the least own work loses per milli
        (asked once per request: what it reads does not change while the request is planned)."""
        if self.price is None:
            self.price = self._price(self.own & self.table.active)
        return self.price

    def _price(self, own: np.ndarray) -> tuple[int, float]:
        if self.quota_free or not own.any():
            return 0, 0.0
        ks = np.flatnonzero(own)
        need = int(unit_rounded(self.state, self.placed.milli_per_gpu).min()) * self.placed.gpus
        on_node = self.table.view(self.mask, self.state).milli_on
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
        on_node = table.view(self.mask, self.state).milli_on
        freed = on_node[scopes] if single else np.bincount(self._groups, on_node)[scopes]
        least = self._least_freed(need)
        if least is not None and (freed >= least).all():
            return bounds
        bound_free = math.inf if least is None else least
        cheapest_own = table.parts_rows[ks[0]]
        if single:  # an own victim on the node, or one elsewhere beside the node's cheapest
            here = table.view(self.own, self.state).cheapest[scopes]
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
