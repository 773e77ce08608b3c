"""The tick's step durations as the instance keeps them for the exporter."""

from __future__ import annotations

import logging

import pytest
from dagster import instance_for_test

from xirang_platform.operations.tick_record import KEY, StepHistogram, read_histograms, record_steps


@pytest.mark.parametrize(
    ("seconds", "bucket"),
    [
        pytest.param(0.0, "0.001", id="zero falls in the first bucket"),
        pytest.param(0.001, "0.001", id="a bound is inside its bucket (le)"),
        pytest.param(0.0011, "0.0025", id="just past a bound goes to the next"),
        pytest.param(99.0, "+Inf", id="past the last bound only +Inf holds it"),
    ],
)
def test_a_duration_lands_in_the_first_bucket_whose_bound_holds_it(seconds: float, bucket: str) -> None:
    h = StepHistogram()
    h.observe(seconds)
    cumulative = dict(h.cumulative())
    first = next(le for le, n in h.cumulative() if n == 1)
    assert first == bucket
    assert cumulative["+Inf"] == 1
    assert h.sum_s == seconds


def test_ticks_add_up_across_instances_of_one_storage() -> None:
    with instance_for_test() as instance:
        record_steps(instance, {"read": 2.0, "plan": 30.0})
        record_steps(instance, {"read": 4.0})
        got = read_histograms(instance)
    assert sorted(got) == ["plan", "read"]
    assert (got["read"].count, got["read"].sum_s) == (2, pytest.approx(0.006))
    assert (got["plan"].count, got["plan"].sum_s) == (1, pytest.approx(0.03))


def test_durations_kept_with_other_bounds_are_started_again() -> None:
    with instance_for_test() as instance:
        instance.daemon_cursor_storage.set_cursor_values({KEY: '{"buckets": [1, 2], "steps": {"read": {}}}'})
        assert read_histograms(instance) == {}


class BrokenStorage:
    def get_cursor_values(self, keys: set[str]) -> dict[str, str]:
        raise OSError("disk gone")


class BrokenInstance:
    daemon_cursor_storage = BrokenStorage()


def test_a_storage_failure_is_logged_and_never_fails_the_tick(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="xirang.ops"):
        record_steps(BrokenInstance(), {"read": 1.0})
    assert "tick step durations not recorded" in caplog.text
    assert "disk gone" in caplog.text
