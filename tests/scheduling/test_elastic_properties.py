"""Properties of the elastic cycle (DESIGN.md section 11) over random multi-cycle, multi-tenant runs:
an elastic run's size always within its range, the cap invariant at every admission and resize (the
simulator's own `check_events`), no request admitted later with growth than without it, shrink plans
minimal; a varying inference load does not make elastic runs thrash; the elastic work is bounded."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.scheduling.cycle_builders import MODELS
from tests.scheduling.strategies import CONFIG, CYCLE_EVERY_S, TENANTS
from xirang_platform.pool.model import Node, Pool
from xirang_platform.scheduling import quota
from xirang_platform.scheduling.apply import apply_cycle, pending_after
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.elastic import at_size, size_tries
from xirang_platform.scheduling.model import Allocation, GpuRange, Request, ResizeKind, Tier
from xirang_platform.scheduling.placement import place
from xirang_platform.scheduling.result import CycleResult
from xirang_platform.scheduling.snapshot import Snapshot
from xirang_platform.simulate.events import EventLog, check_events

DROPPED = ("never-fits", "exceeds-cap", "unknown-account")


@st.composite
def elastic_scenarios(draw, most_nodes: int = 4):
    """(pool, book, requests, cycles each runs, lasting-free milli per cycle): 2-`most_nodes` nodes of 8
    H100s (one node of 8 or 16 when `most_nodes` is 1),
    three tenants, whole-GPU requests of every tier arriving over the run, about two thirds of the
    training ones elastic."""
    nodes = draw(st.integers(min(2, most_nodes), most_nodes))
    gpus = 8 if nodes > 1 else draw(st.sampled_from([8, 16]))
    pool = Pool(tuple(Node(f"n{i}", MODELS["H100"], gpus, 256_000, 1_024_000, f"d{i // 2}") for i in range(nodes)))
    book = quota.QuotaBook(
        {t: draw(st.integers(2, 16)) * 1000 for t in TENANTS}, {(t, "default"): None for t in TENANTS}
    )
    reqs = []
    for k in range(draw(st.integers(4, 16))):
        tier = draw(st.sampled_from(list(Tier)))
        gpus = draw(st.integers(1, 8))
        elastic = None
        if tier in (Tier.ONLINE_TRAINING, Tier.OFFLINE_TRAINING) and draw(st.integers(0, 2)):
            low = draw(st.integers(1, gpus))
            elastic = GpuRange(low, draw(st.integers(gpus, 16)), 1)
            gpus = elastic.max
        reqs.append(
            Request(
                f"r{k:02d}",
                draw(st.sampled_from(TENANTS)),
                "default",
                tier,
                draw(st.sampled_from([0.0, 700.0, 1_400.0, 2_100.0, 2_800.0, 3_500.0])),
                gpus=gpus,
                cpu_milli=draw(st.sampled_from([0, 8_000])),
                single_node=tier is Tier.INFERENCE,
                elastic=elastic,
            )
        )
    cycles = {r.id: draw(st.integers(1, 3)) for r in reqs}  # how many cycles each runs once admitted
    lasting = draw(st.lists(st.sampled_from([0, 2_000, 8_000, 64_000]), min_size=6, max_size=6))
    return pool, book, reqs, cycles, lasting


def log_cycle(log: EventLog, now: float, result: CycleResult, applied) -> None:
    """One cycle's decisions in the order the applier applies them."""
    for r in result.returns:
        log.returned(now, r.request_id, r.milli)
    for p in result.preempts:
        log.preempt(now, p.victim.id, p.by, p.reason.value, 0.0)
    for r, new in applied.resized:
        if r.kind is ResizeKind.SHRINK:
            log.resize(now, r, new, 0.0)
    for a in applied.admitted:
        log.admit(now, a)
    for r, new in applied.resized:
        if r.kind is ResizeKind.GROW:
            log.resize(now, r, new, 0.0)


def run(scenario, config=CONFIG, grow=True):
    """Replay a scenario cycle by cycle; returns every request's first admission time, and the
    log, checked after every cycle."""
    pool, book, reqs, cycles, lasting = scenario
    state = Snapshot.build(pool, [], book).state.copy()
    allocations: dict[str, Allocation] = {}
    log, pending, arrived, first = EventLog(), list[Request](), set[str](), dict[str, float]()
    ends: dict[str, int] = {}
    for step, free in enumerate(lasting):
        now = CYCLE_EVERY_S * (step + 1)
        for r in reqs:
            if r.submit_time <= now and r.id not in arrived:
                arrived.add(r.id)
                pending.append(r)
                log.submit(now, r, 0.0)
        before = Snapshot(pool, state, dict(allocations), book, lasting_free=free if grow else None)
        result = cycle(before, pending, now, config)
        check_shrinks_minimal(before, pending, result, now, config)
        applied = apply_cycle(result, state, allocations, confirm=True)
        log_cycle(log, now, result, applied)
        problems = check_events(log.events, pool, book, config.overcommit)
        assert problems == [], problems
        assert state.check() == []
        for a in allocations.values():
            rng = a.request.elastic
            assert rng is None or rng.contains(a.request.gpus) and len(a.placement.slices) == a.request.gpus
        for a in result.admits:
            first.setdefault(a.request_id, now)
            ends[a.request_id] = step + cycles[a.request_id]
        dropped = {h.request_id for h in result.holds if h.reason.value in DROPPED}
        pending = [r for r in pending_after(pending, result) if r.id not in dropped]
        for done in sorted(rid for rid in allocations if ends[rid] <= step):
            state.release(allocations.pop(done).placement)
            log.finish(now, done)
    return first, log


def check_shrinks_minimal(before: Snapshot, pending, result: CycleResult, now: float, config) -> None:
    """Every shrink of a plan is needed: with that run at its old size (the others shrunk), the
    request it made room for does not fit within its cap on the pool as the cycle left it before it."""
    by_request: dict[str, list] = {}
    for r in result.resizes:
        if r.kind is ResizeKind.SHRINK:
            by_request.setdefault(r.by, []).append(r)
    for rid, shrinks in by_request.items():
        request = next(p for p in pending if p.id == rid)
        admitted = result.admitted(rid)
        assert admitted is not None
        for undone in shrinks:
            state = before.state.copy()
            balances = quota.balances_from(before.book, before.allocations.values())
            for r in shrinks:
                if r is not undone:
                    state.release(r.old.placement)
                    state.apply(r.new.placement)
                    quota.charge_allocation(before.book, balances, r.old, -r.old.milli)
                    quota.charge_allocation(before.book, balances, r.new)
            # Everything else the cycle did before this admission is not undone here: this is the
            # pool before the cycle with the other shrinks, so the request found no room then.
            ratio = config.overcommit.ratio(state.allocated_fraction)
            room = quota.headroom(before.book, balances, request.tenant, request.project, ratio)
            found = place(
                state,
                at_size(request, admitted.request.gpus),
                config.scorer,
                config.node_priority(len(state.names)),
                None,
                room,
            )
            assert found is None or len(result.admits) > 1 or result.preempts, (
                f"the shrink of {undone.old.id} was not needed"
            )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(elastic_scenarios())
def test_sizes_stay_in_range_and_caps_hold_at_every_resize(scenario) -> None:
    run(scenario)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(elastic_scenarios(most_nodes=1))
def test_no_request_is_admitted_later_because_of_growth(scenario) -> None:
    """On one node, where which GPUs a shrink gives back cannot matter: on several, a run grown and
    shrunk back may hold other GPUs than it would have, and a gang that needed a whole node can
    find it split (docs/design-notes.md, A18). Quota, tiers, borrowing and holds all take part."""
    with_growth, _ = run(scenario, grow=True)
    without, _ = run(scenario, grow=False)
    for rid, t in without.items():
        assert with_growth.get(rid, float("inf")) <= t, (
            f"{rid} admitted at {with_growth.get(rid)} with growth, {t} without"
        )


def test_a_varying_inference_load_does_not_make_elastic_runs_thrash() -> None:
    """48 cycles of an inference load that rises and falls every 4 cycles on a pool where an elastic
    run fills what inference leaves: it shrinks when replicas come and grows back only once units
    stayed idle for the span, so it resizes at most twice per swing, never cycle after cycle."""
    pool = Pool(tuple(Node(f"n{i}", MODELS["H100"], 8, 256_000, 1_024_000, "d0") for i in range(2)))
    book = quota.QuotaBook({"t": 16_000, "s": 8_000}, {("t", "default"): None, ("s", "default"): None})
    train = Request("train", "t", "default", Tier.OFFLINE_TRAINING, 0.0, gpus=16, elastic=GpuRange(4, 16))
    state = Snapshot.build(pool, [], book).state.copy()
    allocations: dict[str, Allocation] = {}
    pending: list[Request] = [train]
    free_since: float | None = None
    resizes, swings, step_s, span = 0, 0, 300.0, 900.0
    config = replace(CONFIG, elastic_grow_idle_s=span)
    replicas: list[str] = []
    for step in range(48):
        now = step_s * (step + 1)
        high = (step // 4) % 2 == 1
        want = 6 if high else 1
        if high != ((step - 1) // 4) % 2 == 1:
            swings += 1
        while len(replicas) > want:  # scale down: replicas end (or leave the queue)
            gone = replicas.pop()
            if gone in allocations:
                state.release(allocations.pop(gone).placement)
            pending = [r for r in pending if r.id != gone]
        for k in range(want - len(replicas)):
            rid = f"inf-{step}-{k}"
            replicas.append(rid)
            pending.append(Request(rid, "s", "default", Tier.INFERENCE, now, gpus=1, single_node=True))
        free = state.capacity_milli - state.allocated_milli
        free_since = (free_since if free_since is not None else now) if free >= 1000 else None
        lasting = free if free_since is not None and now - free_since >= span else 0
        result = cycle(Snapshot(pool, state, dict(allocations), book, lasting_free=lasting), pending, now, config)
        apply_cycle(result, state, allocations, confirm=True)
        pending = pending_after(pending, result)
        resizes += len(result.resizes)
        assert not result.preempts, "inference shrinks the elastic run, it never stops it"
    assert allocations["train"].request.elastic.contains(allocations["train"].request.gpus)
    assert 0 < resizes <= 2 * swings


def test_elastic_work_per_cycle_is_bounded_in_the_worst_case() -> None:
    """200 nodes, each full of one elastic run of 1..8 GPUs at 4, the queue full of inference replicas
    that each need a shrink, and 64 elastic requests to enlarge: every placement the elastic rules try
    is within the stated bounds (`elastic` module docstring)."""
    nodes = 200
    pool = Pool(tuple(Node(f"n{i:03d}", MODELS["H100"], 8, 256_000, 1_024_000, f"d{i // 4}") for i in range(nodes)))
    book = quota.QuotaBook({"t": 8 * nodes * 1000, "s": 1_000_000}, {("t", "default"): None, ("s", "default"): None})
    runs = []
    for i in range(nodes):
        r = Request(f"e{i:03d}", "t", "default", Tier.OFFLINE_TRAINING, 0.0, gpus=8, elastic=GpuRange(1, 8))
        snapshot = Snapshot.build(pool, runs, book)
        placed = place(snapshot.state, r, CONFIG.scorer, CONFIG.node_priority(nodes))
        assert placed is not None
        runs.append(Allocation(r, placed, 0.0))
    replicas = [
        Request(f"inf{k:03d}", "s", "default", Tier.INFERENCE, 0.0, gpus=1, single_node=True) for k in range(300)
    ]
    snapshot = replace(Snapshot.build(pool, runs, book), lasting_free=10**9)
    result = cycle(snapshot, replicas, 1_000.0, CONFIG)
    shrink_requests = len({r.by for r in result.resizes if r.kind is ResizeKind.SHRINK})
    assert shrink_requests > 0
    bound = shrink_requests * (2 * CONFIG.plan_steps_per_request + 2) + nodes * size_tries(8)
    assert result.work.elastic_placements <= bound
    assert result.work.plan_steps <= CONFIG.plan_steps_per_cycle + CONFIG.plan_steps_per_request
