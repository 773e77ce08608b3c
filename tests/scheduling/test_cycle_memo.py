"""A cycle handed the previous cycle's memo decides exactly as one without it.

The live tick passes each `CycleResult.memo` to the next cycle (`cycle_memo.CycleMemo`): balances brought
up to date by difference, placements that found no room carried while their nodes did not gain
capacity, the queues kept sorted, holds re-used. Over several cycles with random arrivals, finishes,
cycle intervals, now and then a cycle whose decisions are not applied (a stale ledger), and
snapshots with and without the caller's balances, every cycle must return the same admissions
(with their GPUs), preemptions, holds (reason and message), returns and gang reservation with the
memo as without it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.scheduling.cycle_builders import MODELS
from tests.scheduling.strategies import CONFIG, TENANTS, pools, requests
from xirang_platform.pool.model import Node, Pool
from xirang_platform.scheduling import quota
from xirang_platform.scheduling.apply import apply_cycle, pending_after
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.model import Allocation, GpuSlice, HoldReason, NodeShare, Placement, Request, Tier
from xirang_platform.scheduling.snapshot import Snapshot


@st.composite
def ticks(draw):
    """A pool, a quota book, requests arriving over time, and per cycle: the seconds since the last
    one, how many running allocations finish before it (and which), and whether its decisions are applied."""
    pool = draw(pools())
    book = quota.QuotaBook(
        {t: draw(st.integers(1, 12)) * 1000 for t in TENANTS}, {(t, "default"): None for t in TENANTS}
    )
    count = draw(st.integers(1, 30))
    reqs = [
        replace(draw(requests(k)), submit_time=draw(st.sampled_from([0.0, 600.0, 1_800.0, 3_000.0])))
        for k in range(count)
    ]
    steps = draw(
        st.lists(
            st.tuples(
                st.sampled_from([5.0, 300.0, 700.0]),
                st.lists(st.integers(0, 1000), max_size=3),
                st.booleans() | st.just(True),
                st.booleans(),
            ),
            min_size=2,
            max_size=8,
        )
    )
    starvation = draw(st.sampled_from([CONFIG.starvation_wait_s, 300.0]))
    return pool, book, reqs, steps, replace(CONFIG, starvation_wait_s=starvation)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ticks())
def test_cycles_decide_the_same_with_and_without_the_memo(case) -> None:
    pool, book, reqs, steps, config = case
    state = Snapshot.build(pool, [], book).state.copy()
    allocations: dict[str, Allocation] = {}
    pending: list[Request] = []
    arrived: set[str] = set()
    memo, now = None, 0.0
    for interval, finishes, applied, keeps_balances in steps:
        now += interval
        pending += [r for r in reqs if r.submit_time <= now and r.id not in arrived]
        arrived |= {r.id for r in pending}
        # A caller that keeps its balances (fill mode, the replay) hands them over: the memo then
        # carries no books, and the next cycle (handed balances or not) must decide the same.
        balances = quota.balances_from(book, allocations.values()) if keeps_balances else None
        before = Snapshot(pool, state, dict(allocations), book, balances)
        plain = cycle(before, pending, now, config)
        carried = cycle(before, pending, now, config, memo=memo)
        assert carried == plain, "the memo changes no decision"
        event("preempted" if plain.preempts else "no preemption")
        event("reserved" if plain.reserved_for else "no reservation")
        memo = carried.memo
        if applied:
            apply_cycle(carried, state, allocations, confirm=True)
            pending = pending_after(pending, carried)
        for pick in finishes:
            if allocations:
                done = sorted(allocations)[pick % len(allocations)]
                state.release(allocations.pop(done).placement)


def _pool(nodes: int) -> Pool:
    return Pool(tuple(Node(f"n{i}", MODELS["H100"], 8, 256_000, 512_000, "d0") for i in range(nodes)))


def _job(k: int, gpus: int = 4) -> Request:
    return Request(f"r{k}", "a", "default", Tier.OFFLINE_TRAINING, float(k), gpus=gpus)


def test_a_memo_of_another_pool_is_ignored() -> None:
    book = quota.QuotaBook.single_tenant(64_000, tenant="a")
    small = cycle(Snapshot.build(_pool(1), [], book), [_job(1), _job(2), _job(3)], 0.0)
    assert [h.reason for h in small.holds] == [HoldReason.NO_FIT], "the third gang finds no room on one node"
    bigger = Snapshot.build(_pool(2), [], book)
    with_memo = cycle(bigger, [_job(1), _job(2), _job(3)], 0.0, memo=small.memo)
    assert with_memo == cycle(bigger, [_job(1), _job(2), _job(3)], 0.0)
    assert len(with_memo.admits) == 3


def test_a_miss_is_carried_until_its_node_gains_capacity() -> None:
    book = quota.QuotaBook.single_tenant(64_000, tenant="a")
    pool = _pool(1)
    state = Snapshot.build(pool, [], book).state.copy()
    allocations: dict[str, Allocation] = {}
    first = cycle(Snapshot(pool, state, allocations, book), [_job(1), _job(2), _job(3)], 0.0)
    apply_cycle(first, state, allocations, confirm=True)
    waiting = pending_after([_job(1), _job(2), _job(3)], first)
    same = cycle(Snapshot(pool, state, dict(allocations), book), waiting, 5.0, memo=first.memo)
    assert [h.reason for h in same.holds] == [HoldReason.NO_FIT]
    state.release(allocations.pop("r1").placement)
    freed = cycle(Snapshot(pool, state, dict(allocations), book), waiting, 10.0, memo=same.memo)
    assert [a.request_id for a in freed.admits] == ["r3"], "the node gained room: the carried miss is checked again"


def test_a_miss_is_carried_through_cycles_that_do_not_meet_it_while_nothing_grows() -> None:
    book = quota.QuotaBook.single_tenant(64_000, tenant="a")
    pool = _pool(1)
    state = Snapshot.build(pool, [], book).state.copy()
    allocations: dict[str, Allocation] = {}
    memo = None
    for pending in ([_job(1, gpus=6), _job(2, gpus=4)], [_job(3, gpus=1)], [_job(4, gpus=1)]):
        result = cycle(Snapshot(pool, state, dict(allocations), book), pending, 0.0, memo=memo)
        apply_cycle(result, state, allocations, confirm=True)
        memo = result.memo
    assert memo is not None
    assert [r.gpus for r in memo.no_fit.values()] == [4], "the 4-GPU miss of the first cycle still stands"
    state.release(allocations.pop("r3").placement)
    grown = cycle(Snapshot(pool, state, dict(allocations), book), [_job(5, gpus=1)], 0.0, memo=memo)
    assert grown.memo is not None
    assert grown.memo.no_fit == {}, "a node gained room: the miss is not carried on"


def test_a_memo_carries_no_books_when_the_caller_keeps_the_balances() -> None:
    book = quota.QuotaBook.single_tenant(64_000, tenant="a")
    pool = _pool(1)
    state = Snapshot.build(pool, [], book).state.copy()
    allocations: dict[str, Allocation] = {}
    kept = cycle(Snapshot(pool, state, allocations, book, quota.balances_from(book, [])), [_job(1)], 0.0)
    assert kept.memo is not None
    assert (kept.memo.allocations, kept.memo.balances, kept.memo.reclaimable) == (None, None, None)
    apply_cycle(kept, state, allocations, confirm=True)
    summed = cycle(Snapshot(pool, state, dict(allocations), book), [_job(2)], 5.0, memo=kept.memo)
    assert summed == cycle(Snapshot(pool, state, dict(allocations), book), [_job(2)], 5.0)
    assert summed.memo is not None
    assert summed.memo.allocations is not None, "it summed its own books: they go on to the next cycle"


def test_a_request_pending_twice_is_refused_with_the_fix() -> None:
    book = quota.QuotaBook.single_tenant(64_000, tenant="a")
    with pytest.raises(ValueError, match="request r1 is pending twice; give each pending request a unique id"):
        cycle(Snapshot.build(_pool(1), [], book), [_job(1), replace(_job(1), gpus=2)], 0.0)


def test_a_hold_that_needs_room_is_not_repeated_after_another_tenant_takes_the_room() -> None:
    # a1 and a2 (tenant a, 400 milli under its cap) ask 300 milli, which the node's 250-milli units
    # round to 500: a1 waits over its cap while a unit fits; b1 (b holds nothing either, so the
    # order is by submit time) takes the node's last free GPU, after which a2 no longer fits at all.
    pool = Pool((Node("n0", MODELS["H100"], 2, 256_000, 512_000, "d0", unit_milli=250),))
    tenants = {"a": 400, "b": 4000, "c": 4000}
    book = quota.QuotaBook(tenants, {(t, "default"): None for t in tenants})
    config = replace(CONFIG, overcommit=quota.OvercommitPolicy(max_ratio=1.0))
    taken = Allocation(
        Request("c0", "c", "default", Tier.INFERENCE, 0.0, gpus=1),
        Placement((GpuSlice("n0", 0, 1000),), (NodeShare("n0", 0, 0),)),
        start=0.0,
    )

    def replica(rid: str, tenant: str, at: float, milli: int) -> Request:
        return Request(rid, tenant, "default", Tier.INFERENCE, at, gpus=1, milli_per_gpu=milli)

    pending = [replica("a1", "a", 0.0, 300), replica("b1", "b", 1.0, 1000), replica("a2", "a", 2.0, 300)]
    result = cycle(Snapshot.build(pool, [taken], book), pending, 10.0, config)
    assert [a.request_id for a in result.admits] == ["b1"]
    assert [(h.request_id, h.reason) for h in result.holds] == [
        ("a1", HoldReason.OVER_QUOTA),
        ("a2", HoldReason.NO_FIT),
    ]
