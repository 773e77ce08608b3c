"""The fluid schedule the unified-vs-siloed bench bounds its ratios with (`simulate/inference_bounds.py`)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.simulate.sim_builders import job
from xirang_platform.scheduling.replica_scaling import ServiceSpec
from xirang_platform.simulate.inference_bounds import fluid_jct_mean, fluid_schedule, fluid_util, replica_series

SHORT_AND_LONG = [job("short", duration=100), job("long", duration=300)]
ONE_THEN_TWO_GPUS = [1] * 10 + [2] * 10  # capacity that grows halfway through a 20-step window


@pytest.mark.parametrize(
    ("jobs", "capacity", "steps", "order", "want_gpu_s", "want_finish"),
    [
        pytest.param(
            [job("a", gpus=2)], [4] * 20, 20, "longest", 200.0, [100.0], id="a job runs at its GPU count, no faster"
        ),
        pytest.param([job("a", gpus=2)], [1] * 20, 20, "longest", 200.0, [200.0], id="and slower on less capacity"),
        pytest.param(
            [job("a", submit=15)],
            [1] * 20,
            20,
            "longest",
            100.0,
            [120.0],
            id="a job starts at the first step after its submit",
        ),
        pytest.param(
            SHORT_AND_LONG,
            [1] * 40,
            40,
            "shortest",
            400.0,
            [100.0, 400.0],
            id="shortest remaining first finishes the short job first (mean 250 s)",
        ),
        pytest.param(
            SHORT_AND_LONG,
            ONE_THEN_TWO_GPUS,
            20,
            "longest",
            300.0,
            [200.0, np.nan],
            id="longest first keeps both running when capacity grows: 300 GPU-s in the window",
        ),
        pytest.param(
            SHORT_AND_LONG,
            ONE_THEN_TWO_GPUS,
            20,
            "shortest",
            200.0,
            [100.0, np.nan],
            id="shortest first leaves the grown capacity idle: 200 GPU-s in the same window",
        ),
    ],
)
def test_fluid_schedule(jobs, capacity, steps, order, want_gpu_s, want_finish) -> None:
    run = fluid_schedule(jobs, lambda k: capacity[k], steps, 10.0, order)
    assert run.gpu_seconds == pytest.approx(want_gpu_s)
    np.testing.assert_allclose(run.finish, want_finish)


def test_fluid_util_counts_inference_and_the_work_training_can_do() -> None:
    # 10 steps of 10 s on 2 GPUs: inference holds 1, training has 1 for one 100-s job.
    util = fluid_util([job("a")], np.ones(10), np.ones(10), 2.0, 10.0)
    assert util == pytest.approx(1.0)


def test_fluid_jct_mean_runs_past_the_window_on_the_whole_pool() -> None:
    # No training capacity in the 10-step window, 1 GPU after it: the job ends 100 s after the window.
    assert fluid_jct_mean([job("a")], np.zeros(10), 1.0, 10.0, tail_steps=20) == pytest.approx(200.0)
    assert fluid_jct_mean([job("a")], np.zeros(10), 1.0, 10.0, tail_steps=5) is None


def test_replica_series_follows_the_policy_and_its_cap() -> None:
    spec = ServiceSpec("svc", "serving", "default", replica_qps=1.0, headroom=0.0, down_cooldown_s=0.0)
    loads = {0.0: 3.0, 60.0: 9.0, 120.0: 1.0}
    held = replica_series(spec, loads.get, np.array([0.0, 60.0, 120.0]), cap=5)
    np.testing.assert_array_equal(held, [3, 5, 1])
