"""The ledger refuses over-capacity reservations and requests its columns cannot hold, one request
at a time (issue 20, items 1, 5 and the ledger's part of "one bad request fails that run, never the
tick"). Every test runs on SQLite and on PostgreSQL unless it says otherwise."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ledger.ledger_helpers import alloc, dump, wipe
from xirang_platform.ledger import Ledger
from xirang_platform.ledger import admission as admission_module
from xirang_platform.ledger.errors import BadRequest, OverCapacity, RequestRefused
from xirang_platform.pool.model import GpuModel, Node, Pool
from xirang_platform.scheduling.model import (
    Admit,
    Allocation,
    GpuSlice,
    NodeShare,
    Placement,
    Preempt,
    PreemptReason,
    Tier,
)
from xirang_platform.scheduling.result import CycleResult
from xirang_platform.scheduling.state import ClusterState

H100 = GpuModel("H100", 81559, 989)
POOL = Pool((Node("n0", H100, 2, 64_000, 512_000, "d0"), Node("n1", H100, 2, 64_000, 512_000, "d0")))
RACERS = 6
ROUNDS = 8


def accounts(ledger: Ledger, tenants: int = 2) -> Ledger:
    """Tenants t0, t1, ... of 8 GPUs each, with project p0, p1, ... (no quota of its own)."""
    for i in range(tenants):
        ledger.add_tenant(f"t{i}", 8000)
        ledger.add_project(f"t{i}", f"p{i}")
    return ledger


def placed(rid: str, slices: tuple[GpuSlice, ...], shares: tuple[NodeShare, ...], tenant: int = 0) -> Allocation:
    """An allocation of `tenant` (t0/p0, ...) with exactly this placement (one GPU per slice)."""
    a = alloc(rid, f"t{tenant}", f"p{tenant}", Tier.OFFLINE_TRAINING, gpus=len(slices))
    return replace(a, placement=Placement(slices, shares))


def admits(*allocations: Allocation) -> CycleResult:
    return CycleResult(admits=tuple(Admit(a) for a in allocations))


HALF_WITH_MEMORY = (GpuSlice("n0", 0, 500, 50_000),)
OVER_CAPACITY = [
    pytest.param(
        placed("held", (GpuSlice("n0", 0, 1000),), (NodeShare("n0", 0, 0),)),
        placed("x", (GpuSlice("n0", 0, 500),), (NodeShare("n0", 0, 0),)),
        "GPU 0 of node 'n0' would hold 1500 milli, past its 1000",
        id="milli on a full GPU",
    ),
    pytest.param(
        placed("held", HALF_WITH_MEMORY, (NodeShare("n0", 0, 0),)),
        placed("x", HALF_WITH_MEMORY, (NodeShare("n0", 0, 0),)),
        "GPU 0 of node 'n0' would hold 100000 MiB of GPU memory, past its 81559 MiB",
        id="GPU memory",
    ),
    pytest.param(
        placed("held", (GpuSlice("n0", 0, 1000),), (NodeShare("n0", 40_000, 0),)),
        placed("x", (GpuSlice("n0", 1, 1000),), (NodeShare("n0", 30_000, 0),)),
        "node 'n0' would hold 70000 CPU milli, past its 64000",
        id="node CPU",
    ),
    pytest.param(
        placed("held", (GpuSlice("n1", 0, 1000),), (NodeShare("n1", 0, 500_000),)),
        placed("x", (GpuSlice("n1", 1, 1000),), (NodeShare("n1", 0, 20_000),)),
        "node 'n1' would hold 520000 MiB of memory, past its 512000 MiB",
        id="node memory",
    ),
    pytest.param(
        placed("held", (GpuSlice("n1", 0, 1000),), (NodeShare("n1", 0, 0),)),
        placed("x", (GpuSlice("n0", 2, 1000),), (NodeShare("n0", 0, 0),)),
        "GPU 2 of node 'n0' is not in the pool",
        id="a GPU the node does not have",
    ),
    pytest.param(
        placed("held", (GpuSlice("n1", 0, 1000),), (NodeShare("n1", 0, 0),)),
        placed("x", (GpuSlice("gone", 0, 1000),), (NodeShare("gone", 1, 0),)),
        "GPU 0 of node 'gone' is not in the pool",
        id="a node the pool does not have",
    ),
]


@pytest.mark.parametrize(("held", "asked", "message"), OVER_CAPACITY)
def test_an_admission_past_capacity_is_refused_by_name_and_writes_nothing(
    ledger: Ledger, held: Allocation, asked: Allocation, message: str
) -> None:
    accounts(ledger)
    ledger.apply_cycle(admits(held), pool=POOL)
    before = dump(ledger)
    fits = placed("fits", (GpuSlice("n1", 1, 250),), (NodeShare("n1", 0, 0),), tenant=1)

    with pytest.raises(OverCapacity, match="refused request 'x'") as refused:
        ledger.apply_cycle(admits(fits, asked), pool=POOL)

    assert refused.value.request_id == "x"
    assert message in refused.value.reason
    assert dump(ledger) == before


def test_a_cycle_places_on_the_gpu_its_victim_leaves(ledger: Ledger) -> None:
    accounts(ledger)
    victim = placed("victim", (GpuSlice("n0", 0, 1000),), (NodeShare("n0", 60_000, 0),))
    ledger.apply_cycle(admits(victim), pool=POOL)
    taker = placed("taker", (GpuSlice("n0", 0, 1000),), (NodeShare("n0", 60_000, 0),), tenant=1)
    result = CycleResult(admits=(Admit(taker),), preempts=(Preempt(victim, "taker", PreemptReason.PRIORITY),))

    ledger.apply_cycle(result, pool=POOL)

    assert [a.id for a in ledger.allocations()] == ["taker"]
    assert ledger.rebuild(POOL).ok


def test_admissions_of_one_cycle_count_against_each_other(ledger: Ledger) -> None:
    accounts(ledger)
    first = placed("first", (GpuSlice("n0", 1, 600),), (NodeShare("n0", 0, 0),))
    second = placed("second", (GpuSlice("n0", 1, 600),), (NodeShare("n0", 0, 0),), tenant=1)

    with pytest.raises(OverCapacity, match="'second'.*1200 milli"):
        ledger.apply_cycle(admits(first, second), pool=POOL)
    assert ledger.allocations() == []


def race_round(url: str, round_: int) -> list[str]:
    """RACERS writers of different tenants (no account lock in common) each apply a cycle that puts
    a whole GPU on n0's GPU 0 at once; their outcomes, 'ok' or the refusal's class name."""
    barrier = threading.Barrier(RACERS)
    outcomes: list[str] = []

    def racer(i: int) -> None:
        ledger = Ledger(url, migrate=False)
        a = placed(f"r{round_}-{i}", (GpuSlice("n0", 0, 1000),), (NodeShare("n0", 0, 0),), tenant=i)
        barrier.wait()
        try:
            ledger.apply_cycle(admits(a), pool=POOL)
            outcomes.append("ok")
        except RequestRefused as e:
            outcomes.append(type(e).__name__)
        finally:
            ledger.close()

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(outcomes)


def test_overlapping_writers_never_put_a_gpu_past_1000_milli(ledger: Ledger, backend_url: str) -> None:
    accounts(ledger, RACERS)
    for round_ in range(ROUNDS):
        outcomes = race_round(backend_url, round_)

        assert outcomes == ["OverCapacity"] * (RACERS - 1) + ["ok"]
        assert ledger.rebuild(POOL).ok
        [winner] = ledger.allocations()
        ledger.release(winner.id)


def test_reserve_with_the_pool_refuses_a_placement_past_capacity(ledger: Ledger) -> None:
    accounts(ledger)
    ledger.reserve(alloc("a", "t0", "p0", node="n0"), pool=POOL)
    before = dump(ledger)

    with pytest.raises(OverCapacity, match="'b'.*GPU 0 of node 'n0' would hold 2000 milli"):
        ledger.reserve_allocations([alloc("c", "t1", "p1", node="n1"), alloc("b", "t1", "p1", node="n0")], pool=POOL)
    assert dump(ledger) == before


def test_rebuild_reports_live_allocations_past_capacity(ledger: Ledger) -> None:
    accounts(ledger)
    # `reserve_allocations` does not know the pool: two whole GPUs on one (what overlapping ticks did).
    ledger.reserve_allocations([alloc("a", "t0", "p0", node="n0"), alloc("b", "t1", "p1", node="n0")])

    report = ledger.rebuild(POOL)

    assert report.differences == []
    assert report.over_capacity == ["GPU 0 of node 'n0' would hold 2000 milli, past its 1000"]
    assert not report.ok
    assert ledger.rebuild().ok  # without the pool only the balances are checked


HUGE = 3_000_000_000


def asking(**fields: object) -> Callable[[Allocation], Allocation]:
    """The allocation with these request fields changed."""
    return lambda a: replace(a, request=replace(a.request, **fields))  # type: ignore[arg-type]


UNSTORABLE = [
    pytest.param(asking(preempted=HUGE), "preempted = 3000000000", id="preempted"),
    pytest.param(asking(reclaims=HUGE), "reclaims = 3000000000", id="reclaims"),
    pytest.param(asking(memory_mib=HUGE), "memory_mib = 3000000000", id="memory"),
    pytest.param(asking(submit_time=float("nan")), "submit_time = nan", id="nan time"),
    pytest.param(
        lambda a: replace(a, placement=Placement((GpuSlice("n0", 0, 1000, HUGE),), a.placement.shares)),
        "slice 0 gpu_memory_mib = 3000000000",
        id="slice memory",
    ),
]


@pytest.mark.parametrize(("spoil", "message"), UNSTORABLE)
def test_a_request_its_columns_cannot_hold_is_refused_alone_by_name(
    ledger: Ledger, spoil: Callable[[Allocation], Allocation], message: str
) -> None:
    accounts(ledger)
    before = dump(ledger)
    good = alloc("good", "t1", "p1", node="n1")
    bad = spoil(alloc("bad", "t0", "p0", node="n0"))

    with pytest.raises(BadRequest, match="refused request 'bad'") as refused:
        ledger.apply_cycle(admits(good, bad), pool=POOL)

    assert message in refused.value.reason
    assert dump(ledger) == before
    ledger.apply_cycle(admits(good), pool=POOL)  # the cycle without it is written
    assert [a.id for a in ledger.allocations()] == ["good"]


@pytest.mark.postgres
def test_a_row_postgresql_refuses_is_named_even_past_the_validation(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(postgres_url, migrate=False)
    wipe(ledger)
    accounts(ledger)
    # As if the validation missed a field: PostgreSQL itself refuses the 32-bit column's value.
    monkeypatch.setattr(admission_module, "check_columns", lambda a: None)
    good = alloc("good", "t1", "p1", node="n1")
    bad = asking(preempted=HUGE)(alloc("bad", "t0", "p0", node="n0"))

    with pytest.raises(BadRequest, match="refused request 'bad': the database refused its row: integer out of range"):
        ledger.apply_cycle(admits(good, bad), pool=POOL)

    assert ledger.allocations() == []
    ledger.close()


def core_fits(held: list[Placement], new: Placement | None) -> bool:
    """The scheduler core's capacity rule (`ClusterState.check`): do `held` and `new` fit the pool?"""
    if new is not None and any(s.gpu >= POOL.node(s.node).gpus for s in new.slices):
        return False
    state = ClusterState(POOL)
    for p in [*held, *([new] if new is not None else [])]:
        state.apply(p)
    return state.check() == []


# A slice: (node index, GPU index 0..2 where 2 is past the node's GPUs, milli, GPU memory in GiB).
a_slice = st.tuples(st.integers(0, 1), st.integers(0, 2), st.sampled_from([250, 500, 750, 1000]), st.integers(0, 60))
an_ask = st.tuples(st.lists(a_slice, min_size=1, max_size=2), st.integers(0, 40_000), st.integers(0, 300_000))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(waves=st.lists(st.lists(an_ask, min_size=1, max_size=4), min_size=2, max_size=5), finish=st.integers(0, 3))
def test_the_ledger_never_holds_a_gpu_or_node_past_capacity(
    ledger: Ledger, waves: list[list[tuple]], finish: int
) -> None:
    wipe(ledger)
    accounts(ledger, 2)
    ids = iter(range(10_000))
    for wave in waves:
        for slices, cpu, memory in wave:
            gpus = tuple(GpuSlice(f"n{n}", g, milli, gib * 1024) for n, g, milli, gib in slices)
            shares = tuple(NodeShare(node, cpu, memory) for node in sorted({s.node for s in gpus}))
            a = placed(f"r{next(ids)}", gpus, shares, tenant=next(ids) % 2)
            fits = core_fits([x.placement for x in ledger.allocations()], a.placement)
            try:
                ledger.apply_cycle(admits(a), pool=POOL)
                assert fits
            except OverCapacity:
                assert not fits
            assert ledger.rebuild(POOL).ok
            assert core_fits([x.placement for x in ledger.allocations()], None)
        for held in ledger.allocations()[:finish]:
            ledger.release(held.id)
