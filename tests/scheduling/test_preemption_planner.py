"""The bounded preemption planner decides exactly as the exhaustive one (the reference it prunes).

`plan_preemption` tries scopes in victim order and stops once no scope left can beat its best plan;
`plan_preemption_exhaustive` tries every scope on a copy of the whole state. On random small pools
full of work, for random requests and quota room, both must return the same plan (so the fast one
finds a plan whenever the exhaustive one does, and no worse a victim set by `victim_cost`), and whole
cycles over several steps must decide the same with either planner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_cycle_properties import CONFIG, CYCLE_EVERY_S, TENANTS, pools, requests, scenarios

from xirang_platform.scheduling import quota
from xirang_platform.scheduling.apply import apply_cycle, pending_after
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.model import Allocation, Request, Tier
from xirang_platform.scheduling.preemption import (
    plan_preemption,
    plan_preemption_exhaustive,
    victim_cost,
    victim_reason,
)
from xirang_platform.scheduling.scorers import BestFit, RandomFit
from xirang_platform.scheduling.snapshot import Snapshot
from xirang_platform.scheduling.victims import CycleVictims

NOW = 5_000.0
EXHAUSTIVE = replace(CONFIG, exhaustive_preemption=True)


@st.composite
def full_pools(draw):
    """A pool filled by one cycle of random work started at random times, a request that may need
    a preemption, and the in-quota room its tenant has before any victim is relieved."""
    pool = draw(pools())
    book = quota.QuotaBook({t: 4000 for t in TENANTS}, {(t, "default"): None for t in TENANTS})
    work = [
        replace(draw(requests(k)), tier=draw(st.sampled_from([Tier.OFFLINE_TRAINING, Tier.BATCH_INFERENCE])))
        for k in range(draw(st.integers(2, 20)))
    ]
    filled = cycle(Snapshot.build(pool, [], book), work, 0.0, replace(CONFIG, preemption=False))
    starts = draw(
        st.lists(
            st.sampled_from([0.0, 1_000.0, 2_500.0, 4_000.0]), min_size=len(filled.admits), max_size=len(filled.admits)
        )
    )
    running = [replace(a.allocation, start=t, confirmed=True) for a, t in zip(filled.admits, starts, strict=True)]
    urgent = replace(
        draw(requests(999)),
        id="urgent",
        tier=draw(st.sampled_from([Tier.INFERENCE, Tier.ONLINE_TRAINING, Tier.OFFLINE_TRAINING])),
    )
    room = draw(st.sampled_from([-2000, 0, 500, 1 << 40]))
    scorer = draw(st.sampled_from([BestFit(), RandomFit(3)]))
    return Snapshot.build(pool, running, book), urgent, room, scorer


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(full_pools())
def test_bounded_planner_returns_the_exhaustive_plan(case) -> None:
    snapshot, request, room, scorer = case
    balances = quota.balances_from(snapshot.book, snapshot.allocations.values())
    candidates = []
    for a in sorted(snapshot.allocations.values(), key=lambda a: a.id):
        reason = victim_reason(request, a, snapshot.book, balances, 1.0)
        if reason is not None:
            candidates.append((a, reason))

    def headroom_after(victims: Sequence[Allocation]) -> int:
        own = sum(v.milli for v in victims if v.request.tenant == request.tenant and not v.borrowed)
        return room + own

    def cost(victims: Sequence[Allocation]):
        return victim_cost(victims, NOW, None)

    priority = np.arange(len(snapshot.state.names))
    args = (headroom_after, cost, scorer, priority)
    reference = plan_preemption_exhaustive(snapshot.state, request, candidates, *args)
    fast = plan_preemption(snapshot.state, request, candidates, *args)
    event("a plan" if reference is not None else "no plan")
    assert (fast is None) == (reference is None), "a plan is found exactly when the exhaustive planner finds one"
    if reference is not None:
        assert fast is not None
        assert cost([v for v, _ in fast.victims]) <= cost([v for v, _ in reference.victims]), "no worse a victim set"
        assert fast == reference, "the same victims, reasons and placement"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_cycles_decide_the_same_with_either_planner(scenario) -> None:
    pool, book, reqs, finish_picks = scenario
    state = Snapshot.build(pool, [], book).state.copy()
    allocations: dict[str, Allocation] = {}
    pending: list[Request] = []
    arrived: set[str] = set()
    for step, pick in enumerate(finish_picks):
        now = CYCLE_EVERY_S * (step + 1)
        pending += [r for r in reqs if r.submit_time <= now and r.id not in arrived]
        arrived |= {r.id for r in pending}
        before = Snapshot(pool, state, dict(allocations), book)
        result = cycle(before, pending, now, CONFIG)
        assert result == cycle(before, pending, now, EXHAUSTIVE)
        apply_cycle(result, state, allocations, confirm=True)
        pending = pending_after(pending, result)
        if allocations:
            done = sorted(allocations)[pick % len(allocations)]
            state.release(allocations.pop(done).placement)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(full_pools(), st.sampled_from([0.0, 1.0, 0.3]))
def test_a_request_said_to_have_no_victim_has_none(case, borrowed_share: float) -> None:
    """`CycleVictims.none_for` spares the victim list only when listing it would find nothing."""
    snapshot, request, _, _ = case
    # Turn a share of the running work borrowed, so reclaims are possible.
    running = sorted(snapshot.allocations.values(), key=lambda a: a.id)
    cut = int(len(running) * borrowed_share)
    snapshot = Snapshot.build(
        snapshot.pool, [replace(a, borrowed=k < cut) for k, a in enumerate(running)], snapshot.book
    )
    balances = quota.balances_from(snapshot.book, snapshot.allocations.values())
    victims = CycleVictims(snapshot.allocations, NOW, CONFIG)
    says_none = victims.none_for(request, snapshot.book, balances, 1.0)
    found = list(victims.candidates(request, snapshot.book, balances, 1.0))
    event("none" if says_none else ("some" if found else "listed, none found"))
    if says_none:
        assert found == []
