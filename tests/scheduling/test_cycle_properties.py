"""Property tests: random pools and workloads over several cycles never break DESIGN.md section 6.

Several tenants with small quotas (so work borrows, is reclaimed and returned), fractional requests on
nodes of mixed compute-unit sizes, P0 replicas with GPU memory, gangs. After every cycle the decisions
are applied as an applier does (returns, preempts, admits), written to the simulator's event log and
checked by the repository's own `check_events` (invariants 1-3: per-GPU milli and memory, per-node CPU
and memory, caps at every admit and return on the placement it got, who may be preempted, P1 shape)
and by `ClusterState.check`; the state must also equal one rebuilt from the allocations.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from tests.scheduling.cycle_builders import MODELS
from tests.scheduling.strategies import CONFIG, CYCLE_EVERY_S, scenarios
from xirang_platform.pool.model import Node, Pool
from xirang_platform.scheduling import quota
from xirang_platform.scheduling.apply import apply_cycle, pending_after
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.model import (
    Allocation,
    GpuSlice,
    NodeShare,
    Placement,
    Request,
    Tier,
)
from xirang_platform.scheduling.result import CycleResult
from xirang_platform.scheduling.snapshot import Snapshot
from xirang_platform.simulate.events import EventLog, check_events


def check_cycle(before: Snapshot, pending: list[Request], result: CycleResult, now: float) -> None:
    """What the event log cannot see: victims, slices and the cycle's purity."""
    assert result == cycle(before, pending, now, CONFIG), "a cycle is deterministic"
    admitted = {a.request_id for a in result.admits}
    for p in result.preempts:
        assert p.victim.id in before.allocations, "only running work is preempted"
        preemptor = next(r for r in pending if r.id == p.by)
        assert now - p.victim.start >= CONFIG.min_runtime_for(preemptor.tier.rules), "no victim too young"
        assert p.victim.id not in admitted
    for admit in result.admits:
        a = admit.allocation
        assert len(a.placement.slices) == a.request.gpus
        assert all(s.gpu_memory_mib == a.request.gpu_memory_mib for s in a.placement.slices), "slices hold memory"
    assert {r.request_id for r in result.returns} <= {a.id for a in before.allocations.values() if a.borrowed}


def log_cycle(log: EventLog, now: float, result: CycleResult) -> None:
    """Write one cycle's decisions in the order an applier applies them."""
    for r in result.returns:
        log.returned(now, r.request_id, r.milli)
    for p in result.preempts:
        log.preempt(now, p.victim.id, p.by, p.reason.value, 0.0)
    for a in result.admits:
        log.admit(now, a.allocation)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_workloads_never_break_the_invariants(scenario) -> None:
    pool, book, reqs, finish_picks = scenario
    state = Snapshot.build(pool, [], book).state.copy()
    allocations: dict[str, Allocation] = {}
    log, pending, arrived = EventLog(), list[Request](), set[str]()
    for step, pick in enumerate(finish_picks):
        now = CYCLE_EVERY_S * (step + 1)
        for r in reqs:
            if r.submit_time <= now and r.id not in arrived:
                arrived.add(r.id)
                pending.append(r)
                log.submit(now, r, 0.0)
        before = Snapshot(pool, state, dict(allocations), book)
        result = cycle(before, pending, now, CONFIG)
        check_cycle(before, pending, result, now)
        apply_cycle(result, state, allocations)
        for a in result.admits:
            allocations[a.request_id] = Allocation(
                a.allocation.request, a.allocation.placement, now, a.allocation.borrowed, confirmed=True
            )
        log_cycle(log, now, result)
        assert check_events(log.events, pool, book, CONFIG.overcommit) == []
        assert state.check() == [], "per GPU milli and memory, per node CPU and memory within capacity"
        rebuilt = Snapshot.build(pool, allocations.values(), book).state
        assert (rebuilt.gpu_free == state.gpu_free).all()
        assert (rebuilt.gpu_mem_free == state.gpu_mem_free).all()
        assert (rebuilt.cpu_free == state.cpu_free).all()
        assert (rebuilt.whole_free == state.whole_free).all()
        pending = [r for r in pending_after(pending, result) if r.id not in {h.request_id for h in _dropped(result)}]
        if allocations:  # some work finishes between cycles
            done = sorted(allocations)[pick % len(allocations)]
            state.release(allocations.pop(done).placement)
            log.finish(now, done)


def _dropped(result: CycleResult):
    """Holds the replay turns into rejects: they never come back."""
    return [h for h in result.holds if h.reason.value in ("never-fits", "exceeds-cap", "unknown-account")]


def test_cycle_never_changes_the_snapshot() -> None:
    pool = Pool((Node("n0", MODELS["H100"], 8, 64_000, 512_000, "d0"),))
    book = quota.QuotaBook.single_tenant(pool.gpu_milli, tenant="a")
    victim = Allocation(
        Request("v", "a", "default", Tier.OFFLINE_TRAINING, 0, gpus=8),
        _whole_node_placement("n0", 8),
        start=0,
    )
    snap = Snapshot.build(pool, [victim], book)
    free_before = snap.state.gpu_free.copy()
    result = cycle(snap, [Request("s", "a", "default", Tier.INFERENCE, 0, gpus=8)], 10_000)
    assert [p.victim.id for p in result.preempts] == ["v"]
    assert (snap.state.gpu_free == free_before).all()
    assert set(snap.allocations) == {"v"}


def _whole_node_placement(node: str, gpus: int) -> Placement:
    return Placement(tuple(GpuSlice(node, g, 1000) for g in range(gpus)), (NodeShare(node, 0, 0),))
