"""How `--eta-every` scores the estimate (`simulate/eta_score.py`): the declared-ends baseline and the
errors against the starts that happened."""

from __future__ import annotations

import pytest

from tests.scheduling.cycle_builders import job, running
from xirang_platform.simulate.eta_score import EtaSample, declared_ends, eta_metrics

NOW = 100.0


@pytest.mark.parametrize(
    ("asks", "idle", "ends", "want"),
    [
        pytest.param([2], 2, [200.0], [NOW], id="the idle GPUs cover the head: now"),
        pytest.param([2, 2], 2, [200.0], [NOW, 200.0], id="the next needs the first end"),
        pytest.param([2, 4], 2, [200.0, None], [NOW, None], id="the ends known never cover it: unknown"),
        pytest.param([2], 0, [50.0], [NOW], id="an end already past counts as now"),
    ],
)
def test_declared_ends_counts_freed_gpus_in_queue_order(
    asks: list[int], idle: int, ends: list[float | None], want: list[float | None]
) -> None:
    order = [job(f"w{i}").gpus(g).build() for i, g in enumerate(asks)]
    runs = [(running(job(f"k{i}").gpus(2), {"n0": [2 * i, 2 * i + 1]}), end) for i, end in enumerate(ends)]
    assert declared_ends(order, runs, idle * 1000, NOW) == want


def test_each_sample_is_scored_against_the_jobs_next_admission() -> None:
    samples = [
        EtaSample("a", 0.0, 100.0, 50.0),  # admitted at 100 (its admission at 0 came before: not this start)
        EtaSample("a", 150.0, 160.0, 150.0),  # re-admitted at 200 after a preemption
        EtaSample("b", 0.0, None, 300.0),  # started at 300; the forward estimate said unknown
        EtaSample("c", 0.0, 10.0, 10.0),  # never started: left out
    ]
    events = [
        {"event": "admit", "job": "a", "t": 100.0},
        {"event": "admit", "job": "a", "t": 200.0},
        {"event": "admit", "job": "b", "t": 300.0},
    ]
    got = eta_metrics(samples, events, 50.0)
    assert (got["samples"], got["never_started"], got["unknown"]) == (3, 1, 1)
    assert (got["median_abs_error_s"], got["p90_abs_error_s"]) == (20.0, 36.0)  # errors 0 and 40
    forward = {"median_abs_error_s": 20.0, "p90_abs_error_s": 36.0}
    assert got["starts_now"] == {"median_abs_error_s": 75.0, "p90_abs_error_s": 95.0, "unknown": 0, "forward": forward}
    assert got["declared_ends"] == {
        "median_abs_error_s": 50.0,
        "p90_abs_error_s": 50.0,
        "unknown": 0,
        "forward": forward,
    }


def test_a_baseline_is_compared_on_the_samples_it_dates() -> None:
    samples = [EtaSample("a", 0.0, 100.0, None), EtaSample("b", 0.0, 210.0, 200.0)]
    events = [{"event": "admit", "job": "a", "t": 100.0}, {"event": "admit", "job": "b", "t": 200.0}]
    got = eta_metrics(samples, events, 50.0)["declared_ends"]
    assert got == {
        "median_abs_error_s": 0.0,
        "p90_abs_error_s": 0.0,
        "unknown": 1,
        "forward": {"median_abs_error_s": 10.0, "p90_abs_error_s": 10.0},
    }
