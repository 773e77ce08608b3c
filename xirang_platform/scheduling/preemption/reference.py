"""The exhaustive preemption planner: the reference the bounded planner is checked against (tests,
small pools, `SchedulerConfig.exhaustive_preemption`), written independently of it.

In every scope, every subset of the scope's candidates (the victims holding units there, and the
request's own tenant's in-quota work anywhere, which relieves its cap) is placed for real on the
state it frees, within the cap it leaves; the cheapest by `victim_cost`, then scope order, wins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from itertools import combinations

import numpy as np

from xirang_platform.scheduling.model import Allocation, PreemptReason, Request
from xirang_platform.scheduling.placement import is_single_node, place
from xirang_platform.scheduling.preemption.cost import Plan, VictimCost
from xirang_platform.scheduling.preemption.scope_search import CapRoom, room_after
from xirang_platform.scheduling.scorers import NodeScorer
from xirang_platform.scheduling.state import ClusterState

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
    """The cheapest valid plan by brute force (None: no victim set is valid). Subsets are skipped
    only when they cannot win: one dearer than the best found, and every subset of a size whose
    cheapest members together already cost more."""
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
