"""Sensor cadence under Dagster's 5 s sensor loop (`sensors/cadence.py`): a sensor is due one second
before its interval is over, so the loop iteration that comes a moment short of it does not skip it."""

from __future__ import annotations

import pytest

from sensors.autoscaling import build_autoscaling_sensor
from sensors.cadence import SENSOR_LOOP_S, minimum_interval
from sensors.release import build_release_sensors
from sensors.scheduling_tick import build_scheduling_tick


@pytest.mark.parametrize(("every_s", "minimum"), [(1, 1), (2, 1), (5, 4), (60, 59)])
def test_a_sensor_is_due_one_second_before_its_interval(every_s: int, minimum: int) -> None:
    assert minimum_interval(every_s) == minimum


def test_the_5_s_tick_and_the_release_sensors_are_due_at_every_iteration_of_the_loop() -> None:
    sensors = [build_scheduling_tick(5), *build_release_sensors()]
    assert [s.minimum_interval_seconds < SENSOR_LOOP_S for s in sensors] == [True] * 4


def test_the_autoscaling_sensor_is_due_before_its_interval_is_over() -> None:
    sensor = build_autoscaling_sensor("product", services=[], interval_s=30)
    assert sensor.minimum_interval_seconds == 29
