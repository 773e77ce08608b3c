"""Property tests: random pools and workloads, several cycles in a row, never break DESIGN.md section 6."""

from __future__ import annotations

from dataclasses import replace

from cycle_builders import MODELS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xirang_platform.pool.model import Node, Pool
from xirang_platform.scheduling import quota
from xirang_platform.scheduling.cycle import apply_result, cycle, pending_after
from xirang_platform.scheduling.model import Allocation, CycleResult, GpuSlice, NodeShare, Placement, Request, Tier
from xirang_platform.scheduling.snapshot import SchedulerConfig, Snapshot

TENANTS = ("a", "b", "c")


@st.composite
def pools(draw) -> Pool:
    count = draw(st.integers(2, 6))
    nodes = []
    for i in range(count):
        model = draw(st.sampled_from(["H100", "A100"]))
        nodes.append(
            Node(
                f"n{i}",
                MODELS[model],
                draw(st.sampled_from([2, 4, 8])),
                draw(st.sampled_from([32_000, 128_000])),
                512_000,
                draw(st.sampled_from(["d0", "d1"])),
                unit_milli=draw(st.sampled_from([1000, 250, 125])),
            )
        )
    return Pool(tuple(nodes))


@st.composite
def requests(draw, k: int) -> Request:
    tier = draw(st.sampled_from(list(Tier)))
    fractional = draw(st.booleans())
    gpus = 1 if fractional else draw(st.integers(0, 12))
    return Request(
        id=f"r{k:03d}",
        tenant=draw(st.sampled_from(TENANTS)),
        project="default",
        tier=tier,
        submit_time=draw(st.integers(0, 3000)),
        gpus=gpus,
        milli_per_gpu=draw(st.sampled_from([125, 300, 500, 700])) if fractional else 1000,
        cpu_milli=draw(st.sampled_from([0, 2000, 16_000])),
        memory_mib=draw(st.sampled_from([0, 4096, 65_536])),
        single_node=draw(st.booleans()),
    )


@st.composite
def scenarios(draw):
    pool = draw(pools())
    book = quota.QuotaBook(
        {t: draw(st.integers(1, 16)) * 1000 for t in TENANTS}, {(t, "default"): None for t in TENANTS}
    )
    reqs = [draw(requests(k)) for k in range(draw(st.integers(1, 30)))]
    finish_picks = draw(st.lists(st.integers(0, 1000), min_size=5, max_size=5))
    return pool, book, reqs, finish_picks


def check_cycle(before: Snapshot, result: CycleResult, config: SchedulerConfig, now: float) -> None:
    """Replay one cycle's decisions in order and check every invariant of DESIGN.md section 6."""
    book = before.book
    live = dict(before.allocations)
    balances = quota.balances_from(book, live.values())
    allocated = before.state.allocated_milli
    capacity = before.state.capacity_milli
    for r in result.returns:
        a = live[r.request_id]
        assert a.borrowed
        live[r.request_id] = replace(a, borrowed=False)
    balances = quota.balances_from(book, live.values())
    for admit in result.admits:
        for p in (p for p in result.preempts if p.by == admit.request_id):
            victim = live.pop(p.victim.id)
            tier = victim.request.tier
            assert tier is not Tier.INFERENCE, "P0 is never preempted"
            assert tier is not Tier.ONLINE_TRAINING or victim.borrowed, "P1 is preempted only for its borrowed part"
            assert now - victim.start >= config.min_runtime_s, "no victim younger than the minimum runtime"
            allocated -= victim.milli
        balances = quota.balances_from(book, live.values())
        a = admit.allocation
        ratio = config.overcommit.ratio(allocated / capacity)
        if a.borrowed:
            assert a.request.tier.may_borrow, "P0 never borrows"
        else:
            for key in book.keys_for(a.request.tenant, a.request.project):
                b = balances[key]
                assert b.in_quota + a.milli <= quota.cap(b.quota, ratio), f"{key} over its cap at admission"
        if a.request.tier is Tier.ONLINE_TRAINING and a.request.gpus > 1 and not a.request.single_node:
            nodes = [before.pool.node(n) for n in a.placement.nodes]
            assert {n.domain for n in nodes} == {nodes[0].domain}, "a P1 gang sits in one domain"
            assert {n.model_name for n in nodes} == {nodes[0].model_name}, "a P1 gang uses one model"
            assert all(s.milli == 1000 for s in a.placement.slices), "a P1 gang takes whole GPUs"
        assert len(a.placement.slices) == a.request.gpus
        live[a.id] = a
        allocated += a.milli
    assert not ({p.victim.id for p in result.preempts} & {a.request_id for a in result.admits})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_workloads_never_break_the_invariants(scenario) -> None:
    pool, book, reqs, finish_picks = scenario
    config = SchedulerConfig(min_runtime_s=300, starvation_wait_s=1000)
    snap = Snapshot.build(pool, [], book)
    state, allocations = snap.state.copy(), {}
    pending = list(reqs)
    for step, pick in enumerate(finish_picks):
        now = 1000.0 * (step + 1)
        before = Snapshot(pool, state, dict(allocations), book)
        result = cycle(before, pending, now, config)
        assert result == cycle(before, pending, now, config), "a cycle is deterministic"
        check_cycle(before, result, config, now)
        apply_result(state, allocations, result)
        assert state.check() == [], "per GPU <= 1000 milli, per node CPU and memory within capacity"
        rebuilt = Snapshot.build(pool, allocations.values(), book).state
        assert (rebuilt.gpu_free == state.gpu_free).all()
        assert (rebuilt.cpu_free == state.cpu_free).all()
        assert (rebuilt.whole_free == state.whole_free).all()
        pending = pending_after(pending, result)
        # Some work finishes between cycles.
        if allocations:
            done = sorted(allocations)[pick % len(allocations)]
            state.release(allocations.pop(done).placement)


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
