"""What Dagster's queue-criteria dialog says of a held run (DESIGN.md sections 7 and 10).

Dagster shows no events for a queued run. Its page and the runs list offer "View queue criteria": a
dialog listing the run's priority and every tag concurrency limit whose key and value match a tag
of the run, each with its limit. The coordinator's queue config (`get_run_queue_config`, read by the
queue daemon every dequeue iteration and by the webserver for that dialog) holds one limit-0 entry
per closed value of `xirang/gate` (`run_tags.CLOSED_GATES`, a fixed vocabulary: the hold kinds), so
the dialog shows `xirang/gate="capacity"` and the daemon keeps every closed value queued; `open` is
in no entry and launches. The list is fixed: a value the daemon had not read yet could launch.
"""

from __future__ import annotations

from typing import Any

from xirang_platform.platform import run_tags as rt


def gate_limits() -> list[dict[str, Any]]:
    """A limit of 0 for every closed gate value: Dagster's queue daemon never launches a run behind one."""
    return [{"key": rt.GATE, "value": value, "limit": 0} for value in rt.CLOSED_GATES]
