"""Placements in the ledger: what a cycle admits comes back exactly, and rebuilds the cluster state.
Every test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ledger.ledger_helpers import alloc, dump, wipe
from xirang_platform.ledger import Ledger
from xirang_platform.ledger.errors import (
    InvalidName,
    InvalidPlacement,
    InvalidTransition,
    LedgerError,
    PreemptForbidden,
    StaleCycle,
    UnknownAllocation,
    UnknownTenant,
)
from xirang_platform.ledger.rebuild import cap_violations
from xirang_platform.pool.model import GpuModel, Node, Pool
from xirang_platform.scheduling.apply import apply_cycle, pending_after
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.model import (
    Admit,
    Allocation,
    GpuSlice,
    NodeShare,
    Placement,
    Preempt,
    PreemptReason,
    Request,
    Return,
    Tier,
)
from xirang_platform.scheduling.quota import balances_from
from xirang_platform.scheduling.result import CycleResult
from xirang_platform.scheduling.snapshot import Snapshot
from xirang_platform.scheduling.state import ClusterState

H100 = GpuModel("H100", 81559, 989)
T4 = GpuModel("T4", 15360, 65)
POOL = Pool(
    (
        Node("a0", H100, 8, 64_000, 512_000, "d0"),
        Node("a1", H100, 8, 64_000, 512_000, "d0"),
        Node("b0", T4, 4, 16_000, 64_000, "d1", unit_milli=250),
    )
)


def accounts(ledger: Ledger) -> Ledger:
    """acme (16 GPUs; vision 12, nlp unlimited) and beta (4 GPUs; web unlimited)."""
    ledger.add_tenant("acme", 16_000)
    ledger.add_project("acme", "vision", 12_000)
    ledger.add_project("acme", "nlp")
    ledger.add_tenant("beta", 4_000)
    ledger.add_project("beta", "web")
    return ledger


def request(rid: str, tenant: str, project: str, tier: Tier, **fields: object) -> Request:
    return Request(rid, tenant, project, tier, submit_time=10.0, **fields)  # type: ignore[arg-type]


FIRST_WAVE = [
    # A gang across a0 and a1 with CPU and memory split per GPU.
    request("gang", "acme", "vision", Tier.ONLINE_TRAINING, gpus=12, cpu_milli=24_000, memory_mib=96_000),
    # A fraction on the T4 node, rounded up to two 250-milli units.
    request("slice", "acme", "nlp", Tier.INFERENCE, gpus=1, milli_per_gpu=300, cpu_milli=500, memory_mib=1024),
    # A pinned single-node P0 with model, memory and compute constraints, resumed once before.
    request(
        "pinned",
        "acme",
        "nlp",
        Tier.INFERENCE,
        gpus=2,
        gpu_models=frozenset({"H100"}),
        gpu_memory_mib=40_000,
        min_compute_level=500,
        single_node=True,
        preempted=1,
    ),
    # beta: 2 GPUs in-quota, then 2 more past its cap of 4.8 GPUs: borrowed.
    request("web-1", "beta", "web", Tier.OFFLINE_TRAINING, gpus=2),
    request("web-2", "beta", "web", Tier.OFFLINE_TRAINING, gpus=1, milli_per_gpu=1000),
    request("web-3", "beta", "web", Tier.BATCH_INFERENCE, gpus=2),
]


def state_arrays(state: ClusterState) -> dict[str, np.ndarray]:
    return {
        "gpu": state.gpu_free.copy(),
        "cpu": state.cpu_free.copy(),
        "mem": state.mem_free.copy(),
        "whole": state.whole_free.copy(),
    }


def assert_ledger_is(ledger: Ledger, held: dict[str, Allocation], state: ClusterState) -> None:
    """The ledger returns exactly `held`, and the snapshot built from it is `state` with its balances."""
    got = ledger.allocations()
    assert {a.id: a for a in got} == held
    book, balances = ledger.snapshot()
    rebuilt = Snapshot.build(POOL, got, book)
    for name, want in state_arrays(state).items():
        np.testing.assert_array_equal(state_arrays(rebuilt.state)[name], want, err_msg=name)
    assert rebuilt.state.allocated_milli == state.allocated_milli
    assert balances == balances_from(book, got)
    assert ledger.rebuild().ok


def test_reserved_allocations_come_back_exactly_and_rebuild_the_state(ledger: Ledger) -> None:
    accounts(ledger)
    book = ledger.quota_book()
    result = cycle(Snapshot.build(POOL, [], book), FIRST_WAVE, now=100.0)
    assert {a.request_id for a in result.admits} == {r.id for r in FIRST_WAVE}
    assert [a.allocation.borrowed for a in result.admits].count(True) >= 1  # the case covers a borrowed admit

    got = ledger.reserve_allocations([a.allocation for a in result.admits], allocated_fraction=0.0)

    assert [r.borrowed for r in got] == [a.allocation.borrowed for a in result.admits]
    state, held = ClusterState(POOL), {}
    apply_cycle(result, state, held)
    assert_ledger_is(ledger, held, state)
    slice_alloc = held["slice"]
    assert (slice_alloc.milli, slice_alloc.request.milli_per_gpu) == (500, 300)  # placed milli is charged
    assert [e.amount for e in ledger.entries(kind="reserve") if e.request_id == "slice"] == [500, 500]


def test_one_transaction_per_cycle_keeps_the_ledger_equal_to_the_cycles_state(ledger: Ledger) -> None:
    accounts(ledger)
    book = ledger.quota_book()
    state, held = ClusterState(POOL), {}
    first = cycle(Snapshot.build(POOL, [], book), FIRST_WAVE, now=100.0)
    ledger.apply_cycle(first, allocated_fraction=0.0, capacity_milli=POOL.gpu_milli)
    apply_cycle(first, state, held)
    assert_ledger_is(ledger, held, state)
    for rid in ("gang", "slice"):
        ledger.commit(rid)
        held[rid] = replace(held[rid], confirmed=True)
    assert_ledger_is(ledger, held, state)

    # An hour later acme's inference needs an H100, all taken: beta's P2 work there is preempted.
    later = [request("serve", "acme", "nlp", Tier.INFERENCE, gpus=1, gpu_models=frozenset({"H100"}))]
    fraction = state.allocated_fraction
    second = cycle(Snapshot(POOL, state, dict(held), ledger.quota_book()), later, now=3600.0)
    assert second.preempts, "the case must exercise preemption"
    assert second.admitted("serve") is not None
    ledger.apply_cycle(second, allocated_fraction=fraction, capacity_milli=POOL.gpu_milli)
    apply_cycle(second, state, held)
    assert_ledger_is(ledger, held, state)
    preempted = {e.request_id for e in ledger.entries(kind="preempt")}
    assert preempted == {p.victim.id for p in second.preempts}


def test_a_return_is_written_with_the_cycle(ledger: Ledger) -> None:
    accounts(ledger)
    ledger.reserve(alloc("base", tenant="beta", project="web", gpus=4, node="a0"))
    ledger.reserve(alloc("lent", tenant="beta", project="web", gpus=1, node="a1"))  # 5 > 4.8: borrowed
    ledger.release("base", auto_return=False)
    held = {a.id: a for a in ledger.allocations()}
    assert held["lent"].borrowed
    result = CycleResult(returns=(Return("lent", 1000),))
    ledger.apply_cycle(result)
    state = ClusterState(POOL)
    for a in held.values():
        state.apply(a.placement)
    apply_cycle(result, state, held)
    assert_ledger_is(ledger, held, state)
    assert not held["lent"].borrowed


@pytest.mark.parametrize(
    ("capacity", "accepted"),
    [
        pytest.param(10_000, True, id="the share moves as the victim leaves: cap 6 GPUs at ratio 1.2"),
        pytest.param(None, False, id="the share stays at the start: cap 5.5 GPUs at ratio 1.1"),
    ],
)
def test_an_admission_after_a_preemption_is_checked_at_the_ratio_with_the_victim_gone(
    ledger: Ledger, capacity: int | None, accepted: bool
) -> None:
    # A 10-GPU pool 80% allocated (ratio 1.1); beta's 2-GPU P2 victim leaves: 60% (ratio 1.2).
    accounts(ledger)
    ledger.set_project_quota("acme", "vision", None)
    ledger.set_tenant_quota("acme", 5000)
    ledger.reserve(alloc("held", gpus=4, node="a0"))
    victim = alloc("victim", tenant="beta", project="web", gpus=2, node="a1")
    ledger.reserve(victim)
    result = CycleResult(
        admits=(Admit(alloc("new", gpus=2, node="a1")),),  # acme in-quota: 6 GPUs
        preempts=(Preempt(victim, "new", PreemptReason.PRIORITY),),
    )
    before = dump(ledger)
    if accepted:
        ledger.apply_cycle(result, allocated_fraction=0.8, capacity_milli=capacity)
        assert [a.id for a in ledger.allocations()] == ["held", "new"]
        assert ledger.rebuild().ok
    else:
        with pytest.raises(StaleCycle, match="admitted 'new' in-quota"):
            ledger.apply_cycle(result, allocated_fraction=0.8, capacity_milli=capacity)
        assert dump(ledger) == before


def test_an_allocation_returned_and_preempted_in_one_cycle_leaves_from_in_quota(ledger: Ledger) -> None:
    accounts(ledger)
    ledger.reserve(alloc("base", tenant="beta", project="web", gpus=4, node="a0"))
    lent = alloc("lent", tenant="beta", project="web", gpus=1, node="a1")
    assert ledger.reserve(lent).borrowed
    ledger.release("base", auto_return=False)
    ledger.apply_cycle(
        CycleResult(
            preempts=(Preempt(replace(lent, borrowed=False), "someone", PreemptReason.PRIORITY),),
            returns=(Return("lent", 1000),),
        )
    )
    assert ledger.allocations() == []
    lent_entries = [(e.kind, e.bucket) for e in ledger.entries(tenant="beta") if e.request_id == "lent"]
    # Per account (beta, beta/web): borrowed, returned into reserved, preempted from reserved.
    assert (
        lent_entries
        == [("borrow", "borrowed")] * 2
        + [
            ("return", "borrowed"),
            ("return", "reserved"),
        ]
        * 2
        + [("preempt", "reserved")] * 2
    )
    assert ledger.rebuild().ok


def placed(rid: str, slices: tuple[GpuSlice, ...], shares: tuple[NodeShare, ...] = (), **req: object) -> Allocation:
    r = Request(rid, "acme", "vision", Tier.OFFLINE_TRAINING, 0.0, gpus=len(slices) or 1, **req)  # type: ignore[arg-type]
    return Allocation(r, Placement(slices, shares), start=5.0, confirmed=False)


def test_gpu_memory_and_shares_are_stored_per_slice_and_node(ledger: Ledger) -> None:
    accounts(ledger)
    a = placed(
        "mem",
        (GpuSlice("a0", 3, 1000, 40_000), GpuSlice("a1", 0, 1000, 40_000)),
        (NodeShare("a0", 2000, 8000), NodeShare("a1", 2000, 8000)),
        cpu_milli=4000,
        memory_mib=16_000,
        gpu_memory_mib=40_000,
    )
    ledger.reserve(a)
    assert ledger.allocations() == [a]


def test_a_reclaimed_request_keeps_its_borrow_back_off_through_the_ledger(ledger: Ledger) -> None:
    # Found by the hypothesis test below: re-admitted after a reclaim, a request came back from the
    # ledger with reclaimed_at=None and reclaims=0, so a restarted tick forgot its back-off.
    accounts(ledger)
    a = placed(
        "again", (GpuSlice("a0", 0, 1000),), (NodeShare("a0", 0, 0),), preempted=2, reclaimed_at=900.0, reclaims=2
    )
    ledger.reserve(a)
    [back] = ledger.allocations()
    assert (back.request.reclaimed_at, back.request.reclaims, back.request.preempted) == (900.0, 2, 2)
    assert back == a


GOOD = alloc("good", node="a0")


def good_preempting(victim: str) -> CycleResult:
    """A cycle that admits GOOD after preempting `victim`."""
    return CycleResult(admits=(Admit(GOOD),), preempts=(Preempt(alloc(victim), "good", PreemptReason.PRIORITY),))


BAD_INPUT: list = [
    pytest.param(
        lambda led: led.reserve_allocations([GOOD, replace(alloc("x", gpus=2), placement=GOOD.placement)]),
        InvalidPlacement,
        "1 GPU slices for a request of 2 GPUs",
        id="fewer slices than GPUs",
    ),
    pytest.param(
        lambda led: led.reserve_allocations([GOOD, alloc("x", node="")]), InvalidPlacement, "a node name", id="no node"
    ),
    pytest.param(
        lambda led: led.reserve(placed("x", (GpuSlice("a0", 0, 1200),))),
        InvalidPlacement,
        "bad slice",
        id="slice > 1000",
    ),
    pytest.param(
        lambda led: led.reserve(placed("x", (GpuSlice("a0", -1, 1000),))), InvalidPlacement, "bad slice", id="gpu < 0"
    ),
    pytest.param(
        lambda led: led.reserve(
            placed("x", (GpuSlice("a0", 0, 1000),), (NodeShare("a0", 1, 1), NodeShare("a0", 1, 1)))
        ),
        InvalidPlacement,
        "two shares on one node",
        id="two shares on a node",
    ),
    pytest.param(
        lambda led: led.reserve(replace(alloc("x"), confirmed=True)),
        InvalidTransition,
        "already confirmed",
        id="confirmed",
    ),
    pytest.param(
        lambda led: led.reserve(alloc("x", tier=Tier.INFERENCE, borrowed=True)),
        InvalidPlacement,
        "never borrows",
        id="P0 marked borrowed",
    ),
    pytest.param(
        lambda led: led.reserve_allocations([GOOD, alloc("x", tenant="ghost")]), UnknownTenant, "tenant add", id="ghost"
    ),
    pytest.param(
        lambda led: led.reserve_allocations([GOOD, alloc("twin"), alloc("twin")]),
        InvalidTransition,
        "already reserved",
        id="one request twice in a batch",
    ),
    pytest.param(lambda led: led.reserve(alloc("x" * 201)), InvalidName, "1-200 characters", id="request id too long"),
    pytest.param(
        lambda led: led.apply_cycle(good_preempting("ghost-victim")),
        UnknownAllocation,
        "ghost-victim",
        id="cycle preempts what the ledger does not hold",
    ),
    pytest.param(
        lambda led: led.apply_cycle(CycleResult(admits=(Admit(GOOD), Admit(alloc("big", gpus=12, node="a1"))))),
        StaleCycle,
        "admitted 'big' in-quota, but the ledger's balances make it borrowed",
        id="cycle admits in-quota what the ledger must lend",
    ),
    pytest.param(
        lambda led: led.apply_cycle(CycleResult(admits=(Admit(GOOD),), returns=(Return("held", 1000),))),
        StaleCycle,
        "holds in-quota already",
        id="cycle returns an in-quota allocation",
    ),
    pytest.param(
        lambda led: led.apply_cycle(good_preempting("serving")),
        PreemptForbidden,
        "never preempted",
        id="cycle preempts a P0",
    ),
]


@pytest.mark.parametrize(("call", "error", "message"), BAD_INPUT)
def test_bad_input_is_refused_with_a_fix_and_changes_nothing(
    ledger: Ledger, call: Callable[[Ledger], object], error: type[LedgerError], message: str
) -> None:
    accounts(ledger)
    ledger.reserve(alloc("held", gpus=2, node="b0"))
    ledger.reserve(alloc("serving", tier=Tier.INFERENCE, node="a1"))
    before = dump(ledger)
    with pytest.raises(error, match=message):
        call(ledger)
    assert dump(ledger) == before


TIERS = [Tier.INFERENCE, Tier.ONLINE_TRAINING, Tier.OFFLINE_TRAINING, Tier.BATCH_INFERENCE]
ACCOUNTS = [("acme", "vision"), ("acme", "nlp"), ("beta", "web")]
a_request = st.builds(
    lambda account, tier, gpus, fraction, cpu: (account, tier, gpus, fraction, cpu),
    st.sampled_from(ACCOUNTS),
    st.sampled_from(TIERS),
    st.integers(1, 6),
    st.sampled_from([None, 250, 500]),
    st.sampled_from([0, 4000]),
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(waves=st.lists(st.lists(a_request, min_size=3, max_size=8), min_size=3, max_size=5), finish=st.integers(0, 9))
def test_cycles_written_one_transaction_each_keep_the_ledger_equal_to_the_cycles_state(
    ledger: Ledger, waves: list[list[tuple]], finish: int
) -> None:
    """Several cycles of two tenants' mixed work (returns, preemptions, borrowing, commits and
    finishes between cycles): after each, the ledger holds exactly the cycle's allocations, the
    snapshot built from it is the cycle's state, and no admission passed a cap."""
    wipe(ledger)
    accounts(ledger)
    state, held = ClusterState(POOL), {}
    pending: list[Request] = []
    for step, wave in enumerate(waves):
        now = 1000.0 * (step + 1)
        for i, (account, tier, gpus, fraction, cpu) in enumerate(wave):
            shape = {"gpus": 1, "milli_per_gpu": fraction} if fraction else {"gpus": gpus}
            pending.append(Request(f"r{step}-{i}", *account, tier, now, cpu_milli=cpu, **shape))
        start = state.allocated_fraction
        result = cycle(Snapshot(POOL, state, dict(held), ledger.quota_book()), pending, now)
        ledger.apply_cycle(result, start, capacity_milli=POOL.gpu_milli)
        apply_cycle(result, state, held)
        pending = pending_after(pending, result)
        assert_ledger_is(ledger, held, state)
        assert cap_violations(ledger.entries()) == []
        # Between cycles: the oldest launch is confirmed, one allocation finishes.
        if held:
            first = sorted(held)[0]
            if not held[first].confirmed:
                ledger.commit(first)
                held[first] = replace(held[first], confirmed=True)
            done = sorted(held)[finish % len(held)]
            ledger.release(done, auto_return=False)
            state.release(held.pop(done).placement)
