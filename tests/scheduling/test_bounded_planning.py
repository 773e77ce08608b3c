"""The preemption search is bounded (DESIGN.md 5.2, 5.6): it starts from the greedy set, improves on
it within a budget of steps, is exact where the budget covers the search, and a cycle whose budget is
spent defers the requests it did not reach, which go first in their tier next cycle.

Properties over random small pools (`strategies.full_pools`) and over several cycles of random
multi-tenant work (`strategies.scenarios`); a worst-case family of full pools of
small in-quota work, whose exact search the old planner could not finish, asserts the step bound and
that every decision is valid.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.scheduling.cycle_builders import job, node, quotas, running
from tests.scheduling.strategies import CONFIG, CYCLE_EVERY_S, NOW, full_pools, scenarios, victims_of
from xirang_platform.pool.model import GpuModel, Node, Pool
from xirang_platform.scheduling import quota
from xirang_platform.scheduling.apply import apply_cycle, pending_after
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.model import (
    Allocation,
    GpuSlice,
    HoldReason,
    NodeShare,
    Placement,
    PreemptReason,
    Request,
    Tier,
)
from xirang_platform.scheduling.placement import place
from xirang_platform.scheduling.preemption.cost import victim_cost
from xirang_platform.scheduling.preemption.planner import PreemptionPlanner, plan_preemption
from xirang_platform.scheduling.preemption.reference import plan_preemption_exhaustive
from xirang_platform.scheduling.preemption.scope_search import Steps, room_after
from xirang_platform.scheduling.preemption.victims import Headroom
from xirang_platform.scheduling.snapshot import SchedulerConfig, Snapshot
from xirang_platform.simulate.events import EventLog, check_events

GREEDY_ONLY = replace(CONFIG, plan_steps_per_request=1)  # the first scope's greedy set, nothing improved
UNBOUNDED = replace(CONFIG, plan_steps_per_request=10**9, plan_steps_per_cycle=10**12)


def _plan(snapshot: Snapshot, request: Request, scorer, config: SchedulerConfig, steps: Steps | None = None):
    balances = quota.balances_from(snapshot.book, snapshot.allocations.values())
    candidates = victims_of(snapshot, request)
    room = Headroom(request, snapshot.state, snapshot.book, balances, config)
    priority = np.arange(len(snapshot.state.names))
    plan = plan_preemption(snapshot.state, request, candidates, room, NOW, scorer, priority, None, config, steps)
    return plan, candidates, room


def _cost(plan):
    return victim_cost([v for v, _ in plan.victims], NOW, None) if plan is not None else None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(full_pools())
def test_the_bounded_plan_is_never_costlier_than_the_greedy_one(case) -> None:
    snapshot, request, scorer = case
    greedy, _, _ = _plan(snapshot, request, scorer, GREEDY_ONLY)
    bounded, _, _ = _plan(snapshot, request, scorer, CONFIG)
    assert (greedy is None) == (bounded is None), "the greedy pass finds a plan wherever any exists"
    if greedy is not None:
        event("improved on the greedy set" if _cost(bounded) < _cost(greedy) else "the greedy set stood")
        assert _cost(bounded) <= _cost(greedy)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(full_pools())
def test_where_the_budget_covers_the_search_the_plan_is_the_exhaustive_one(case) -> None:
    snapshot, request, scorer = case
    steps = Steps(CONFIG.plan_steps_per_request, CONFIG.plan_steps_per_cycle)
    bounded, candidates, room = _plan(snapshot, request, scorer, CONFIG, steps)
    event("cut by the budget" if steps.cut else "covered")
    if steps.cut:
        return
    priority = np.arange(len(snapshot.state.names))
    cost = lambda victims: victim_cost(victims, NOW, None)  # noqa: E731
    assert bounded == plan_preemption_exhaustive(snapshot.state, request, candidates, room, cost, scorer, priority)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(full_pools())
def test_every_plan_is_minimal(case) -> None:
    """No victim can be dropped with the request still placed within its cap, greedy or improved."""
    snapshot, request, scorer = case
    for config in (GREEDY_ONLY, CONFIG):
        plan, _, room = _plan(snapshot, request, scorer, config)
        if plan is None:
            continue
        victims = [v for v, _ in plan.victims]
        for dropped in victims:
            rest = [v for v in victims if v is not dropped]
            trial = snapshot.state.copy()
            trial.release_all([v.placement for v in rest])
            priority = np.arange(len(trial.names))
            assert place(trial, request, scorer, priority, None, room_after(room, rest)) is None, (
                f"{dropped.id} was not needed"
            )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from([1, 3, 10, 10**9]))
def test_over_several_cycles_plans_are_minimal_and_steps_within_budget(scenario, per_cycle: int) -> None:
    """Every plan a cycle makes, over several cycles of several tenants' work, is minimal on the
    state it was made on, and no request plans once the cycle's steps are spent."""
    pool, book, reqs, finish_picks = scenario
    config = replace(CONFIG, plan_steps_per_cycle=per_cycle)
    state = Snapshot.build(pool, [], book).state.copy()
    allocations: dict[str, Allocation] = {}
    pending: list[Request] = []
    original = PreemptionPlanner.plan

    def checked(self, state, request, mask, room, allowed=None):
        assert self.steps.cycle_left > 0, "no request plans once the cycle's steps are spent"
        found = original(self, state, request, mask, room, allowed)
        if found is not None:
            victims = [self.victims.ordered[k] for k in found[0]]
            for dropped in victims:
                rest = [v for v in victims if v is not dropped]
                trial = state.copy()
                trial.release_all([v.placement for v in rest])
                refit = place(trial, request, self.scorer, self.priority, allowed, room_after(room, rest))
                assert refit is None, f"{request.id}'s plan stops {dropped.id}, which it does not need"
        return found

    PreemptionPlanner.plan = checked  # type: ignore[method-assign]
    try:
        arrived: set[str] = set()
        for step, pick in enumerate(finish_picks):
            now = CYCLE_EVERY_S * (step + 1)
            pending += [r for r in reqs if r.submit_time <= now and r.id not in arrived]
            arrived |= {r.id for r in pending}
            result = cycle(Snapshot(pool, state, dict(allocations), book), pending, now, config)
            apply_cycle(result, state, allocations, confirm=True)
            pending = [r for r in pending_after(pending, result) if r.id not in _dropped_ids(result)]
            if allocations:  # some work finishes between cycles
                state.release(allocations.pop(sorted(allocations)[pick % len(allocations)]).placement)
    finally:
        PreemptionPlanner.plan = original  # type: ignore[method-assign]


def _dropped_ids(result) -> set[str]:
    return {h.request_id for h in result.holds if h.reason.value in ("never-fits", "exceeds-cap", "unknown-account")}


# --- deferral: the cycle's budget and the wall-clock guard ------------------------------------------

FULL = [node(f"n{i}").gpus(2).domain(f"d{i}") for i in range(4)]
FULL_WORK = [
    running(job(f"p2-{i}-{g}").tenant("b"), on={f"n{i}": [g]}, start=100 * g) for i in range(4) for g in (0, 1)
]


def _full_snapshot() -> Snapshot:
    pool = Pool(tuple(n.build() for n in FULL))
    return Snapshot.build(pool, FULL_WORK, quotas({"a": 8, "b": 8}))


URGENT = [job(f"u{k}").gpus(1).tier("inference").tenant("a").at(float(k)).build() for k in range(3)]


@pytest.mark.parametrize(
    ("per_cycle", "planned", "deferred"),
    [
        pytest.param(10**6, ["u0", "u1", "u2"], [], id="a budget that covers every plan defers nothing"),
        pytest.param(1, ["u0"], ["u1", "u2"], id="the first plan spends a one-step budget: the rest wait deferred"),
    ],
)
def test_requests_the_cycle_budget_does_not_reach_are_deferred(per_cycle, planned, deferred) -> None:
    config = replace(CONFIG, plan_steps_per_cycle=per_cycle)
    result = cycle(_full_snapshot(), URGENT, 5_000.0, config)
    assert sorted(p.by for p in result.preempts) == planned
    assert sorted(a.request_id for a in result.admits) == planned
    assert sorted(h.request_id for h in result.holds if h.reason is HoldReason.DEFERRED) == deferred
    assert result.work.plan_steps > 0


def test_a_deferred_request_goes_first_in_its_tier_next_cycle() -> None:
    config = replace(CONFIG, plan_steps_per_cycle=1)
    snapshot = _full_snapshot()
    first = cycle(snapshot, URGENT, 5_000.0, config)
    waiting = pending_after(URGENT, first)
    assert [r.id for r in waiting if r.deferred] == ["u1", "u2"]
    # Next cycle a newcomer of the same tier, submitted before them, comes after the deferred ones.
    early = job("early").gpus(1).tier("inference").tenant("a").at(-100.0).build()
    state, allocations = snapshot.state.copy(), dict(snapshot.allocations)
    apply_cycle(first, state, allocations, confirm=True)
    second = cycle(Snapshot(snapshot.pool, state, allocations, snapshot.book), [early, *waiting], 5_010.0, config)
    assert [p.by for p in second.preempts] == ["u1"], "the oldest deferred request plans first"
    assert {h.request_id for h in second.holds if h.reason is HoldReason.DEFERRED} == {"u2", "early"}
    third = pending_after([early, *waiting], second)
    assert {r.id for r in third if r.deferred} == {"u2", "early"}


def test_a_request_admitted_after_deferral_and_preempted_later_resumes_not_deferred() -> None:
    requeued = replace(URGENT[0], deferred=True).requeued(PreemptReason.PRIORITY, 1.0)
    assert (requeued.preempted, requeued.deferred) == (1, False)


def test_the_wall_clock_guard_defers_every_request_not_yet_decided() -> None:
    calls = {"n": 0}

    def out_of_time() -> bool:  # the guard says so once two requests were decided
        calls["n"] += 1
        return calls["n"] > 2

    fits = [job(f"f{k}").gpus(1).tier("offline-training").tenant("a").at(float(k)).build() for k in range(4)]
    pool = Pool(tuple(n.build() for n in FULL))
    result = cycle(Snapshot.build(pool, [], quotas({"a": 8})), fits, 10.0, CONFIG, out_of_time=out_of_time)
    assert [a.request_id for a in result.admits] == ["f0", "f1"]
    assert [h.request_id for h in result.holds if h.reason is HoldReason.DEFERRED] == ["f2", "f3"]
    assert "goes first in its tier next cycle" in result.holds[0].message


# --- the worst case: full pools of small in-quota work whose exact search explodes -------------------

H100 = GpuModel("H100-SXM", 81559, 989)
WORST_TENANTS = ("t0", "t1", "t2", "t3")


def worst_case(nodes: int, requests: int, seed: int = 7) -> tuple[Snapshot, list[Request]]:
    """`nodes` 8-GPU nodes (domains of 16) full of 1-, 2- and 4-GPU in-quota P2 work of four
    tenants, each tenant's quota what it holds (every plan must relieve its cap), and P0 replicas and
    P1 gangs of 2-8 GPUs of those tenants."""
    rng = np.random.default_rng(seed)
    pool = Pool(
        tuple(Node(f"n{i:05d}", H100, 8, 192_000, 2_000_000, f"d{i // 16:04d}", unit_milli=125) for i in range(nodes))
    )
    work, held = [], dict.fromkeys(WORST_TENANTS, 0)
    for n in pool.nodes:
        gpu = 0
        while gpu < 8:
            size = min(int(rng.choice([1, 1, 2, 4])), 8 - gpu)
            tenant = WORST_TENANTS[int(rng.integers(len(WORST_TENANTS)))]
            r = Request(f"w{len(work):06d}", tenant, "default", Tier.OFFLINE_TRAINING, 0.0, gpus=size)
            slices = tuple(GpuSlice(n.name, g, 1000) for g in range(gpu, gpu + size))
            work.append(Allocation(r, Placement(slices, (NodeShare(n.name, 0, 0),)), float(rng.integers(0, 3000))))
            held[tenant] += size * 1000
            gpu += size
    book = quota.QuotaBook(held, {(t, "default"): None for t in WORST_TENANTS})
    urgent = []
    for k in range(requests):
        tenant = WORST_TENANTS[k % len(WORST_TENANTS)]
        if k % 3 == 0:
            urgent.append(Request(f"u{k:04d}", tenant, "default", Tier.INFERENCE, 3000.0 + k, gpus=1))
        else:
            gpus = int(rng.choice([2, 4, 8]))
            urgent.append(Request(f"u{k:04d}", tenant, "default", Tier.ONLINE_TRAINING, 3000.0 + k, gpus=gpus))
    return Snapshot.build(pool, work, book), urgent


@pytest.mark.parametrize(
    ("nodes", "requests", "per_cycle"),
    [
        pytest.param(24, 3, 50_000, id="24 nodes, 3 requests: the old exact search took seconds here"),
        pytest.param(40, 5, 50_000, id="40 nodes, 5 requests: the old exact search never finished"),
        pytest.param(400, 30, 500, id="400 nodes, 30 requests, a cycle budget that defers some"),
        pytest.param(4000, 8, 50_000, id="4,000 nodes, 8 requests"),
    ],
)
def test_worst_case_pools_stay_within_the_step_bound_and_decide_validly(nodes, requests, per_cycle) -> None:
    snapshot, urgent = worst_case(nodes, requests)
    config = SchedulerConfig(plan_steps_per_cycle=per_cycle)
    result = cycle(snapshot, urgent, 3600.0, config)
    # The bound: the cycle's budget, plus what the last request started within it may spend: its own
    # budget and its first scope's greedy passes (two orders, each adding then dropping a scope's
    # candidates: at most 16 nodes x 8 GPUs of victims there, and 8 + 4 + 2 of its own 1-, 2- and
    # 4-GPU work elsewhere to relieve an 8-GPU cap shortfall).
    assert result.work.plan_steps <= per_cycle + config.plan_steps_per_request + 2 * 2 * (16 * 8 + 8 + 4 + 2)
    decided = {a.request_id for a in result.admits} | {h.request_id for h in result.holds}
    assert decided == {r.id for r in urgent}, "every request is admitted or held, none lost"
    state, allocations = snapshot.state.copy(), dict(snapshot.allocations)
    apply_cycle(result, state, allocations, confirm=True)
    assert state.check() == []
    log = EventLog()
    for a in snapshot.allocations.values():
        log.submit(0.0, a.request, 0.0)
        log.admit(0.0, a)
    for r in urgent:
        log.submit(3600.0, r, 0.0)
    for p in result.preempts:
        log.preempt(3600.0, p.victim.id, p.by, p.reason.value, 0.0)
    for a in result.admits:
        log.admit(3600.0, a.allocation)
    assert check_events(log.events, snapshot.pool, snapshot.book, config.overcommit) == []
    if per_cycle < 50_000:
        assert any(h.reason is HoldReason.DEFERRED for h in result.holds)
