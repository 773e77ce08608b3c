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
from xirang_platform.scheduling.feasibility import eligible_nodes, single_node_fit
from xirang_platform.scheduling.model import Allocation, Placement, PreemptReason, Request
from xirang_platform.scheduling.placement import as_placed, is_single_node, place, usable_whole_gpus
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


class Candidates:
    """The allocations a request may preempt, cheapest first (`victim_cost` of each alone), with the
    per-node arrays the planner's bounds read. A cycle keeps one per kind of request and marks
    victims gone (`drop`) as it preempts them, so the list is sorted once per cycle."""

    def __init__(
        self,
        state: ClusterState,
        candidates: Sequence[tuple[Allocation, PreemptReason]],
        cost: Callable[[Sequence[Allocation]], VictimCost],
    ) -> None:
        costs = [cost([c[0]]) for c in candidates]
        order = sorted(range(len(candidates)), key=costs.__getitem__)
        self.ordered: list[tuple[Allocation, PreemptReason]] = [candidates[k] for k in order]
        self.bound: list[tuple[float, int, float, int]] = [costs[k][:4] for k in order]
        self.position = {a.id: k for k, (a, _) in enumerate(self.ordered)}
        self.active = np.ones(len(self.ordered), dtype=bool)
        index = state.index
        # One row per (victim, node it holds), and one per GPU slice / node share it holds.
        member = [
            (index[name], k) for k, (a, _) in enumerate(self.ordered) for name in dict.fromkeys(a.placement.nodes)
        ]
        slices = [
            (index[s.node], s.gpu, s.milli, s.gpu_memory_mib, k)
            for k, (a, _) in enumerate(self.ordered)
            for s in a.placement.slices
        ]
        shares = [
            (index[h.node], h.cpu_milli, h.memory_mib, k)
            for k, (a, _) in enumerate(self.ordered)
            for h in a.placement.shares
        ]
        self.member = np.array(member, dtype=np.int64).reshape(-1, 2)
        self.slices = np.array(slices, dtype=np.int64).reshape(-1, 5)
        self.shares = np.array(shares, dtype=np.int64).reshape(-1, 4)

    def drop(self, allocation_id: str) -> None:
        """Mark a victim gone (it was preempted): no later plan of this cycle lists it."""
        k = self.position.get(allocation_id)
        if k is not None:
            self.active[k] = False

    def released(self, state: ClusterState) -> ClusterState:
        """`state` with every active candidate gone: on each node, the most any plan could free there."""
        out = state.copy()
        sl = self.slices[self.active[self.slices[:, 4]]]
        np.add.at(out.gpu_free, (sl[:, 0], sl[:, 1]), sl[:, 2])
        np.add.at(out.gpu_mem_free, (sl[:, 0], sl[:, 1]), sl[:, 3])
        sh = self.shares[self.active[self.shares[:, 3]]]
        np.add.at(out.cpu_free, sh[:, 0], sh[:, 1])
        np.add.at(out.mem_free, sh[:, 0], sh[:, 2])
        out.whole_free = (out.gpu_free == MILLI_PER_GPU).sum(axis=1)
        return out


def plan_preemption(
    state: ClusterState,
    request: Request,
    candidates: Sequence[tuple[Allocation, PreemptReason]] | Candidates,
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

    Decides exactly as `plan_preemption_exhaustive` does, trying far fewer scopes: a scope's plan
    holds at least one of the scope's victims, so it costs no less than its cheapest victim alone
    (every part of `victim_cost` but the ids only grows with more victims). Scopes are tried
    cheapest bound first, only those where the request would fit with all their victims gone, and
    the search stops once the bound exceeds the best plan found. Each scope is planned on a copy of
    its own rows.
    """
    table = candidates if isinstance(candidates, Candidates) else Candidates(state, candidates, cost)
    live = np.flatnonzero(table.active)
    if len(live) == 0:
        return None
    ordered = table.ordered
    relief = [int(k) for k in live if ordered[k][0].request.tenant == request.tenant and not ordered[k][0].borrowed]
    everywhere = np.ones(len(state.names), dtype=bool) if allowed is None else allowed
    if place(state, request, scorer, priority, allowed) is not None:
        # Only quota stands in the way: one scope, the whole pool.
        plan = _plan_in_scope(state, request, everywhere, [], relief, ordered, headroom_after, scorer, priority)
        return plan
    member = table.member[table.active[table.member[:, 1]]]
    member = member[np.lexsort((member[:, 1], member[:, 0]))]  # by node, then cheapest victim
    released = table.released(state)
    placed = as_placed(request)
    eligible = eligible_nodes(state, placed) & everywhere
    # The scopes where the request would fit with all their victims gone, in the exhaustive order:
    # (nodes, the scope's victims cheapest first).
    scopes: list[tuple[np.ndarray, np.ndarray]] = []
    if is_single_node(request):
        nodes, starts = np.unique(member[:, 0], return_index=True)
        ends = np.r_[starts[1:], len(member)]
        could = np.isin(nodes, single_node_fit(released, placed, eligible))
        for k in np.flatnonzero(could).tolist():
            scopes.append((nodes[k : k + 1], member[starts[k] : ends[k], 1]))
    else:
        usable = usable_whole_gpus(released, placed, eligible)
        group_of = state.domain_id * (len(state.model_names) + 1) + state.model_id
        for g in np.unique(group_of[member[:, 0]]).tolist():
            nodes = np.flatnonzero(group_of == g)
            if usable[nodes].sum() >= request.gpus:
                scopes.append((nodes, np.unique(member[np.isin(member[:, 0], nodes), 1])))
        if request.tier.rules.mixed_fallback and usable.sum() >= request.gpus:
            scopes.append((np.arange(len(state.names)), np.unique(member[:, 1])))
    bounds = [table.bound[int(local[0])] for _, local in scopes]
    best: tuple[VictimCost, int, Plan] | None = None
    for s in sorted(range(len(scopes)), key=lambda s: (bounds[s], s)):
        if best is not None and bounds[s] > best[0][:4]:
            break  # no scope left can beat the best plan
        nodes, local = scopes[s]
        rows = nodes[everywhere[nodes]]
        view = state.rows(rows)
        plan = _plan_in_scope(
            view, request, None, local.tolist(), relief, ordered, headroom_after, scorer, priority[rows]
        )
        if plan is None:
            continue
        key = cost([v for v, _ in plan.victims])
        if best is None or (key, s) < (best[0], best[1]):
            best = (key, s, plan)
    return best[2] if best else None


def plan_preemption_exhaustive(
    state: ClusterState,
    request: Request,
    candidates: Sequence[tuple[Allocation, PreemptReason]],
    headroom_after: Callable[[Sequence[Allocation]], int],
    cost: Callable[[Sequence[Allocation]], VictimCost],
    scorer: NodeScorer,
    priority: np.ndarray,
    allowed: np.ndarray | None = None,
) -> Plan | None:
    """`plan_preemption` by trying every scope on a copy of the whole state: the reference the
    bounded planner is checked against (tests, `bench/cycle_speed.py`)."""
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
    allowed: np.ndarray | None,
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
