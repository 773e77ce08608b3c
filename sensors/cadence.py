"""How often the platform's sensors run under Dagster's sensor daemon.

The daemon evaluates sensors once per loop iteration, and starts an iteration every 5 s
(`dagster._daemon.sensor.MIN_INTERVAL_LOOP_TIME`); a sensor runs in an iteration when its
`minimum_interval_seconds` have passed since its last tick. That tick's timestamp is taken a moment
after its iteration started, so with a minimum interval equal to the loop's period the next
iteration finds a little less than that elapsed and skips it: the sensor runs every other iteration.
Hence one second of slack (figure: docs/design-notes.md, record D4).
"""

from __future__ import annotations

SENSOR_LOOP_S = 5  # Dagster's sensor daemon loop period (MIN_INTERVAL_LOOP_TIME)


def minimum_interval(every_s: int) -> int:
    """The `minimum_interval_seconds` of a sensor meant to run every `every_s` seconds: one second of
    slack, so that it runs in the first daemon iteration after its interval is (nearly) over."""
    return max(1, every_s - 1)
