"""Preemption plans: the smallest victim set whose freed units really form a valid placement.

A plan is searched per scope (a node for single-node requests, a (domain, model) group for gangs,
the whole pool for a P2 gang's mixed fallback). In each scope victims are removed in preference
order (borrowed first, then youngest, then id) until the request both fits physically and passes
its quota check; then each victim is put back, last first, if the request still fits without
removing it. The scope with the fewest victims wins, then the least work lost. The plan is checked
by actually placing the request on the what-if state, so "admitted but cannot run" cannot happen
(the Kueue #5243 failure: eight freed GPUs scattered over four nodes do not admit an 8-GPU gang).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

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


def preference_key(a: Allocation) -> tuple[bool, float, str]:
    """Victim order: borrowed first, then youngest (least work lost), then id."""
    return (not a.borrowed, -a.start, a.id)


def plan_preemption(
    state: ClusterState,
    request: Request,
    candidates: Sequence[tuple[Allocation, PreemptReason]],
    quota_ok: Callable[[Sequence[Allocation], int], bool],
    scorer: NodeScorer,
    priority: np.ndarray,
) -> Plan | None:
    """The best plan that frees a valid placement for `request`, or None.

    `candidates` are the allocations it may preempt; `quota_ok(victims, milli)` says whether the
    request, holding `milli`, passes its quota check once `victims` are gone (a request over its own cap may stop its own
    tenant's in-quota work to get back under it).
    """
    if not candidates:
        return None
    ordered = sorted(candidates, key=lambda c: preference_key(c[0]))
    relief = [k for k, (a, _) in enumerate(ordered) if a.request.tenant == request.tenant and not a.borrowed]
    best: tuple[tuple[int, float, str], Plan] | None = None
    everywhere = np.ones(len(state.names), dtype=bool)
    if place(state, request, scorer, priority) is not None:
        scopes: Iterator[tuple[np.ndarray, list[int]]] = iter([(everywhere, [])])  # only quota stands in the way
    else:
        scopes = _scopes(state, request, ordered)
    for allowed, local in scopes:
        plan = _plan_in_scope(state, request, allowed, local, relief, ordered, quota_ok, scorer, priority)
        if plan is None:
            continue
        lost = sum(v.milli * 1.0 for v, _ in plan.victims)
        key = (len(plan.victims), lost, ",".join(sorted(v.id for v, _ in plan.victims)))
        if best is None or key < best[0]:
            best = (key, plan)
    return best[1] if best else None


def _scopes(
    state: ClusterState, request: Request, ordered: Sequence[tuple[Allocation, PreemptReason]]
) -> Iterator[tuple[np.ndarray, list[int]]]:
    """(allowed node mask, indices of the victims holding units there) per scope, in a fixed order."""
    node_victims: dict[int, list[int]] = {}
    for k, (a, _) in enumerate(ordered):
        for node in a.placement.nodes:
            node_victims.setdefault(state.index[node], []).append(k)
    n = len(state.names)
    if is_single_node(request):
        for node in sorted(node_victims):
            mask = np.zeros(n, dtype=bool)
            mask[node] = True
            yield mask, sorted(set(node_victims[node]))
        return
    groups: dict[tuple[int, int], set[int]] = {}
    for node, ks in node_victims.items():
        groups.setdefault((int(state.domain_id[node]), int(state.model_id[node])), set()).update(ks)
    for (domain, model), ks in sorted(groups.items()):
        yield (state.domain_id == domain) & (state.model_id == model), sorted(ks)
    if request.tier.rules.mixed_fallback:
        yield np.ones(n, dtype=bool), list(range(len(ordered)))


def _plan_in_scope(
    state: ClusterState,
    request: Request,
    allowed: np.ndarray,
    local: list[int],
    relief: list[int],
    ordered: Sequence[tuple[Allocation, PreemptReason]],
    quota_ok: Callable[[Sequence[Allocation], int], bool],
    scorer: NodeScorer,
    priority: np.ndarray,
) -> Plan | None:
    """Remove the scope's victims in order until the request fits, then relief victims until it
    passes quota; then fill back what was not needed."""
    trial = state.copy()
    chosen: list[int] = []

    def gone() -> list[Allocation]:
        return [ordered[j][0] for j in chosen]

    placement = place(trial, request, scorer, priority, allowed)
    for k in local:
        if placement is not None:
            break
        trial.release(ordered[k][0].placement)
        chosen.append(k)
        placement = place(trial, request, scorer, priority, allowed)
    if placement is None:
        return None
    for k in relief:
        if quota_ok(gone(), placement.milli):
            break
        if k in chosen:
            continue
        trial.release(ordered[k][0].placement)
        chosen.append(k)
    if not quota_ok(gone(), placement.milli):
        return None
    # Fill back: put victims back, last first, while the request still fits and passes without them.
    for k in reversed(list(chosen)):
        trial.apply(ordered[k][0].placement)
        rest = [j for j in chosen if j != k]
        again = place(trial, request, scorer, priority, allowed)
        if again is not None and quota_ok([ordered[j][0] for j in rest], again.milli):
            chosen = rest
            placement = again
        else:
            trial.release(ordered[k][0].placement)
    if not chosen:
        return None  # it fits without preempting anything: not a preemption plan
    placement = place(trial, request, scorer, priority, allowed)
    assert placement is not None, "a plan must leave a valid placement"
    return Plan(tuple(ordered[k] for k in chosen), placement)
