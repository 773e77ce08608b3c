"""Autoscaled inference in the replay: scale-up reclaims lent units and preempts P2 work, scale-down
hands them back to training, every event-log invariant holds; siloed partitions and never lends."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.simulate.sim_builders import job, node, pool
from xirang_platform.load.traces import LoadSeries
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.scheduling.replica_scaling import ServiceSpec
from xirang_platform.scheduling.snapshot import SchedulerConfig
from xirang_platform.simulate.events import check_events
from xirang_platform.simulate.inference_replay import InferenceSetup, inference_partition, run_policy
from xirang_platform.simulate.replay import ReplayOptions

SPEC = ServiceSpec(
    "sd", "serving", "default", replica_qps=1.0, headroom=0.0, up_cooldown_s=0, down_cooldown_s=120,
    replica_cpu_milli=1000, replica_memory_mib=1024,
)  # fmt: skip
CONFIG = SchedulerConfig(min_runtime_s=60)
TIERS = ["online-training", "offline-training"]
OPTIONS = ReplayOptions(check_state=True, checkpoint_interval_s=30)


def series(*steps: tuple[float, float], end: float) -> LoadSeries:
    return LoadSeries(np.array([t for t, _ in steps]), np.array([q for _, q in steps]), end, "test")


def training_book() -> QuotaBook:
    return QuotaBook({"train": 4000}, {("train", "default"): None})


def four_by_two():
    return pool(*(node(f"n{i}", gpus=2) for i in range(4)))  # 8 GPUs; peak 4 replicas -> 2 inference nodes


def burst():
    """Load 1 QPS, a burst to 4 at t=600 until t=1200, then 1 again until 1800."""
    return InferenceSetup(SPEC, series((0, 1), (600, 4), (1200, 1), end=1800), tick_s=60)


def training_jobs():
    return [job(f"j{i}", submit=10, duration=3000, tenant="train") for i in range(7)]


@pytest.mark.parametrize(
    ("forecast_s", "resume_at"),
    [
        # Without the lending forecast the reclaimed jobs wait out their back-off (reclaimed at 600,
        # 1,800 s): the replay wakes for that instant, as a live tick would.
        pytest.param(None, 600 + CONFIG.reclaim_backoff_s, id="back-off"),
        # With it, the units the replicas free at 1260 are forecast to stay idle past a checkpoint
        # (30 s; they were idle 600 s before the burst), so the jobs borrow them back at once.
        pytest.param(CONFIG.lend_forecast_s, 1260, id="lending forecast"),
    ],
)
def test_unified_inference_reclaims_lent_units_and_returns_them_with_every_invariant(forecast_s, resume_at):
    config = replace(CONFIG, lend_forecast_s=forecast_s)
    run = run_policy("unified", four_by_two(), training_book(), training_jobs(), burst(), config, OPTIONS)
    [(p, b, result)] = run.parts
    assert check_events(result.events, p, b) == []
    kinds = [(e["t"], e["event"], e["job"]) for e in result.events]
    # Training borrows the serving tenant's idle GPUs (3 of 7 jobs run borrowed); the burst takes three
    # GPUs back by preempting P2 work (which victims is the cycle's victim order).
    assert sum(e["borrowed"] for e in result.events if e["event"] == "admit" and e["t"] == 10) == 3
    preempts = [e for e in result.events if e["event"] == "preempt"]
    assert len(preempts) == 3
    assert all(e["t"] == 600 and e["by"].startswith("sd/replica-") for e in preempts)
    assert {e["reason"] for e in preempts} == {"reclaim"}
    # The burst ends at 1200; after the down window (120 s) the replicas stop. The preempted jobs were
    # reclaimed from borrowed units, so they borrow again at `resume_at` (see the parameters).
    stops = [t for t, kind, j in kinds if kind == "finish" and j.startswith("sd/") and t < 1800]
    assert stops == [1260, 1260, 1260]
    resumed = [t for t, kind, j in kinds if kind == "admit" and not j.startswith("sd/") and t > 600]
    assert resumed == [resume_at] * 3
    # Inference waited for nothing: every replica was admitted at the tick that asked for it.
    submits = {j: t for t, kind, j in kinds if kind == "submit"}
    assert all(t == submits[j] for t, kind, j in kinds if kind == "admit" and j.startswith("sd/"))
    # When the load ends every replica stops; nothing inference is left.
    assert [j for j in result.waiting if j.id.startswith("sd/")] == []
    assert [(d.now, d.target) for d in run.decisions if d.delta] == [(0, 1), (600, 4), (1260, 1)]


def test_siloed_keeps_a_fixed_partition_and_never_lends():
    run = run_policy("siloed", four_by_two(), training_book(), training_jobs(), burst(), CONFIG, OPTIONS)
    (ip, ib, served), (tp, tb, trained) = run.parts
    assert [n.name for n in ip.nodes] == ["n0", "n1"]
    assert [n.name for n in tp.nodes] == ["n2", "n3"]
    assert run.inference_gpus == 4
    assert check_events(served.events, ip, ib) == []
    assert check_events(trained.events, tp, tb) == []
    assert not any(e["event"] == "preempt" for e in run.events)
    # Only 4 of 7 training jobs run at once: the partition's idle GPUs are never lent.
    running = [e for e in trained.events if e["event"] == "admit" and e["t"] == 10]
    assert len(running) == 4
    assert [e["t"] for e in run.events] == sorted(e["t"] for e in run.events)


def test_partition_holds_the_peak_in_whole_nodes():
    setup = InferenceSetup(SPEC, series((0, 5.0), end=60))  # 5 replicas of 1 GPU: 3 two-GPU nodes
    inference, training = inference_partition(four_by_two(), setup)
    assert (inference.gpus, training.gpus) == (6, 2)


def test_unknown_policy_is_an_error():
    with pytest.raises(ValueError, match="unified, siloed"):
        run_policy("shared", four_by_two(), training_book(), [], burst())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    loads=st.lists(st.integers(0, 6), min_size=1, max_size=6),
    jobs=st.lists(
        st.tuples(st.integers(0, 1500), st.integers(60, 2000), st.sampled_from([1, 2]), st.sampled_from(TIERS)),
        max_size=8,
    ),
)
def test_unified_replays_keep_every_invariant_whatever_the_load(loads, jobs):
    load = series(*((300.0 * i, float(q)) for i, q in enumerate(loads)), end=300.0 * len(loads))
    setup = InferenceSetup(SPEC, load, tick_s=60)
    trace = [
        job(f"j{i}", submit=t, duration=d, gpus=g, tier=tier, tenant=("train" if i % 2 else "lab"), single_node=False)
        for i, (t, d, g, tier) in enumerate(jobs)
    ]
    two = QuotaBook({"train": 2000, "lab": 2000}, {("train", "default"): None, ("lab", "default"): None})
    for policy in ("unified", "siloed"):
        run = run_policy(policy, four_by_two(), two, trace, setup, CONFIG, OPTIONS)
        for p, b, result in run.parts:
            assert check_events(result.events, p, b) == []
        # Every training job finishes; no replica outlives the load.
        finished = {e["job"] for e in run.events if e["event"] == "finish"}
        assert {j.request.id for j in trace} <= finished
        assert all(e["t"] <= load.end for e in run.events if e["job"].startswith("sd/"))


def hourly_dip(hours: int = 4) -> InferenceSetup:
    """Load 4 QPS, dipping to 1 for the last 10 minutes of every hour."""
    steps = [(h * 3600.0 + offset, q) for h in range(hours) for offset, q in ((0, 4), (3000, 1))]
    return InferenceSetup(SPEC, series(*steps, end=hours * 3600.0), tick_s=60)


@pytest.mark.parametrize(
    ("forecast_s", "want_reclaimed_at"),
    [
        # Every dip is lent (once the doubled back-off allows), and each reclaim at the top of the hour
        # throws away the 540 s run since the borrow, before the first checkpoint (1,800 s).
        pytest.param(None, [3600.0] * 3 + [7200.0] * 3, id="no forecast"),
        # The first dip is lent (nothing says it ends soon); after it the serving tenant's history says
        # its dips last 540 s, short of a checkpoint, so they are not lent again.
        pytest.param(7200.0, [3600.0] * 3, id="lending forecast"),
    ],
)
def test_a_dip_that_comes_back_before_a_checkpoint_is_lent_once(forecast_s, want_reclaimed_at):
    config = SchedulerConfig(min_runtime_s=1800, lend_forecast_s=forecast_s)
    options = ReplayOptions(check_state=True, checkpoint_interval_s=1800)
    jobs = [job(f"j{i}", submit=10, duration=20000, tenant="train") for i in range(7)]
    run = run_policy("unified", four_by_two(), training_book(), jobs, hourly_dip(), config, options)
    [(p, b, result)] = run.parts
    assert check_events(result.events, p, b) == []
    preempts = [e for e in result.events if e["event"] == "preempt"]
    assert [e["t"] for e in preempts] == want_reclaimed_at
    assert {e["lost_gpu_s"] for e in preempts} == {540.0}
    # Inference never waits for it.
    submits = {e["job"]: e["t"] for e in result.events if e["event"] == "submit"}
    assert all(
        e["t"] == submits[e["job"]] for e in result.events if e["event"] == "admit" and e["job"].startswith("sd/")
    )
