"""Preemption plans: the cheapest victim set whose freed units really form a valid placement.

Cheapest is one order, `victim_cost` (DESIGN.md section 5.2), read for single victims and whole
plans alike: borrowed victims before in-quota ones, then least work lost (GPU-seconds since the last
checkpoint), then fewest victims; ids only break exact ties.

A plan is searched per scope (a node for single-node requests, a (domain, model) group for gangs,
the whole pool for a P2 gang's mixed fallback). In each scope victims are removed cheapest first
until the request fits physically, then the request's own tenant's in-quota work until it fits its
cap (with the victims gone, at the cap ratio of the allocation they leave); then each victim is put
back, last first, if the request still fits without it. The cheapest scope's plan wins. The plan is
checked by placing the request on the what-if state within its cap, and that placement is the one
admitted, so neither "admitted but cannot run" (the Kueue #5243 failure: eight freed GPUs scattered
over four nodes do not admit an 8-GPU gang) nor "admitted past its cap" can happen.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling import quota
from xirang_platform.scheduling.model import Allocation, Placement, PreemptReason, Request
from xirang_platform.scheduling.placement import is_single_node, place
from xirang_platform.scheduling.scorers import NodeScorer
from xirang_platform.scheduling.state import ClusterState


@dataclass(frozen=True)
class Plan:
    """Victims to stop (with why) and where the request then runs."""

    victims: tuple[tuple[Allocation, PreemptReason], ...]
    placement: Placement


def victim_reason(
    request: Request,
    victim: Allocation,
    book: quota.QuotaBook,
    balances: Mapping[quota.AccountKey, quota.Balance],
    ratio: float,
) -> PreemptReason | None:
    """Why `request` may preempt `victim`, or None if it may not.

    - P0/P1 may preempt any P2 work and any borrowed work (priority; reclaim when the victim
      borrowed from another tenant).
    - Any request whose tenant is under its cap may reclaim another tenant's borrowed work.
    """
    if not quota.is_reclaimable(victim):
        return None
    other_tenant = victim.request.tenant != request.tenant
    if victim.borrowed and other_tenant and quota.under_cap(book, balances, request.tenant, request.project, ratio):
        return PreemptReason.RECLAIM
    if request.tier.rules.may_preempt and (victim.borrowed or victim.request.tier.rank > request.tier.rank):
        return PreemptReason.PRIORITY
    return None


def work_lost(a: Allocation, now: float, checkpoint_interval_s: float | None) -> float:
    """GPU-seconds that preempting `a` at `now` throws away: the work since its last checkpoint
    (since its start when it does not checkpoint)."""
    ran = max(0.0, now - a.start)
    saved = math.floor(ran / checkpoint_interval_s) * checkpoint_interval_s if checkpoint_interval_s else 0.0
    return (ran - saved) * a.milli / MILLI_PER_GPU


VictimCost = tuple[float, int, float, int, tuple[str, ...]]


def victim_cost(victims: Iterable[Allocation], now: float, checkpoint_interval_s: float | None) -> VictimCost:
    """The cost of preempting `victims` (one, or a whole plan); smaller is cheaper.

    In order: in-quota work lost and in-quota victims (so borrowed victims always go first), then
    all work lost, then the number of victims, then the ids (exact ties only).
    """
    in_quota_lost, in_quota, lost, ids = 0.0, 0, 0.0, []
    for v in victims:
        w = work_lost(v, now, checkpoint_interval_s)
        lost += w
        ids.append(v.id)
        if not v.borrowed:
            in_quota_lost += w
            in_quota += 1
    return (round(in_quota_lost, 6), in_quota, round(lost, 6), len(ids), tuple(sorted(ids)))


def plan_preemption(
    state: ClusterState,
    request: Request,
    candidates: Sequence[tuple[Allocation, PreemptReason]],
    headroom_after: Callable[[Sequence[Allocation]], int],
    cost: Callable[[Sequence[Allocation]], VictimCost],
    scorer: NodeScorer,
    priority: np.ndarray,
    allowed: np.ndarray | None = None,
) -> Plan | None:
    """The cheapest plan that frees a valid placement for `request` within its cap, or None.

    `candidates` are the allocations it may preempt; `headroom_after(victims)` is the in-quota milli
    the request may hold once `victims` are gone (a request over its own cap may stop its own
    tenant's in-quota work to get back under it); `cost` is `victim_cost` at the cycle's time;
    `allowed` limits the nodes the request may use (None = all).
    """
    if not candidates:
        return None
    ordered = sorted(candidates, key=lambda c: cost([c[0]]))
    relief = [k for k, (a, _) in enumerate(ordered) if a.request.tenant == request.tenant and not a.borrowed]
    best: tuple[VictimCost, Plan] | None = None
    everywhere = np.ones(len(state.names), dtype=bool) if allowed is None else allowed
    if place(state, request, scorer, priority, allowed) is not None:
        scopes: Iterator[tuple[np.ndarray, list[int]]] = iter([(everywhere, [])])  # only quota stands in the way
    else:
        scopes = ((mask & everywhere, local) for mask, local in _scopes(state, request, ordered))
    for scope, local in scopes:
        plan = _plan_in_scope(state, request, scope, local, relief, ordered, headroom_after, scorer, priority)
        if plan is None:
            continue
        key = cost([v for v, _ in plan.victims])
        if best is None or key < best[0]:
            best = (key, plan)
    return best[1] if best else None


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


def _plan_in_scope(
    state: ClusterState,
    request: Request,
    allowed: np.ndarray,
    local: list[int],
    relief: list[int],
    ordered: Sequence[tuple[Allocation, PreemptReason]],
    headroom_after: Callable[[Sequence[Allocation]], int],
    scorer: NodeScorer,
    priority: np.ndarray,
) -> Plan | None:
    """Remove the scope's victims in order until the request fits, then relief victims until it
    fits its cap; then put back what was not needed."""
    trial = state.copy()
    chosen: list[int] = []

    def within_cap(victims: list[int]) -> Placement | None:
        return place(trial, request, scorer, priority, allowed, headroom_after([ordered[j][0] for j in victims]))

    room = place(trial, request, scorer, priority, allowed)
    for k in local:
        if room is not None:
            break
        trial.release(ordered[k][0].placement)
        chosen.append(k)
        room = place(trial, request, scorer, priority, allowed)
    if room is None:
        return None
    placement = within_cap(chosen)
    for k in relief:
        if placement is not None:
            break
        if k in chosen:
            continue
        trial.release(ordered[k][0].placement)
        chosen.append(k)
        placement = within_cap(chosen)
    if placement is None:
        return None
    # Put victims back, last first, while the request still fits (within its cap) without them.
    for k in reversed(list(chosen)):
        trial.apply(ordered[k][0].placement)
        rest = [j for j in chosen if j != k]
        if within_cap(rest) is not None:
            chosen = rest
        else:
            trial.release(ordered[k][0].placement)
    if not chosen:
        return None  # it fits without preempting anything: not a preemption plan
    placement = within_cap(chosen)
    if placement is None:
        raise AssertionError(f"preemption plan for {request.id} left no placement within its cap")
    return Plan(tuple(ordered[k] for k in chosen), placement)
