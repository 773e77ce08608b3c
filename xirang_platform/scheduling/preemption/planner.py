"""Preemption plans: the cheapest victim set the budget finds whose freed units really form a valid
placement within the request's cap (DESIGN.md section 5.2).

`PreemptionPlanner.plan`, for one request:

1. `scopes.ScopeOrder`: where a plan may free room, each with a lower bound on the cost of any plan
   there, cheapest bound first;
2. the greedy set of each scope its bound lets win (`ScopeSearch.greedy`), then each one's bounded
   improvement (`ScopeSearch.improve`), while the budget's steps last; a scope's exact answer (or a
   floor under every set there) is kept for the next request of the kind while its rows stay;
3. the best set, less every victim the request does not need anywhere in the pool (`_minimal`), is
   placed for real on the state it frees, within the cap it leaves (`place`), so neither "admitted
   but cannot run" (the Kueue #5243 failure: eight freed GPUs scattered over four nodes do not admit
   an 8-GPU gang) nor "admitted past its cap" can happen.

Cheapest is `victim_cost`, within a scope and between scopes alike; scope order breaks exact ties.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.config import DEFAULT_CONFIG, SchedulerConfig
from xirang_platform.scheduling.model import Allocation, Placement, PreemptReason, Request
from xirang_platform.scheduling.placement import as_placed, is_single_node, place
from xirang_platform.scheduling.preemption.cost import Parts, Plan, VictimCost
from xirang_platform.scheduling.preemption.scope_search import (
    CapRoom,
    ScopeRows,
    ScopeSearch,
    Steps,
    need_bounds,
    room_after,
)
from xirang_platform.scheduling.preemption.scopes import Scope, ScopeOrder
from xirang_platform.scheduling.preemption.victims import CycleVictims
from xirang_platform.scheduling.scorers import NodeScorer
from xirang_platform.scheduling.state import ClusterState

FEW_ROWS = 64  # a scope up to this many nodes reads its victims node by node, a larger one in one pass


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
        self.order = ScopeOrder(
            self.table, state, request, mask, self.own, room, allowed, planner.scorer, planner.priority, self.quota_free
        )
        self.reliefs = planner.victims.reliefs_for(request)  # per own victim, its relief (`_relief_of`)
        self.best: tuple[VictimCost, float, tuple[int, ...], np.ndarray] | None = None  # cost, order, set, rows

    def run(self) -> tuple[tuple[int, ...], Placement] | None:
        """The best set found (positions) and its placement, or None: the greedy set of each scope
        its bound lets win, then each one's bounded improvement, while the budget lasts. A scope's
        exact answer is kept for the next request of the same kind while its rows stay as they are
        (`CycleVictims.scope_answers`)."""
        steps = self.planner.steps
        searched: list[tuple[Scope, ScopeSearch]] = []
        for scope in self.order.scopes():
            if self.best is not None and (scope.bound > self.best[0][:4] or steps.spent):
                steps.cut = steps.cut or steps.spent
                break
            known = self._known(scope)
            if known is not None:
                if known[1] is None:  # its answer
                    self._offer(scope, known[0])
                    continue
                if self.best is not None and known[1] >= self.best[0][:4]:
                    continue  # every set there costs more than that floor, so more than the best plan
            search = self._scope_search(scope)
            search = self._scope_search(scope)
            self._offer(scope, search.greedy())
            searched.append((scope, search))
        for scope, search in searched:
            if self.best is None or scope.bound > self.best[0][:4]:
                continue
            if steps.spent:
                steps.cut = True
                break
            outer = self.best[0][:4]
            search.improve(outer)
            self._offer(scope, search.best)
            if search.exact:
                self._remember(scope, search.best, None)
            elif not search.stopped:  # every set as cheap as `outer` was tried: none is valid
                self._remember(scope, None, outer)
        if self.best is None:
            return None
        chosen, rows = self._minimal(self.best[2], self.best[3])
        placement = self._placement(chosen, rows)
        if placement is None:
            raise AssertionError(f"preemption plan for {self.request.id} left no placement within its cap")
        return chosen, placement

    def _answer_key(self, scope: Scope) -> tuple | None:
        """What a scope's answer depends on besides its rows: the request's shape, its victims and the
        scope; None where it depends on more (the cap binds, so relief elsewhere and the room do; an
        allowed mask; the scope of own work)."""
        if not self.quota_free or self.allowed is not None or scope.only_own:
            return None
        return (self.request.shape, self.order.victims_key(), scope.order)

    def _known(self, scope: Scope) -> tuple[tuple[Parts, tuple[int, ...]] | None, Parts | None] | None:
        """What is kept of `scope`, if its rows are unchanged since: its answer (None: no set) and no
        floor, or no answer and a floor every set there costs more than."""
        key = self._answer_key(scope)
        found = self.table.scope_answers.get(key) if key is not None else None
        if found is None or found[0] != self.state.row_stamp[scope.rows].tobytes():
            return None
        return found[1], found[2]

    def _remember(self, scope: Scope, answer: tuple[Parts, tuple[int, ...]] | None, floor: Parts | None) -> None:
        key = self._answer_key(scope)
        if key is not None:
            self.table.scope_answers[key] = (self.state.row_stamp[scope.rows].tobytes(), answer, floor)

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
        live = (self.own if scope.only_own else self.mask) & table.active
        if len(rows) <= FEW_ROWS:  # a node or a group: its victims, one list a node
            local = sorted({k for i in rows.tolist() for k in table.on_node.get(i, ()) if live[k]})
        else:
            inside = np.zeros(len(self.state.names), dtype=bool)
            inside[rows] = True
            local = np.unique(table.pair_victim[live[table.pair_victim] & inside[table.pair_node]]).tolist()
        need_range = need_bounds(self.state, self.request, rows)
        relief = self._relief(need_range[1], set(local))
        trial = ScopeRows(self.state, rows, self.request)
        steps, price = self.planner.steps, self.order.relief_price()[1]
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
