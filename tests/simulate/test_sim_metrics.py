"""Metrics from a hand-made event log, with the arithmetic written beside each expected value."""

from __future__ import annotations

import pytest

from tests.simulate.sim_builders import TWO_GPU_LOG, submit
from xirang_platform.simulate.metrics import allocated_series, compute_metrics, gpu_seconds, queue_series


def test_metrics_of_a_hand_made_log() -> None:
    m = compute_metrics(TWO_GPU_LOG, capacity_gpus=2)
    # GPU-seconds: 0-10 1 GPU (10) + 10-30 2 (40) + 30-40 1.5 (15) + 40-60 1.5 (30) + 60-80 1.5 (30)
    #              + 80-100 1 (20) = 145, over 2 GPUs x 100 s.
    assert m["allocated_gpu_seconds"] == pytest.approx(145.0)
    assert m["utilization"] == pytest.approx(145.0 / 200.0)
    # Inference waits 0 (a) and 10 (d): p99 by linear interpolation = 0 + 0.99 x 10.
    assert m["inference_wait_p99_s"] == pytest.approx(9.9)
    # Training waits: b 10 - 0, c 30 - 20; JCTs: b 100 - 0, c 60 - 20.
    assert m["training_wait_mean_s"] == pytest.approx(10.0)
    assert m["training_jct_mean_s"] == pytest.approx(70.0)
    assert {
        k: m[k]
        for k in (
            "preemptions",
            "lost_gpu_seconds",
            "jobs_finished",
            "jobs_rejected",
            "jobs_unfinished",
            "jobs_submitted",
            "returns",
            "span_s",
        )
    } == {
        "preemptions": 1,
        "lost_gpu_seconds": 20.0,
        "jobs_finished": 4,
        "jobs_rejected": 1,
        "jobs_unfinished": 0,
        "jobs_submitted": 5,
        "returns": 0,
        "span_s": 100.0,
    }
    assert m["tiers"] == {
        "inference": {"submitted": 3, "finished": 2, "rejected": 1, "preempted": 0, "wait_mean_s": 5.0},
        "offline-training": {"submitted": 2, "finished": 2, "rejected": 0, "preempted": 1, "wait_mean_s": 10.0},
    }


def test_series_are_step_functions_with_one_point_per_instant() -> None:
    times, milli = allocated_series(TWO_GPU_LOG)
    assert times.tolist() == [0, 10, 30, 40, 60, 80, 100]
    assert milli.tolist() == [1000, 2000, 1500, 1500, 1500, 1000, 0]
    qt, queued = queue_series(TWO_GPU_LOG)
    # t0: +a +b -a; t10: -b; t20: +c; t30: +b -c; t40: -b; t50: +d; t60: -d; t90: +e -e.
    assert list(zip(qt.tolist(), queued.tolist(), strict=True)) == [
        (0, 1),
        (10, 0),
        (20, 1),
        (30, 1),
        (40, 0),
        (50, 1),
        (60, 0),
        (90, 0),
    ]
    assert gpu_seconds(times, milli, end=100) == pytest.approx(145.0)


def test_an_empty_or_unfinished_log_has_null_averages() -> None:
    assert compute_metrics([], capacity_gpus=2)["utilization"] == 0.0
    m = compute_metrics([submit(0, "a"), submit(5, "b", tier="inference")], capacity_gpus=2)
    assert (m["inference_wait_p99_s"], m["training_wait_mean_s"], m["training_jct_mean_s"], m["jobs_unfinished"]) == (
        None,
        None,
        None,
        2,
    )
