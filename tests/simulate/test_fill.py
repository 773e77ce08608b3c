"""Fill mode (FGD's method): the per-seed workload, the allocation curve, and runs on an openb slice."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from xirang_platform.pool.model import MILLI_PER_GPU, Pool
from xirang_platform.scheduling.apply import apply_cycle
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.model import Request, Tier
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.scheduling.snapshot import SchedulerConfig, Snapshot
from xirang_platform.scheduling.state import ClusterState
from xirang_platform.simulate.fill import alloc_curve, fill_scorer, fill_workload, gpu_demand, run_fill
from xirang_platform.simulate.inputs import load_openb

OPENB = Path(__file__).resolve().parents[2] / "data" / "traces" / "alibaba_openb_gpu_2023"


def pod(name: str, gpus: int = 1, milli: int = 1000, cpu: int = 1000) -> Request:
    return Request(name, "t", "p", Tier.INFERENCE, 0.0, gpus=gpus, milli_per_gpu=milli, cpu_milli=cpu, single_node=True)


PODS = [pod("d", gpus=2), pod("a"), pod("c", gpus=0), pod("b", milli=500)]


def test_fill_workload_is_the_same_for_a_seed_and_differs_between_seeds():
    ids = [[r.id for r in fill_workload(PODS, 4000, seed)] for seed in (7, 7, 8)]
    assert ids[0] == ids[1]
    assert ids[0] != ids[2]


def test_fill_workload_shuffles_every_original_then_appends_draws_up_to_130_percent():
    capacity, ratio, seed = 4000, 1.3, 42
    got = fill_workload(PODS, capacity, seed, ratio)
    assert sorted(r.id for r in got[:4]) == ["a", "b", "c", "d"]
    extra = got[4:]
    assert [r.id.rsplit("-tuned-", 1)[1] for r in extra] == [str(i) for i in range(len(extra))]
    # Replay the rule with the same draws: each appended pod passed the test, the next draw fails it.
    originals = sorted(PODS, key=lambda r: r.id)
    rng = np.random.default_rng(seed)
    rng.permutation(len(originals))
    total = sum(gpu_demand(r) for r in originals)  # 2000 + 1000 + 0 + 500 = 3500
    for r in extra:
        drawn = originals[int(rng.integers(len(originals)))]
        assert r.id.startswith(drawn.id + "-tuned-")
        assert total + (drawn.milli_per_gpu if drawn.gpus else 0) <= ratio * capacity
        total += gpu_demand(drawn)
    stopper = originals[int(rng.integers(len(originals)))]
    assert total + (stopper.milli_per_gpu if stopper.gpus else 0) > ratio * capacity


def test_fill_workload_without_pods_is_an_error():
    with pytest.raises(ValueError, match="needs at least one pod"):
        fill_workload([], 1000, 0)


def test_alloc_curve_bins_by_round_half_even_and_falls_back_to_neighbours():
    # One GPU of capacity: arrived 5/15/25 milli are 0.5/1.5/2.5 percent, rounding to 0/2/2.
    curve = alloc_curve([(5, 5), (15, 10), (25, 20)], MILLI_PER_GPU)
    assert curve[0] == 0.5
    assert curve[2] == 1.5  # mean of 1.0 and 2.0
    assert curve[1] == 1.17  # no event rounds to 1: mean over columns 0..2
    assert curve[3] == 1.5  # columns 2..4
    assert math.isnan(curve[5])


@pytest.fixture(scope="module")
def openb_slice() -> tuple[Pool, list[Request]]:
    """Every 12th openb GPU node (102 nodes) and every 16th pod (510 pods)."""
    pool, pods = load_openb(OPENB / "openb_node_list_gpu_node.csv", OPENB / "openb_pod_list_default.csv")
    return Pool(pool.nodes[::12], source="openb slice"), pods[::16]


@pytest.mark.parametrize("policy", ["bestfit", "fgd", "xirang"])
def test_fill_on_an_openb_slice_keeps_capacity_invariants(openb_slice, policy):
    pool, pods = openb_slice
    r = run_fill(pool, pods, policy, seed=42, keep_events=True)
    s = r.state
    assert s.check() == []
    assert (s.gpu_free >= 0).all()
    assert (s.cpu_free >= 0).all()
    assert (s.mem_free >= 0).all()
    assert r.allocated_milli == pool.gpu_milli - int(s.gpu_free.sum())
    assert r.placed + r.dropped == r.pods == len(r.events)
    allocated = [u for _, u in r.events]
    assert allocated == sorted(allocated)  # nothing ever leaves
    assert all(u <= a for a, u in r.events)
    assert 0 < r.alloc_ratio_at_100 <= 100
    assert r.arrived_milli <= 1.3 * pool.gpu_milli + 7 * MILLI_PER_GPU  # the stop test adds per-GPU milli


def test_fill_is_deterministic_for_a_seed(openb_slice):
    pool, pods = openb_slice
    first = run_fill(pool, pods, "xirang", seed=3, keep_events=True)
    again = run_fill(pool, list(reversed(pods)), "xirang", seed=3, keep_events=True)
    assert (first.events, first.curve) == (again.events, again.curve)


@pytest.mark.parametrize("policy", ["bestfit", "fgd", "xirang"])
def test_fill_places_every_pod_where_a_plain_cycle_would(openb_slice, policy):
    """Fill mode hands each cycle the last one's memo and its own balances, and waits for no
    starving gang; pod by pod, a cycle without any of that (the scheduler's defaults) decides the same."""
    pool, pods = openb_slice
    r = run_fill(pool, pods, policy, seed=5, keep_events=True)
    state, allocations = ClusterState(pool), {}
    book = QuotaBook({r.tenant: pool.gpu_milli for r in pods}, {(r.tenant, r.project): None for r in pods})
    config = SchedulerConfig(preemption=False, scorer=fill_scorer(policy, pods, 5), node_priority_seed=5)
    events, arrived = [], 0
    for k, request in enumerate(fill_workload(pods, pool.gpu_milli, 5)):
        arrived += gpu_demand(request)
        result = cycle(Snapshot(pool, state, dict(allocations), book), [request], float(k), config)
        apply_cycle(result, state, allocations)
        events.append((arrived, state.allocated_milli))
    assert r.events == tuple(events)


def test_fill_drops_a_pod_that_fits_nowhere(openb_slice):
    """A pod no node can hold is dropped (arrived, never allocated) and the run goes on."""
    pool, pods = openb_slice
    impossible = replace(pods[0], id="zz-impossible", gpus=8, milli_per_gpu=1000, cpu_milli=10**9)
    r = run_fill(pool, [*pods, impossible], "bestfit", seed=1)
    assert r.dropped >= 1


def test_fill_rejects_an_unknown_policy(openb_slice):
    pool, pods = openb_slice
    with pytest.raises(ValueError, match="unknown fill policy 'fgdd'; choose one of bestfit, fgd, xirang"):
        run_fill(pool, pods, "fgdd", seed=1)
