"""No part of a cycle grows faster than the pool times the queue (DESIGN.md 5.2): each search states
its bound (`result.CycleWork`), and a worst case of each is held to it here, by the work the cycle
reports, not by time.

- the gang reservation moves at most `2 x MOST_RESERVATION_MOVES + 2` times (each blocked gang admitted
  passes it on, at most `MOST_RESERVATION_MOVES` times; each gang it held is dropped once admitted);
- a request gets a turn at most once per hold and once more in the lending pass;
- each turn tries at most `PLACEMENTS_PER_TURN` placements on the pool;
- the preemption planner's steps: `test_bounded_planning.py`.
"""

from __future__ import annotations

import numpy as np
import pytest

from xirang_platform.pool.model import GpuModel, Node, Pool
from xirang_platform.scheduling import quota
from xirang_platform.scheduling.apply import apply_cycle
from xirang_platform.scheduling.config import SchedulerConfig
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.holds import MOST_RESERVATION_MOVES
from xirang_platform.scheduling.model import Allocation, GpuSlice, HoldReason, NodeShare, Placement, Request, Tier
from xirang_platform.scheduling.result import PLACEMENTS_PER_TURN, CycleResult
from xirang_platform.scheduling.snapshot import Snapshot

H100 = GpuModel("H100-SXM", 81559, 989)
CONFIG = SchedulerConfig(starvation_wait_s=600, min_runtime_s=600)


def _pool(nodes: int, domain_size: int = 4) -> Pool:
    return Pool(tuple(Node(f"n{i:04d}", H100, 8, 256_000, 2_000_000, f"d{i // domain_size:03d}") for i in range(nodes)))


def _full_of_small_work(pool: Pool, tenant: str, seed: int = 3) -> list[Allocation]:
    """Every GPU held by one-GPU P2 work of `tenant`, started long enough ago to be preempted."""
    rng = np.random.default_rng(seed)
    out = []
    for node in pool.nodes:
        for g in range(node.gpus):
            r = Request(f"w-{node.name}-{g}", tenant, "default", Tier.OFFLINE_TRAINING, 0.0, gpus=1)
            placement = Placement((GpuSlice(node.name, g, 1000),), (NodeShare(node.name, 0, 0),))
            out.append(Allocation(r, placement, float(rng.integers(0, 1000))))
    return out


def _assert_within_bounds(result: CycleResult, queue: int) -> None:
    work = result.work
    assert work.reservation_moves <= 2 * MOST_RESERVATION_MOVES + 2
    assert work.turns <= (work.reservation_moves + 2) * queue
    assert work.placements <= PLACEMENTS_PER_TURN * work.turns


def _assert_valid(snapshot: Snapshot, result: CycleResult, pending: list[Request]) -> None:
    decided = {a.request_id for a in result.admits} | {h.request_id for h in result.holds}
    assert decided == {r.id for r in pending}, "every request is admitted or held, none lost"
    state, allocations = snapshot.state.copy(), dict(snapshot.allocations)
    apply_cycle(result, state, allocations, confirm=True)
    assert state.check() == []


@pytest.mark.parametrize(
    ("gangs", "small"),
    [
        pytest.param(4, 40, id="a few starving gangs, the hold moves with each"),
        pytest.param(3 * MOST_RESERVATION_MOVES, 200, id="more starving gangs than the hold may move for in a cycle"),
    ],
)
def test_starving_gangs_admitted_one_after_another_move_the_hold_a_bounded_number_of_times(gangs, small) -> None:
    # Every gang is starving (submitted long before the starvation wait) and fits only by preempting
    # the small work of another tenant; small P2 requests of the gangs' tenant wait behind the holds.
    pool = _pool(gangs * 2 + 8)
    running = _full_of_small_work(pool, "other")
    book = quota.QuotaBook(
        {"g": pool.gpu_milli, "other": pool.gpu_milli}, {(t, "default"): None for t in ["g", "other"]}
    )
    snapshot = Snapshot.build(pool, running, book)
    starving = [Request(f"gang-{k:03d}", "g", "default", Tier.ONLINE_TRAINING, float(k), gpus=8) for k in range(gangs)]
    waiting = [
        Request(f"small-{k:03d}", "g", "default", Tier.OFFLINE_TRAINING, 5_000.0 + k, gpus=1) for k in range(small)
    ]
    pending = [*starving, *waiting]
    result = cycle(snapshot, pending, 10_000.0, CONFIG)
    _assert_within_bounds(result, len(pending))
    _assert_valid(snapshot, result, pending)
    admitted = {a.request_id for a in result.admits}
    assert {r.id for r in starving} <= admitted, "every starving gang gets its units by preempting small work"


def test_a_fill_tries_a_bounded_number_of_placements_per_request() -> None:
    pool = _pool(200)
    book = quota.QuotaBook.single_tenant(pool.gpu_milli // 2, tenant="t")
    rng = np.random.default_rng(5)
    pending = [
        Request(
            f"r{k:05d}",
            "t",
            "default",
            [Tier.INFERENCE, Tier.ONLINE_TRAINING, Tier.OFFLINE_TRAINING][k % 3],
            float(k),
            gpus=int(rng.choice([1, 2, 4, 8])) if k % 3 else 1,
            milli_per_gpu=1000 if k % 3 else int(rng.choice([250, 500, 1000])),
        )
        for k in range(3_000)
    ]
    result = cycle(Snapshot.build(pool, [], book), pending, 10.0, CONFIG)
    _assert_within_bounds(result, len(pending))
    _assert_valid(Snapshot.build(pool, [], book), result, pending)
    assert any(h.reason is HoldReason.OVER_QUOTA for h in result.holds), "the quota binds: borrowing is tried"
