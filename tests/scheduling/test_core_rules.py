"""Direct tables for the rules the cycle composes: `plan_preemption`, `queue_order`, gang placement
and `quota.check` (each reached here without going through `cycle`)."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import FrozenInstanceError, replace

import numpy as np
import pytest

from tests.scheduling.cycle_builders import JobBuilder, NodeBuilder, gpus_by_node, job, node, quotas, running
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling import quota
from xirang_platform.scheduling.feasibility import eligible_nodes
from xirang_platform.scheduling.gang_groups import usable_whole_gpus
from xirang_platform.scheduling.model import (
    Admit,
    Allocation,
    GpuSlice,
    Hold,
    HoldReason,
    NodeShare,
    Placement,
    PreemptReason,
    whole_gpu_slices,
)
from xirang_platform.scheduling.order import queue_order
from xirang_platform.scheduling.placement import place
from xirang_platform.scheduling.preemption.cost import victim_cost
from xirang_platform.scheduling.preemption.planner import plan_preemption
from xirang_platform.scheduling.preemption.victims import Headroom
from xirang_platform.scheduling.quota import AccountKey, Balance, QuotaBook, Verdict
from xirang_platform.scheduling.scorers import BestFit
from xirang_platform.scheduling.snapshot import SchedulerConfig, Snapshot

NOW = 10_000.0


def _state(nodes: Sequence[NodeBuilder], allocations: Sequence[Allocation]):
    pool = Pool(tuple(n.build() for n in nodes))
    return Snapshot.build(pool, allocations, QuotaBook.single_tenant(pool.gpu_milli)).state


# --- plan_preemption -------------------------------------------------------------------------------

PLANS = [
    pytest.param(
        [node("n0")],
        [running(job("v").gpus(4), on={"n0": [0, 1, 2, 3]})],
        job("r").gpus(4).tier("inference"),
        None,
        None,
        id="the request fits already: no plan",
    ),
    pytest.param(
        [node(f"n{i}").domain(f"d{i}").gpus(2) for i in range(4)],
        [running(job(f"v{i}").gpus(2), on={f"n{i}": [0, 1]}) for i in range(4)],
        job("gang").gpus(8).tier("online-training"),
        None,
        None,
        id="Kueue #5243: eight GPUs freed over four domains never form an 8-GPU gang",
    ),
    pytest.param(
        [node("n0").gpus(4), node("n1").gpus(4)],
        [
            running(job("in-quota").gpus(4), on={"n0": [0, 1, 2, 3]}, start=9_000),
            running(job("lent").gpus(4).tenant("x"), on={"n1": [0, 1, 2, 3]}, start=0, borrowed=True),
        ],
        job("r").gpus(4).tier("inference"),
        None,
        (["lent"], {"n1": [0, 1, 2, 3]}),
        id="between scopes a borrowed victim goes first, even one that ran far longer",
    ),
    pytest.param(
        [node("n0").gpus(5)],
        [
            running(job("small").gpus(1), on={"n0": [0]}, start=9_000),
            running(job("big").gpus(4), on={"n0": [1, 2, 3, 4]}, start=8_000),
        ],
        job("r").gpus(4).tier("inference"),
        None,
        (["big"], {"n0": [1, 2, 3, 4]}),
        id="inside a scope the cheap victim that did not help is put back",
    ),
    pytest.param(
        [node("n0").gpus(4)],
        [
            running(job("own-old").gpus(1), on={"n0": [0]}, start=0),
            running(job("own-young").gpus(1), on={"n0": [1]}, start=9_000),
        ],
        job("r").gpus(1).tier("inference"),
        2,  # the tenant's quota in GPUs: its two jobs hold all of it
        (["own-young"], {"n0": [1]}),
        id="over its cap: relief stops the tenant's own work that lost the least",
    ),
]


@pytest.mark.parametrize(("nodes", "allocs", "request_", "quota_gpus", "want"), PLANS)
def test_plan_preemption(nodes, allocs, request_: JobBuilder, quota_gpus, want) -> None:
    pool = Pool(tuple(n.build() for n in nodes))
    book = QuotaBook.single_tenant(pool.gpu_milli if quota_gpus is None else quota_gpus * 1000, tenant="acme")
    snapshot = Snapshot.build(pool, allocs, book)
    state = snapshot.state
    request = request_.build()
    candidates = [(a, PreemptReason.RECLAIM if a.borrowed else PreemptReason.PRIORITY) for a in allocs]
    balances = quota.balances_from(book, snapshot.allocations.values())
    exact_caps = SchedulerConfig(overcommit=quota.OvercommitPolicy(max_ratio=1.0))
    plan = plan_preemption(
        state,
        request,
        candidates,
        Headroom(request, state, book, balances, exact_caps),
        NOW,
        BestFit(),
        np.arange(len(state.names)),
    )
    if want is None:
        assert plan is None
        return
    assert plan is not None
    assert (sorted(v.id for v, _ in plan.victims), gpus_by_node(plan.placement)) == want


@pytest.mark.parametrize(
    ("victims", "cheaper_than"),
    [
        pytest.param(
            [running(job("b").gpus(8), on={"n0": list(range(8))}, start=0, borrowed=True)],
            [running(job("i").gpus(1), on={"n0": [0]}, start=9_900)],
            id="any borrowed victim before any in-quota one",
        ),
        pytest.param(
            [running(job("y1"), on={"n0": [0]}, start=9_000), running(job("y2"), on={"n0": [1]}, start=9_000)],
            [running(job("old").gpus(2), on={"n0": [0, 1]}, start=0)],
            id="least work lost before fewest victims",
        ),
        pytest.param(
            [running(job("a").gpus(2), on={"n0": [0, 1]}, start=9_000)],
            [running(job("b1"), on={"n0": [0]}, start=8_000), running(job("b2"), on={"n0": [1]}, start=8_000)],
            id="equal work lost: fewer victims",
        ),
        pytest.param(
            [running(job("a"), on={"n0": [0]}, start=9_000)],
            [running(job("b"), on={"n0": [1]}, start=9_000)],
            id="exact tie: ids decide",
        ),
    ],
)
def test_victim_cost_orders_plans(victims: list[Allocation], cheaper_than: list[Allocation]) -> None:
    assert victim_cost(victims, NOW, None) < victim_cost(cheaper_than, NOW, None)


def test_victim_cost_counts_work_since_the_last_checkpoint() -> None:
    long_run = running(job("long"), on={"n0": [0]}, start=0)  # 10,000 s, checkpoint at 9,900
    short_run = running(job("short"), on={"n0": [1]}, start=9_800)  # 200 s, no checkpoint yet
    assert victim_cost([long_run], NOW, 300.0) < victim_cost([short_run], NOW, 300.0)
    assert victim_cost([short_run], NOW, None) < victim_cost([long_run], NOW, None)


# --- queue_order -----------------------------------------------------------------------------------

ORDERS = [
    pytest.param(
        [job("p2").at(0), job("p1").tier("online-training").at(1), job("p0").tier("inference").at(2)],
        {},
        ["p0", "p1", "p2"],
        id="tier first: P0, P1, P2 whatever the submit times",
    ),
    pytest.param(
        [job("fresh").at(0), job("back").at(5).resumed()],
        {},
        ["back", "fresh"],
        id="a preempted request resumes before an older fresh one",
    ),
    pytest.param(
        [job("a1").tenant("a").at(0), job("a2").tenant("a").at(1), job("b1").tenant("b").at(2)],
        {"a": 4_000, "b": 1_000},
        ["b1", "a1", "a2"],
        id="the tenant furthest below its quota share goes first",
    ),
    pytest.param(
        [job("a1").tenant("a").at(0), job("b1").tenant("b").at(0), job("a2").tenant("a").at(0)],
        {},
        ["a1", "a2", "b1"],
        id="equal shares and submit times: the id is the final tie-breaker",
    ),
]


@pytest.mark.parametrize(("pending", "held", "want"), ORDERS)
def test_queue_order(pending: list[JobBuilder], held: dict[str, int], want: list[str]) -> None:
    book = quotas({"acme": 8, "a": 8, "b": 8})
    balances = {AccountKey(t): Balance(q, used=held.get(t, 0)) for t, q in book.tenants.items()}
    assert [r.id for r in queue_order([p.build() for p in pending], book, balances)] == want


def test_queue_order_reads_shares_live() -> None:
    book = quotas({"a": 8, "b": 8})
    balances = {AccountKey("a"): Balance(8_000), AccountKey("b"): Balance(8_000, used=500)}
    order = queue_order([job(k).tenant(k[0]).at(i).build() for i, k in enumerate(["a1", "a2", "b1"])], book, balances)
    assert next(order).id == "a1"
    balances[AccountKey("a")] = Balance(8_000, used=1_000)  # a1 admitted: a's share passes b's
    assert [r.id for r in order] == ["b1", "a2"]


# --- gang placement --------------------------------------------------------------------------------

GANGS = [
    pytest.param(
        [node("n0").domain("d0"), node("n1").domain("d0").gpus(4), node("n2").domain("d1").gpus(4)],
        job("g").gpus(8).tier("online-training"),
        {"n0": list(range(8))},
        id="fewest nodes: one free 8-GPU node before two 4-GPU ones",
    ),
    pytest.param(
        [node("n0").domain("d0").gpus(4), node("n1").domain("d1").gpus(4), node("n2").domain("d1").gpus(4)],
        job("g").gpus(6).tier("online-training"),
        {"n1": [0, 1, 2, 3], "n2": [0, 1]},
        id="one domain: 6 GPUs never span d0 and d1",
    ),
    pytest.param(
        [node("n0").domain("d0").gpus(4), node("n1").domain("d1").gpus(4)],
        job("g").gpus(6).tier("online-training"),
        None,
        id="P1 has no mixed fallback",
    ),
    pytest.param(
        [node("n0").domain("d0").gpus(4), node("n1").domain("d1").gpus(4)],
        job("g").gpus(6),
        {"n0": [0, 1, 2, 3], "n1": [0, 1]},
        id="P2 falls back to a mix of free GPUs",
    ),
    pytest.param(
        [node("n0").model("H100"), node("n1").model("A100")],
        job("g").gpus(10).tier("online-training"),
        None,
        id="one model: an H100 node and an A100 node never hold one gang",
    ),
    pytest.param(
        [node("n0").cpu(16_000), node("n1")],
        job("g").gpus(8).cpu(32_000).tier("online-training"),
        {"n1": list(range(8))},
        id="CPU per GPU limits how many GPUs a node can give",
    ),
]


@pytest.mark.parametrize(("nodes", "request_", "want"), GANGS)
def test_gang_placement(nodes: list[NodeBuilder], request_: JobBuilder, want) -> None:
    state = _state(nodes, [])
    found = place(state, request_.build(), BestFit(), np.arange(len(state.names)))
    if want is None:
        assert found is None
        return
    assert found is not None
    assert gpus_by_node(found) == want


def test_usable_whole_gpus_of_one_row_as_of_all() -> None:
    """`usable_whole_gpus` of one row (what an admission re-reads) counts as over every node."""
    nodes = [node("n0"), node("n1").cpu(16_000), node("n2")]
    busy = [running(job("v").gpus(3).cpu(6_000), on={"n2": [0, 1, 2]})]
    state = _state(nodes, busy)
    request = job("g").gpus(8).cpu(24_000).tier("online-training").build()
    eligible = eligible_nodes(state, request)
    all_rows = usable_whole_gpus(state, request, eligible)
    one_by_one = [
        usable_whole_gpus(state, request, eligible[[row]], np.array([row])).item() for row in range(len(nodes))
    ]
    assert one_by_one == all_rows.tolist() == [8, 5, 5]


def test_whole_gpu_slices_as_gpu_slice() -> None:
    """`whole_gpu_slices` makes what `GpuSlice` makes: equal, equally hashed, the same milli placed."""
    made = whole_gpu_slices("n0", [0, 3], 1024)
    want = [GpuSlice("n0", 0, 1000, 1024), GpuSlice("n0", 3, 1000, 1024)]
    assert made == want
    assert [hash(s) for s in made] == [hash(s) for s in want]
    shares = (NodeShare("n0", 0, 0),)
    assert Placement(tuple(made), shares).milli == Placement(tuple(want), shares).milli == 2000


def test_written_out_inits_make_plain_values() -> None:
    """The slotted decision types (`Hold`'s `__init__` written out, slots set one by one) take keywords
    and defaults, compare and hash by value, refuse changes, and survive `replace` and pickling."""
    request = job("r").gpus(2).build()
    placement = Placement((GpuSlice("n0", 0, 1000),), (NodeShare("n0", 100, 200),))
    allocation = Allocation(request, placement, start=5.0, confirmed=False)
    assert (allocation.borrowed, allocation.confirmed, allocation.milli) == (False, False, 1000)
    assert allocation == Allocation(request, placement, 5.0, False, False)
    assert replace(allocation, borrowed=True) == Allocation(request, placement, 5.0, True, False)
    hold = Hold("r", HoldReason.NO_FIT, "waits")
    values = [placement, allocation, Admit(allocation), hold, Balance(8_000, reserved=500)]
    for value in values:
        assert pickle.loads(pickle.dumps(value)) == value
        assert hash(value) == hash(pickle.loads(pickle.dumps(value)))
    assert Balance(8_000, reserved=500) == Balance(8_000, 0, 500, 0) != Balance(8_000)
    with pytest.raises(FrozenInstanceError):
        hold.message = "other"  # type: ignore[misc]


# --- quota.check -----------------------------------------------------------------------------------

BOOK = quotas({"t": 8}, {("t", "capped"): 2})


def _balances(tenant_used: int = 0, project_used: int = 0) -> dict[AccountKey, Balance]:
    return {
        AccountKey("t"): Balance(8_000, used=tenant_used),
        AccountKey("t", "capped"): Balance(2_000, used=project_used),
    }


CHECKS = [
    pytest.param(job("r").gpus(4).tenant("t"), _balances(), 1.2, None, (Verdict.IN_QUOTA, None), id="in quota"),
    pytest.param(
        job("r").gpus(2).tenant("t"), _balances(8_000), 1.2, None, (Verdict.BORROW, "t"), id="P2 past the cap borrows"
    ),
    pytest.param(
        job("r").gpus(2).tenant("t").tier("inference"),
        _balances(8_000),
        1.2,
        None,
        (Verdict.OVER_QUOTA, "t"),
        id="P0 past the cap waits",
    ),
    pytest.param(
        job("r").gpus(2).tenant("t").tier("inference"),
        _balances(8_000),
        1.25,
        None,
        (Verdict.IN_QUOTA, None),
        id="the cap is quota x ratio: 8 x 1.25 = 10 GPUs",
    ),
    pytest.param(
        job("r").gpus(1).tenant("t", "capped").tier("inference"),
        _balances(1_000, 2_000),
        1.2,
        None,
        (Verdict.OVER_QUOTA, "t/capped"),
        id="a project's own quota binds inside its tenant's",
    ),
    pytest.param(
        job("r").milli(250).tenant("t").tier("inference"),
        _balances(9_500),
        1.2,
        1_000,
        (Verdict.OVER_QUOTA, "t"),
        id="the amount checked is what the placement holds (a quarter rounded to a whole GPU)",
    ),
    pytest.param(
        job("r").tenant("nobody"), _balances(), 1.2, None, (Verdict.UNKNOWN_ACCOUNT, None), id="unknown account"
    ),
]


@pytest.mark.parametrize(("request_", "balances", "ratio", "amount", "want"), CHECKS)
def test_quota_check(request_: JobBuilder, balances, ratio: float, amount: int | None, want) -> None:
    got = quota.check(BOOK, balances, request_.build(), ratio, amount)
    assert (got.verdict, str(got.account) if got.account else None) == want
