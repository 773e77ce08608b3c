"""Preemption plans: the cheapest victim set whose freed units really form a valid placement.

Cheapest is one order, `victim_cost` (DESIGN.md section 5.2), read for single victims and whole
plans alike: borrowed victims before in-quota ones, then least work lost (GPU-seconds since the last
checkpoint), then fewest victims; ids only break exact ties.

A plan is searched per scope (a node for single-node requests, a (domain, model) group for gangs,
the whole pool for a P2 gang's mixed fallback). Each scope's cheapest set, its victims and, where
the request's cap binds, its own tenant's in-quota work anywhere (cap relief, at the cap ratio of
the allocation the victims leave), comes from an exact branch and bound (`victim_search`). Scopes
are tried by a lower bound on any plan there, tightened in steps (the cheapest victim; the GPUs a
gang needs freed; the relief the cap needs; the scope's knapsack floor), so the best plan tends to
come first and every scope whose bound exceeds it is never searched. The cheapest plan wins (scope
order breaks exact ties). The plan is checked by placing the request on the what-if state within
its cap, and that placement is the one admitted, so neither "admitted but cannot run" (the Kueue
#5243 failure: eight freed GPUs scattered over four nodes do not admit an 8-GPU gang) nor
"admitted past its cap" can happen.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling import quota
from xirang_platform.scheduling.candidates import Candidates, Plan, VictimCost
from xirang_platform.scheduling.feasibility import eligible_nodes
from xirang_platform.scheduling.model import Allocation, PreemptReason, Request
from xirang_platform.scheduling.placement import as_placed, is_single_node, place
from xirang_platform.scheduling.scope_order import refined, relieved_groups, single_scopes, tightened, with_relief
from xirang_platform.scheduling.scorers import NodeScorer
from xirang_platform.scheduling.state import ClusterState
from xirang_platform.scheduling.victim_search import Found, ScopeSearch
from xirang_platform.scheduling.victim_sets import (
    NEVER,
    CapRoom,
    Gang,
    Parts,
    ReliefKinds,
    need_bounds,
    need_in_scope,
    room_after,
    root_floor,
    within,
)


def victim_reason(
    request: Request,
    victim: Allocation,
    book: quota.QuotaBook,
    balances: Mapping[quota.AccountKey, quota.Balance],
    ratio: float,
    under_cap: bool | None = None,
) -> PreemptReason | None:
    """Why `request` may preempt `victim`, or None if it may not.

    - P0/P1 may preempt any P2 work and any borrowed work (priority; reclaim when the victim
      borrowed from another tenant).
    - Any request whose tenant is under its cap may reclaim another tenant's borrowed work.

    `under_cap`: whether the request's accounts are under their caps, when the caller already knows
    (it asks once for many victims); None: read from `balances`.
    """
    if not quota.is_reclaimable(victim):
        return None
    other_tenant = victim.request.tenant != request.tenant
    if victim.borrowed and other_tenant:
        if under_cap is None:
            under_cap = quota.under_cap(book, balances, request.tenant, request.project, ratio)
        if under_cap:
            return PreemptReason.RECLAIM
    if request.tier.rules.may_preempt and (victim.borrowed or victim.request.tier.rank > request.tier.rank):
        return PreemptReason.PRIORITY
    return None


def plan_preemption(
    state: ClusterState,
    request: Request,
    candidates: Sequence[tuple[Allocation, PreemptReason]] | Candidates,
    room: CapRoom,
    cost: Callable[[Sequence[Allocation]], VictimCost],
    scorer: NodeScorer,
    priority: np.ndarray,
    allowed: np.ndarray | None = None,
) -> Plan | None:
    """The cheapest plan that frees a valid placement for `request` within its cap, or None.

    `candidates` are the allocations it may preempt; `room` the in-quota milli the request may hold
    once victims are gone (a request over its own cap may stop its own tenant's in-quota work to get
    back under it); `cost` is `victim_cost` at the cycle's time; `allowed` limits the nodes the
    request may use (None = all).

    Decides exactly as `plan_preemption_exhaustive` does, without trying every set: each scope's
    cheapest set comes from an exact branch and bound (`ScopeSearch`); a scope's plan holds at least
    one of the scope's victims, so it costs no less than its cheapest victim alone. Scopes are tried
    cheapest bound first, only those where the request would fit with all their victims gone, and
    the search stops once the bound exceeds the best plan found; each scope's search is bounded by
    that plan too. Each scope is planned on a copy of its own rows.
    """
    table = candidates if isinstance(candidates, Candidates) else Candidates(state, candidates, cost)
    room = table.known_relief(room, (request.tenant, request.project))
    live = np.flatnonzero(table.active)
    if len(live) == 0:
        return None
    everywhere = np.ones(len(state.names), dtype=bool) if allowed is None else allowed
    placed = as_placed(request)
    # Relief can matter only when the cap binds some placement (each GPU's need is at most a GPU).
    quota_free = not placed.gpus or room.after(0, [0] * room.accounts) >= placed.gpus * MILLI_PER_GPU
    own = [] if quota_free else table.relief_positions(request.tenant)

    def prepare(
        view: ClusterState, rows: np.ndarray, local: list[int], mask: np.ndarray | None = None, floored: bool = True
    ) -> Scope:
        """What a scope's search reads (`view`: the state's `rows`): its need, its relief elsewhere
        (when the cap binds), and (`floored`) the knapsack floor of its root (`root_floor`; None: no
        such bound)."""
        need_range = need_bounds(view, request, mask)
        short = need_range[1] - room.after(0, [0] * room.accounts)
        relief: list[int] = []
        if own and short > 0 and need_range[1]:
            kinds = table.relief_kinds.get((request.tenant, request.project))
            if kinds is None:
                kinds = ReliefKinds(own, table.allocations, table.milli, room)
                table.relief_kinds[(request.tenant, request.project)] = kinds
            relief = kinds.candidates(short, table.active, set(local))
        gang = None
        if not is_single_node(request):
            eligible = eligible_nodes(view, placed) if mask is None else eligible_nodes(view, placed) & mask
            gang = (placed.gpus, eligible, held_on(rows[eligible], local))
        # A node holds a whole-GPU request only with that many whole GPUs free: a gang's bound.
        local_needed = mask is None  # no scope holds the request as it is (else: only quota stands in the way)
        whole = gang or (
            (placed.gpus, np.ones(len(view.names), dtype=bool), held_on(rows, local)) if placed.whole_gpus else None
        )
        floor = (
            root_floor(
                view,
                table.parts_rows,
                table.milli_of,
                local,
                relief,
                room,
                need_range,
                whole,
                local_needed,
            )
            if floored
            else None
        )
        return Scope(view, local, mask, need_range, relief, gang, floor)

    def held_on(nodes: np.ndarray, local: list[int]) -> np.ndarray:
        """Per victim of `local`, the GPUs it holds on `nodes` (pool indices)."""
        on = np.zeros(len(state.names), dtype=bool)
        on[nodes] = True
        return table.gpus_on(local, on)

    def search(scope: Scope, outer: VictimCost | None) -> tuple[ScopeSearch | None, Found]:
        """The scope's search and its cheapest set (`Found`; no search where its root bound cannot
        win)."""
        bound = outer[:4] if outer is not None else None
        if bound is not None and scope.floor is not None and scope.floor > bound:
            return None, Found(None, None, True)  # the search would stop at its root
        need = need_in_scope(scope.view, request, scope.mask)
        found = ScopeSearch(
            scope.view,
            table.allocations,
            table.parts,
            scope.local,
            scope.relief,
            need,
            room,
            scope.need_range,
            bound,
            scope.gang,
            table.milli,
            table.parts_rows,
        )
        return found, found.run()

    def planned(
        view: ClusterState, scope: ScopeSearch | None, found: Found, rows_priority: np.ndarray, mask: np.ndarray | None
    ) -> Plan | None:
        """The plan of the scope's cheapest set, placed for real on the state it frees."""
        if found.chosen is None or scope is None:
            return None
        victims = [table.allocations[k] for k in found.chosen]
        trial = scope.placement_state(view, found.chosen)
        placement = place(trial, request, scorer, rows_priority, mask, room_after(room, victims))
        if placement is None:
            raise AssertionError(f"preemption plan for {request.id} left no placement within its cap")
        return Plan(tuple(table.ordered[k] for k in found.chosen), placement)

    if place(state, request, scorer, priority, allowed) is not None:
        if quota_free:
            return None
        # Only quota stands in the way: one scope, the whole pool, its own tenant's work as victims.
        local = table.relief(request.tenant)
        if not local:
            return None
        own = []  # every one of them is a victim of this scope already
        scope, found = search(prepare(state, np.arange(len(state.names)), local, everywhere, floored=False), None)
        return planned(state, scope, found, priority, everywhere)
    single = is_single_node(request)
    group_of = state.domain_id * (len(state.model_names) + 1) + state.model_id
    best: tuple[VictimCost, float, Plan] | None = None

    def offer(order: float, plan: Plan | None, key: VictimCost | None = None) -> VictimCost | None:
        nonlocal best
        if plan is None:
            return None
        key = key or cost([v for v, _ in plan.victims])
        if best is None or (key, order) < (best[0], best[1]):
            best = (key, order, plan)
        return key

    eligible = eligible_nodes(state, placed) & everywhere
    shape = request.shape if allowed is None else None

    def scope_rows(scope_id: int) -> tuple[np.ndarray, np.ndarray]:
        nodes = np.array([scope_id]) if single else table.group_nodes(group_of, scope_id)
        return nodes, nodes[everywhere[nodes]]

    def refine(parts: Parts, scope_id: int) -> tuple[Parts, Scope] | None:
        """The scope prepared, its bound raised to its root's knapsack floor (None: no set there)."""
        nodes, rows = scope_rows(scope_id)
        scope = prepare(state.rows(rows), rows, table.victims_on(nodes.tolist()))
        if scope.floor is None:
            return parts, scope
        if scope.floor >= NEVER:
            return None
        return max(parts, scope.floor), scope

    def best_parts() -> Parts | None:
        return best[0][:4] if best is not None else None

    scopes = tightened(table, state, placed, single, group_of, eligible, shape, kept=not quota_free)
    if single and not quota_free:
        # Without its own tenant's work a set frees at most the milli on one node: not enough room?
        most = int(table.milli_on.max()) if len(table.milli_on) else 0
        if not within(placed.total_milli, room.after(most, [0] * room.accounts)):
            fits = single_scopes(table, state, placed, eligible, shape)
            scopes = with_relief(table, scopes, request.tenant, fits)
    elif not single and not quota_free and room.accounts == 1:
        scopes = relieved_groups(
            table, state, placed, request.tenant, room, scopes, scope_rows, group_of, request.shape, best_parts
        )
    # Where the cap binds, a scope's plan needs relief its cheapest victim does not bound: scopes go
    # by their root floors, so the best plan comes first and the scopes after it are cut unsearched.
    ordered: Iterator[tuple[Parts, int, Scope | None]]
    ordered = refined(scopes, refine, best_parts) if not quota_free else ((p, s, None) for p, s in scopes)
    for parts, scope_id, prepared in ordered:
        if best is not None and parts > best[0][:4]:
            break  # every scope not yet tried holds only victims dearer than the best plan
        nodes, rows = scope_rows(scope_id)
        if not single:
            stamp = int(state.row_version[rows].sum())
            cached = table.gang_plans.get((request.shape, scope_id)) if quota_free and allowed is None else None
            if cached is not None and cached[0] == stamp:
                offer(float(scope_id), cached[1], cached[2])
                continue
        if prepared is None:
            prepared = prepare(state.rows(rows), rows, table.victims_on(nodes.tolist()), floored=best is not None)
        scope, found = search(prepared, best[0] if best else None)
        plan = planned(prepared.view, scope, found, priority[rows], None)
        key = offer(float(scope_id), plan)
        if not single and quota_free and allowed is None:
            if not found.cut or found.chosen is not None:
                # A set found within the bound is the scope's own cheapest: what was cut cost more.
                table.gang_plans[(request.shape, scope_id)] = (stamp, plan, key)
            elif found.chosen is None and best is not None:
                # Nothing there as cheap as the best plan: a floor for the next request of the shape.
                table.raise_gang_floor(request.shape, scope_id, stamp, max(parts, best[0][:4]))
    if not single and request.tier.rules.mixed_fallback:
        # The whole pool, last in the exhaustive order.
        rows = np.flatnonzero(everywhere)
        view = state.rows(rows)
        scope, found = search(prepare(view, rows, live.tolist(), floored=best is not None), best[0] if best else None)
        offer(math.inf, planned(view, scope, found, priority[rows], None))
    return best[2] if best else None


@dataclass(frozen=True)
class Scope:
    """One scope prepared for its search: its rows (`view`), its victims (`local`, positions), the
    request's mask there, the least and most milli a placement holds, the relief elsewhere, the
    gang's GPUs and eligible nodes (None: a single-node request), and its root's knapsack floor."""

    view: ClusterState
    local: list[int]
    mask: np.ndarray | None
    need_range: tuple[int, int]
    relief: list[int]
    gang: Gang | None
    floor: Parts | None


EXHAUSTIVE_MOST = 16  # candidate victims per scope the exhaustive reference enumerates at most


def plan_preemption_exhaustive(
    state: ClusterState,
    request: Request,
    candidates: Sequence[tuple[Allocation, PreemptReason]],
    room: CapRoom,
    cost: Callable[[Sequence[Allocation]], VictimCost],
    scorer: NodeScorer,
    priority: np.ndarray,
    allowed: np.ndarray | None = None,
) -> Plan | None:
    """`plan_preemption` by brute force, the reference it is checked against (tests, small pools):
    in every scope, every subset of the scope's candidates (the victims holding units there, and the
    request's own tenant's in-quota work anywhere, which relieves its cap) is placed for real on the
    state it frees, within the cap it leaves; the cheapest by `victim_cost`, then scope order, wins.

    Subsets are skipped only when they cannot win: one dearer than the best found, and every subset
    of a size whose cheapest members together already cost more."""
    if not candidates:
        return None
    ordered = sorted(candidates, key=lambda c: cost([c[0]]))
    if place(state, request, scorer, priority, allowed, room_after(room, [])) is not None:
        return None  # it fits within its cap without preempting anything
    own = [k for k, (a, _) in enumerate(ordered) if a.request.tenant == request.tenant and not a.borrowed]
    everywhere = np.ones(len(state.names), dtype=bool) if allowed is None else allowed
    if place(state, request, scorer, priority, allowed) is not None:
        scopes: list[tuple[np.ndarray, list[int]]] = [(everywhere, own)]  # only quota stands in the way
    else:
        scopes = [(mask & everywhere, sorted({*local, *own})) for mask, local in _scopes(state, request, ordered)]
    single = [cost([a])[:4] for a, _ in ordered]
    best: tuple[VictimCost, int, Plan] | None = None
    for order, (mask, pool) in enumerate(scopes):
        if len(pool) > EXHAUSTIVE_MOST:
            raise ValueError(
                f"the exhaustive preemption planner is a reference for small pools: a scope of {request.id} "
                f"has {len(pool)} candidate victims (at most {EXHAUSTIVE_MOST}); plan with the bounded "
                "planner (exhaustive_preemption=False)"
            )
        for size in range(1, len(pool) + 1):
            floor = tuple(sum(single[k][j] for k in pool[:size]) for j in range(4))
            if best is not None and floor > best[0][:4]:
                break  # every set of this size or more costs more than the best plan
            for subset in combinations(pool, size):
                victims = [ordered[k][0] for k in subset]
                key = cost(victims)
                if best is not None and (key, order) >= (best[0], best[1]):
                    continue
                trial = state.copy()
                trial.release_all([v.placement for v in victims])
                placement = place(trial, request, scorer, priority, mask, room_after(room, victims))
                if placement is not None:
                    best = (key, order, Plan(tuple(ordered[k] for k in subset), placement))
    return best[2] if best else None


def _scopes(
    state: ClusterState, request: Request, ordered: Sequence[tuple[Allocation, PreemptReason]]
) -> Iterator[tuple[np.ndarray, list[int]]]:
    """(allowed node mask, indices of the victims holding units there) per scope, in a fixed order."""
    node_victims: dict[int, list[int]] = {}
    for k, (a, _) in enumerate(ordered):
        for name in a.placement.nodes:
            node_victims.setdefault(state.index[name], []).append(k)
    n = len(state.names)
    if is_single_node(request):
        for i in sorted(node_victims):
            mask = np.zeros(n, dtype=bool)
            mask[i] = True
            yield mask, sorted(set(node_victims[i]))
        return
    groups: dict[tuple[int, int], set[int]] = {}
    for i, ks in node_victims.items():
        groups.setdefault((int(state.domain_id[i]), int(state.model_id[i])), set()).update(ks)
    for (domain, model), members in sorted(groups.items()):
        yield (state.domain_id == domain) & (state.model_id == model), sorted(members)
    if request.tier.rules.mixed_fallback:
        yield np.ones(n, dtype=bool), list(range(len(ordered)))
