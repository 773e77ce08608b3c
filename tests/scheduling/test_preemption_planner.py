"""The preemption planner picks the cheapest valid victim set (DESIGN.md section 5.2).

`plan_preemption` searches each scope by branch and bound and stops once no scope left can beat its
best plan; `plan_preemption_exhaustive` is an independent brute force: every subset of each scope's
candidates, placed for real on the state it frees, within the cap it leaves. Tables show the
contract's order inside one scope; on random small pools full of work, for random requests and
quotas, both planners must return the same plan (the cheapest by `victim_cost` among all valid
subsets), and whole cycles over several steps must decide the same with either planner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.scheduling.cycle_builders import JobBuilder, gpus_by_node, job, node, quotas, running
from tests.scheduling.strategies import CONFIG, CYCLE_EVERY_S, NOW, full_pools, scenarios, victims_of
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling import quota
from xirang_platform.scheduling.apply import apply_cycle, pending_after
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.model import Allocation, PreemptReason, Request
from xirang_platform.scheduling.preemption.cost import victim_cost, work_lost
from xirang_platform.scheduling.preemption.planner import plan_preemption
from xirang_platform.scheduling.preemption.reference import plan_preemption_exhaustive
from xirang_platform.scheduling.preemption.victims import CycleVictims, Headroom
from xirang_platform.scheduling.scorers import BestFit
from xirang_platform.scheduling.snapshot import Snapshot

EXHAUSTIVE = replace(CONFIG, exhaustive_preemption=True)
# A budget no search here reaches: the bounded planner is then exact, and decides as the reference.
UNBOUNDED = replace(CONFIG, plan_steps_per_request=10**9, plan_steps_per_cycle=10**12)


def _plans(snapshot: Snapshot, request: Request, scorer, candidates=None, now: float = NOW):
    """The bounded and the exhaustive plan for `request` on `snapshot` at `now`, with the cycle's
    headroom; `candidates`: the victims it may preempt (None: by `victim_reason`)."""
    balances = quota.balances_from(snapshot.book, snapshot.allocations.values())
    if candidates is None:
        candidates = victims_of(snapshot, request)
    room = Headroom(request, snapshot.state, snapshot.book, balances, CONFIG)
    priority = np.arange(len(snapshot.state.names))
    fast = plan_preemption(snapshot.state, request, candidates, room, now, scorer, priority, None, UNBOUNDED)
    cost = lambda victims: victim_cost(victims, now, None)  # noqa: E731
    return fast, plan_preemption_exhaustive(snapshot.state, request, candidates, room, cost, scorer, priority)


def _cost(victims: Sequence[Allocation]):
    return victim_cost(victims, NOW, None)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(full_pools())
def test_the_plan_is_the_cheapest_valid_victim_set(case) -> None:
    snapshot, request, scorer = case
    fast, reference = _plans(snapshot, request, scorer)
    event("a plan" if reference is not None else "no plan")
    event(f"{len(reference.victims) if reference else 0} victims")
    assert (fast is None) == (reference is None), "a plan is found exactly when some victim set is valid"
    if reference is not None:
        assert fast is not None
        assert _cost([v for v, _ in fast.victims]) == _cost([v for v, _ in reference.victims]), "the cheapest set"
        assert fast == reference, "the same victims, reasons and placement"


TWO_GPUS = [node("n0").gpus(2)]
HALVES = [
    running(job("half-a").gpus(1).milli(500), on={"n0": [0]}, start=0),
    running(job("half-b").gpus(1).milli(500), on={"n0": [0]}, start=0),
]


@pytest.mark.parametrize(
    ("allocs", "want"),
    [
        pytest.param(
            [*HALVES, running(job("whole").gpus(1), on={"n0": [1]}, start=400)],
            (["whole"], {"n0": [1]}),
            id="one job that ran less beats two halves that together lost more (600 vs 1,000 GPU-s)",
        ),
        pytest.param(
            [*HALVES, running(job("whole").gpus(1), on={"n0": [1]}, start=0)],
            (["whole"], {"n0": [1]}),
            id="at equal work lost one victim beats two",
        ),
    ],
)
def test_inside_one_node_the_cheapest_set_wins_not_the_cheapest_victims_first(allocs, want) -> None:
    pool = Pool(tuple(n.build() for n in TWO_GPUS))
    snapshot = Snapshot.build(pool, allocs, quota.QuotaBook.single_tenant(pool.gpu_milli, tenant="acme"))
    request = job("urgent").gpus(1).tier("online-training").build()
    candidates = [(a, PreemptReason.PRIORITY) for a in allocs]
    for plan in _plans(snapshot, request, BestFit(), candidates, now=1_000.0):
        assert plan is not None
        assert (sorted(v.id for v, _ in plan.victims), gpus_by_node(plan.placement)) == want


def _p2(job_id: str, tenant: str) -> JobBuilder:
    return job(job_id).gpus(1).tier("offline-training").tenant(tenant)


# Two 2-node domains full of one-GPU P2 work: rival's cheap work (300 GPU-s lost each at t=1,000) in
# domain a, acme's own dearer work (400 each) in domain b, and acme's oldest work (1,000) on c0.
RELIEF_NODES = [node(n).gpus(2).domain(n[0]) for n in ("a0", "a1", "b0", "b1", "c0")]
RELIEF_WORK = [
    *(running(_p2(f"rival-{k}", "rival"), on={f"a{k // 2}": [k % 2]}, start=700) for k in range(4)),
    *(running(_p2(f"own-{k}", "acme"), on={f"b{k // 2}": [k % 2]}, start=600) for k in range(4)),
    *(running(_p2(f"old-{k}", "acme"), on={"c0": [k]}, start=0) for k in range(2)),
]


@pytest.mark.parametrize(
    ("request_", "want"),
    [
        pytest.param(
            job("urgent").gpus(4).tier("online-training").tenant("acme"),
            (["own-0", "own-1", "own-2", "own-3"], {"b0": [0, 1], "b1": [0, 1]}),
            id="a gang at its cap takes its own work (1,600 GPU-s), not cheaper rival work plus relief (2,800)",
        ),
        pytest.param(
            job("urgent").gpus(1).tier("inference").tenant("acme"),
            (["own-0"], {"b0": [0]}),
            id="a replica at its cap takes one own job (400), not a rival's (300) and an own job elsewhere",
        ),
        pytest.param(
            job("urgent").gpus(1).milli(500).tier("inference").tenant("acme"),
            (["own-0"], {"b0": [0]}),
            id="so does half a GPU: the rival's GPU alone frees room but not the cap",
        ),
    ],
)
def test_where_the_cap_binds_the_scope_of_the_requesters_own_work_wins(request_: JobBuilder, want) -> None:
    pool = Pool(tuple(n.build() for n in RELIEF_NODES))
    # acme's quota is what it holds (6 GPUs) and the pool is full: every plan of acme's must relieve its cap.
    snapshot = Snapshot.build(pool, RELIEF_WORK, quotas({"acme": 6, "rival": 4}))
    for plan in _plans(snapshot, request_.build(), BestFit(), now=1_000.0):
        assert plan is not None
        assert (sorted(v.id for v, _ in plan.victims), gpus_by_node(plan.placement)) == want


@pytest.mark.parametrize(
    ("allocs", "want"),
    [
        pytest.param(
            [*HALVES, replace(running(job("whole").gpus(1), on={"n0": [1]}, start=0), checkpointed_at=900.0)],
            (["whole"], {"n0": [1]}),
            id="a job that checkpointed 100 s ago loses 100 GPU-s, not its 1,000 since start",
        ),
        pytest.param(
            [
                replace(HALVES[0], checkpointed_at=990.0),
                replace(HALVES[1], checkpointed_at=990.0),
                running(job("whole").gpus(1), on={"n0": [1]}, start=800),
            ],
            (["half-a", "half-b"], {"n0": [0]}),
            id="two halves that checkpointed 10 s ago (10 GPU-s) beat a younger whole job (200 GPU-s)",
        ),
    ],
)
def test_victims_are_chosen_by_the_work_since_their_reported_checkpoint(allocs, want) -> None:
    pool = Pool(tuple(n.build() for n in TWO_GPUS))
    snapshot = Snapshot.build(pool, allocs, quota.QuotaBook.single_tenant(pool.gpu_milli, tenant="acme"))
    request = job("urgent").gpus(1).tier("online-training").build()
    candidates = [(a, PreemptReason.PRIORITY) for a in allocs]
    for plan in _plans(snapshot, request, BestFit(), candidates, now=1_000.0):
        assert plan is not None
        assert (sorted(v.id for v, _ in plan.victims), gpus_by_node(plan.placement)) == want


@pytest.mark.parametrize(
    ("start", "checkpointed_at", "interval", "want"),
    [
        pytest.param(0.0, None, None, 1_000.0, id="no checkpoint: the whole run since start"),
        pytest.param(0.0, None, 300.0, 100.0, id="periodic every 300 s: since t=900"),
        pytest.param(0.0, 950.0, None, 50.0, id="reported at t=950: since then"),
        pytest.param(0.0, 850.0, 300.0, 100.0, id="the later of the reported (850) and the periodic (900)"),
        pytest.param(0.0, 960.0, 300.0, 40.0, id="a reported checkpoint after the periodic one counts"),
        pytest.param(500.0, 100.0, None, 500.0, id="a checkpoint before this start (an earlier run) saves nothing"),
        pytest.param(0.0, 1_200.0, None, 0.0, id="a checkpoint stamped after now (clock skew) loses nothing, not less"),
    ],
)
def test_work_lost_counts_from_the_last_checkpoint(start, checkpointed_at, interval, want) -> None:
    a = replace(running(job("j").gpus(2), on={"n0": [0, 1]}, start=start), checkpointed_at=checkpointed_at)
    assert work_lost(a, 1_000.0, interval) == pytest.approx(want * 2)


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
        result = cycle(before, pending, now, UNBOUNDED)
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
    snapshot, request, _ = case
    # Turn a share of the running work borrowed, so reclaims are possible.
    running = sorted(snapshot.allocations.values(), key=lambda a: a.id)
    cut = int(len(running) * borrowed_share)
    snapshot = Snapshot.build(
        snapshot.pool, [replace(a, borrowed=k < cut) for k, a in enumerate(running)], snapshot.book
    )
    balances = quota.balances_from(snapshot.book, snapshot.allocations.values())
    victims = CycleVictims(snapshot.allocations, NOW, CONFIG)
    says_none = victims.none_for(request, snapshot.book, balances, 1.0)
    found = victims.candidates(request, snapshot.state, snapshot.book, balances, 1.0)
    event("none" if says_none else ("some" if found else "listed, none found"))
    if says_none:
        assert found == []


def test_a_gang_over_its_cap_with_only_its_own_borrowed_work_in_the_scope_plans_as_the_reference() -> None:
    # Found by hypothesis: tenant a holds no in-quota work a gang could preempt to get under its cap,
    # only its borrowed gang in the scope; freeing that relieves the cap, so the bounded planner may
    # not drop the scope for want of relief elsewhere.
    pool = Pool((node("n0").gpus(2).build(), node("n1").gpus(8).build()))
    allocs = [
        running(job("serving-a").tenant("a").tier("inference"), on={"n0": [0]}),
        running(job("small-b").tenant("b").tier("online-training"), on={"n0": [1]}),
        running(
            job("gang-a").tenant("a").tier("online-training").gpus(6), on={"n1": [1, 2, 3, 4, 5, 6]}, borrowed=True
        ),
    ]
    snapshot = Snapshot.build(pool, allocs, quotas({"a": 6, "b": 1, "c": 1}))
    request = job("next-gang-a").tenant("a").tier("online-training").gpus(6).build()
    now = 1_400.0  # past the minimum runtime of 600 s
    bounded = cycle(snapshot, [request], now, UNBOUNDED)
    assert bounded == cycle(snapshot, [request], now, EXHAUSTIVE)
    assert [p.victim.id for p in bounded.preempts] == ["gang-a"]
