"""The autoscaling policy (scheduling/replica_scaling.py) over load sequences: spike, slow ramp, flapping
load, load above the tenant's cap, missing readings; and the requests and releases it turns into."""

from __future__ import annotations

import numpy as np
import pytest

from xirang_platform.scheduling.model import Tier
from xirang_platform.scheduling.replica_scaling import (
    Action,
    ScalerMemory,
    ServiceSpec,
    cap_replicas,
    decide,
    replica_requests,
    replicas_to_release,
)


def spec(**kw) -> ServiceSpec:
    """One replica serves 10 QPS; 20% headroom; up cooldown 60 s, down window 300 s; min 1."""
    base = dict(name="sd", tenant="serving", project="default", replica_qps=10.0, headroom=0.2, up_cooldown_s=60.0)
    base["down_cooldown_s"] = 300.0
    base.update(kw)
    return ServiceSpec(**base)


def run(s: ServiceSpec, loads: list[float | None], step: float = 30.0, cap: int | None = None, start: int = 1):
    """Feed one load per tick (every `step` s); the replicas follow each target at once.
    Returns the targets and the decisions."""
    memory, current, targets, decisions = ScalerMemory(), start, [], []
    for i, qps in enumerate(loads):
        d = decide(s, memory, current, qps, i * step, cap)
        memory, current = d.memory, d.target
        targets.append(d.target)
        decisions.append(d)
    return targets, decisions


def changes(targets: list[int], start: int = 1) -> int:
    return sum(a != b for a, b in zip([start, *targets], targets, strict=False))


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        pytest.param(
            [5, 5, 100, 100, 100, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5],
            [1, 1] + [12] * 12 + [1],
            id="spike-up-at-once-down-after-the-window",
        ),
        pytest.param(
            [10, 20, 30, 40, 50, 60, 70, 80],
            [2, 2, 4, 4, 6, 6, 9, 9],
            id="slow-ramp-follows-with-up-cooldown",
        ),
        pytest.param(
            [80, 10, 80, 10, 80, 10, 80, 10, 80, 10],
            [10] * 10,
            id="flapping-load-holds-the-peak-no-flapping",
        ),
        pytest.param(
            [0, 0, 0],
            [1, 1, 1],
            id="idle-keeps-min-replicas",
        ),
    ],
)
def test_replicas_follow_load(loads, expected):
    targets, _ = run(spec(), loads)
    assert targets == expected


def test_flapping_load_changes_replicas_once():
    loads = [80 if i % 2 == 0 else 10 for i in range(40)]
    targets, decisions = run(spec(), loads)
    assert changes(targets) == 1
    assert {d.action for d in decisions[1:]} <= {Action.STEADY, Action.DOWN_WINDOW}


def test_slow_ramp_down_steps_down_as_the_window_passes():
    loads = [80.0] + [80.0 - 5 * i for i in range(1, 17)]  # 80 -> 0 over 8 minutes
    targets, _ = run(spec(down_tolerance=0.0), loads)
    assert targets == sorted(targets, reverse=True)  # never up on a falling load
    assert targets[-1] < targets[0]
    # Each target covers the highest want of the last 300 s (10 ticks of 30 s).
    for i, t in enumerate(targets):
        window = loads[max(0, i - 9) : i + 1]
        assert t == max(1, spec().wanted(max(window)))


def test_noisy_steady_load_does_not_churn_within_the_tolerance():
    rng = np.random.default_rng(7)
    loads = list(100 * (1 + 0.06 * rng.standard_normal(400)))  # +-6% noise around 100 QPS, 200 minutes
    with_tolerance, _ = run(spec(), loads)
    without, _ = run(spec(down_tolerance=0.0), loads)
    assert changes(with_tolerance) <= 2
    assert changes(without) > 3 * changes(with_tolerance)
    # Never below what the load asks for at the tick itself.
    assert all(t >= spec().wanted(q) for t, q in zip(with_tolerance, loads, strict=True))


def test_a_drop_past_the_tolerance_releases_after_the_window():
    targets, decisions = run(spec(), [100.0] * 5 + [85.0] * 12)  # 12 -> 11 replicas: under 10%, held
    assert targets[-1] == 12
    assert decisions[-1].action is Action.DOWN_WINDOW
    targets, _ = run(spec(), [100.0] * 5 + [70.0] * 12)  # 12 -> 9: a 25% drop, released
    assert targets[-1] == 9


@pytest.mark.parametrize(
    ("cap", "qps", "target", "unserved"),
    [
        pytest.param(4, 100.0, 4, 60.0, id="load-above-cap-stops-at-cap"),
        pytest.param(0, 100.0, 0, 100.0, id="no-cap-left-no-replica-even-below-min"),
        pytest.param(20, 100.0, 12, 0.0, id="cap-not-reached"),
    ],
)
def test_load_above_the_tenants_cap(cap, qps, target, unserved):
    d = decide(spec(), ScalerMemory(), 1, qps, 0.0, cap)
    assert d.target == target
    assert d.capped is (target < d.wanted)
    assert d.unserved_qps == pytest.approx(unserved)


def test_a_cap_that_falls_releases_at_once_without_waiting_for_the_window():
    s = spec()
    d1 = decide(s, ScalerMemory(), 1, 100.0, 0.0, cap=20)
    d2 = decide(s, d1.memory, d1.target, 100.0, 30.0, cap=5)
    assert (d1.target, d2.target, d2.action) == (12, 5, Action.DOWN)


def test_max_replicas_bounds_before_the_cap():
    d = decide(spec(max_replicas=3), ScalerMemory(), 1, 100.0, 0.0, cap=50)
    assert d.target == 3
    assert not d.capped


def test_missing_reading_keeps_what_runs():
    targets, decisions = run(spec(), [50.0, None, None, 5.0])
    assert targets[:3] == [6, 6, 6]
    assert decisions[1].action is Action.NO_READING


def test_scale_up_requests_are_p0_single_node_replicas_with_fresh_ids():
    s = spec(replica_gpu_milli=2000, replica_gpu_memory_mib=40960)
    reqs = replica_requests(s, 7, 2, 120.0)
    assert [r.id for r in reqs] == ["sd/replica-7", "sd/replica-8"]
    assert all(r.tier is Tier.INFERENCE and r.single_node and r.gpus == 2 and r.total_milli == 2000 for r in reqs)
    assert all(r.gpu_memory_mib == 40960 and r.submit_time == 120.0 for r in reqs)
    frac = replica_requests(spec(replica_gpu_milli=500), 0, 1, 0.0)[0]
    assert (frac.gpus, frac.milli_per_gpu) == (1, 500)


def test_scale_down_releases_waiting_replicas_first_then_newest_running():
    assert replicas_to_release(["w1", "w2"], ["r1", "r2", "r3"], 3) == ["w2", "w1", "r3"]
    assert replicas_to_release([], ["r1"], 5) == ["r1"]


@pytest.mark.parametrize(
    ("cap_milli", "replica", "expected"),
    [
        pytest.param(8000, 1000, 8, id="whole-gpus"),
        pytest.param(8000, 3000, 2, id="rounds-down"),
        pytest.param(1000, 250, 4, id="fractions"),
        pytest.param(-500, 1000, 0, id="over-cap-already"),
    ],
)
def test_cap_replicas(cap_milli, replica, expected):
    assert cap_replicas(cap_milli, replica) == expected


@pytest.mark.parametrize(
    "kw",
    [
        pytest.param({"replica_qps": 0}, id="zero-qps"),
        pytest.param({"replica_gpu_milli": 1500}, id="not-whole-gpus"),
        pytest.param({"min_replicas": 3, "max_replicas": 2}, id="min-above-max"),
        pytest.param({"name": "a/b"}, id="slash-in-name"),
        pytest.param({"down_tolerance": 1.0}, id="tolerance-of-everything"),
    ],
)
def test_bad_service_spec_names_the_problem(kw):
    with pytest.raises(ValueError, match="service"):
        spec(**kw)
