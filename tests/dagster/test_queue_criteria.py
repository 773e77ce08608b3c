"""The gate in Dagster's queue config: what holds a run in Dagster's own queue daemon
(`dagster_defs/queue_criteria.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_harness import Engine, engine, request

from xirang_platform.platform import run_tags as rt


@pytest.fixture
def e(tmp_path: Path) -> Iterator[Engine]:
    with engine(tmp_path, "sqlite") as platform:
        yield platform


@pytest.mark.parametrize(
    ("gate", "launched"),
    [
        *[
            pytest.param(value, False, id=f"gate {value}: Dagster's daemon keeps it queued")
            for value in rt.CLOSED_GATES
        ],
        pytest.param(rt.GATE_OPEN, True, id="gate open: the daemon launches it"),
    ],
)
def test_every_closed_gate_value_keeps_a_run_in_dagsters_queue(e: Engine, gate: str, launched: bool) -> None:
    run = e.submit("research", "gpu_job", request("offline-training", 1, project="llm"))
    e.instance.add_run_tags(run, {rt.GATE: gate})

    e.dequeue()

    assert (run in e.launched()) is launched
