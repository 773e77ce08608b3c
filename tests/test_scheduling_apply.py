"""The one applier of a cycle's decisions (`scheduling/apply.py`): order, record, balances, refusals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from xirang_platform.pool.model import GpuModel, Node, Pool
from xirang_platform.scheduling import quota
from xirang_platform.scheduling.apply import Applied, apply_cycle, pending_after
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.model import (
    Admit,
    Allocation,
    GpuSlice,
    Hold,
    HoldReason,
    NodeShare,
    Placement,
    Preempt,
    PreemptReason,
    Request,
    Return,
    Tier,
)
from xirang_platform.scheduling.result import CycleResult
from xirang_platform.scheduling.snapshot import Snapshot
from xirang_platform.scheduling.state import ClusterState

H100 = GpuModel("H100", 81559, 989)
POOL = Pool((Node("n0", H100, 8, 64_000, 512_000, "d0"), Node("n1", H100, 8, 64_000, 512_000, "d0")))
BOOK = quota.QuotaBook({"acme": 4000, "beta": 8000}, {("acme", "default"): None, ("beta", "default"): None})


def held(rid: str, node: str, gpus: tuple[int, ...], *, tenant: str = "acme", borrowed: bool = False) -> Allocation:
    """An allocation of whole GPUs `gpus` on `node`, 1000 milli-CPU each."""
    request = Request(rid, tenant, "default", Tier.OFFLINE_TRAINING, 0.0, gpus=len(gpus), cpu_milli=1000 * len(gpus))
    placement = Placement(tuple(GpuSlice(node, g, 1000) for g in gpus), (NodeShare(node, 1000 * len(gpus), 0),))
    return Allocation(request, placement, start=0.0, borrowed=borrowed)


LENT = held("lent", "n0", (0, 1), borrowed=True)
OLD = held("old", "n0", (2, 3))
NEW = replace(held("new", "n1", (0, 1, 2), tenant="beta"), confirmed=False)


def world(*allocations: Allocation) -> tuple[ClusterState, dict[str, Allocation], quota.Balances]:
    state = ClusterState(POOL)
    for a in allocations:
        state.apply(a.placement)
    by_id = {a.id: a for a in allocations}
    return state, by_id, quota.balances_from(BOOK, by_id.values())


def test_returns_then_preempts_then_admits_and_the_record_says_so() -> None:
    state, allocations, balances = world(LENT, OLD)
    # The cycle returned `lent` and later preempted it: the victim is the returned allocation.
    result = CycleResult(
        admits=(Admit(NEW),),
        preempts=(Preempt(replace(LENT, borrowed=False), "new", PreemptReason.PRIORITY),),
        returns=(Return("lent", 2000),),
    )

    applied = apply_cycle(result, state, allocations, balances=balances, book=BOOK)

    returned = replace(LENT, borrowed=False)
    assert applied == Applied(returned=(returned,), preempted=((result.preempts[0], returned),), admitted=(NEW,))
    assert allocations == {"old": OLD, "new": NEW}
    assert balances == quota.balances_from(BOOK, allocations.values())
    np.testing.assert_array_equal(state.gpu_free, world(OLD, NEW)[0].gpu_free)
    np.testing.assert_array_equal(state.cpu_free, world(OLD, NEW)[0].cpu_free)
    assert applied.requeued == [replace(LENT.request, preempted=1)]


def test_confirm_stores_admissions_as_launched() -> None:
    state, allocations, _ = world()
    applied = apply_cycle(CycleResult(admits=(Admit(NEW),)), state, allocations, confirm=True)
    assert applied.admitted == (replace(NEW, confirmed=True),)
    assert allocations["new"].confirmed


BAD_RESULTS = [
    pytest.param(CycleResult(returns=(Return("ghost", 1000),)), "returns ghost", id="return of an unknown allocation"),
    pytest.param(
        CycleResult(preempts=(Preempt(held("ghost", "n1", (7,)), "x", PreemptReason.PRIORITY),)),
        "preempts ghost",
        id="victim not held",
    ),
    pytest.param(
        CycleResult(admits=(Admit(NEW), Admit(OLD))), "admits old, which the caller's", id="admission of a held request"
    ),
    pytest.param(
        CycleResult(
            preempts=(
                Preempt(OLD, "x", PreemptReason.PRIORITY),
                Preempt(OLD, "y", PreemptReason.PRIORITY),
            )
        ),
        "preempts old",
        id="one victim twice",
    ),
    pytest.param(CycleResult(admits=(Admit(NEW), Admit(NEW))), "admits new, which", id="one admission twice"),
]


@pytest.mark.parametrize(("result", "message"), BAD_RESULTS)
def test_a_result_the_state_cannot_take_changes_nothing(result: CycleResult, message: str) -> None:
    state, allocations, balances = world(LENT, OLD)
    before = (state.gpu_free.copy(), state.cpu_free.copy(), dict(allocations), dict(balances))
    with pytest.raises(ValueError, match=message):
        apply_cycle(result, state, allocations, balances=balances, book=BOOK)
    np.testing.assert_array_equal(state.gpu_free, before[0])
    np.testing.assert_array_equal(state.cpu_free, before[1])
    assert (allocations, balances) == (before[2], before[3])


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda s, a, b: apply_cycle(CycleResult(), s, a, balances=b), id="balances without a book"),
        pytest.param(lambda s, a, b: apply_cycle(CycleResult(), s, a, book=BOOK), id="book without balances"),
    ],
)
def test_balances_travel_with_their_book(call: Callable) -> None:
    state, allocations, balances = world(OLD)
    with pytest.raises(ValueError, match="pass both or neither"):
        call(state, allocations, balances)


def test_pending_after_keeps_the_waiting_and_requeues_victims() -> None:
    waiting = [
        Request(rid, "acme", "default", Tier.OFFLINE_TRAINING, 0.0, gpus=1) for rid in ("admitted", "held", "never")
    ]
    result = CycleResult(
        admits=(Admit(replace(held("admitted", "n1", (5,)), confirmed=False)),),
        preempts=(Preempt(OLD, "admitted", PreemptReason.PRIORITY),),
        holds=(
            Hold("held", HoldReason.NO_FIT, "waits"),
            Hold("never", HoldReason.NEVER_FITS, "too big"),
        ),
    )
    assert pending_after(waiting, result) == [waiting[1], replace(OLD.request, preempted=1)]


def test_cycles_applied_in_turn_keep_state_and_balances_equal_to_a_rebuild() -> None:
    """Several real cycles with returns, preemptions and admissions: the applied state is always what
    `Snapshot.build` makes of the allocations, and the kept balances what `balances_from` sums."""
    state, allocations, balances = world()
    pending = [Request(f"p2-{i}", "acme", "default", Tier.OFFLINE_TRAINING, 0.0, gpus=2 + i % 3) for i in range(6)] + [
        Request(f"p0-{i}", "beta", "default", Tier.INFERENCE, 3000.0, gpus=2, single_node=True) for i in range(4)
    ]
    seen = {"returns": 0, "preempts": 0, "admits": 0}
    for step in range(6):
        now = 1000.0 * (step + 1)
        arrived = [r for r in pending if r.submit_time <= now]
        snapshot = Snapshot(POOL, state, dict(allocations), BOOK, dict(balances))
        result = cycle(snapshot, arrived, now)
        apply_cycle(result, state, allocations, balances=balances, book=BOOK)
        pending = pending_after(arrived, result) + [r for r in pending if r.submit_time > now]
        for kind in seen:
            seen[kind] += len(getattr(result, kind))
        rebuilt = Snapshot.build(POOL, allocations.values(), BOOK).state
        np.testing.assert_array_equal(rebuilt.gpu_free, state.gpu_free)
        np.testing.assert_array_equal(rebuilt.whole_free, state.whole_free)
        assert balances == quota.balances_from(BOOK, allocations.values())
        if step == 1:  # acme's in-quota P2 work finishes: its borrowed work may return
            for rid in sorted(a for a, held in allocations.items() if a.startswith("p2") and not held.borrowed):
                gone = allocations.pop(rid)
                state.release(gone.placement)
                quota.charge_allocation(BOOK, balances, gone, -gone.milli)
    assert min(seen.values()) > 0, seen
