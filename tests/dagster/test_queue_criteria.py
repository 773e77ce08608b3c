"""The gate and the queue tags in Dagster's queue config: what holds a run in Dagster's own queue
daemon, and what its queue-criteria dialog lists (`dagster_defs/queue_criteria.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sensors import queue_tags
from tests.dagster.engine_harness import Engine, engine, request
from xirang_platform.dagster_defs.queue_criteria import KEY, gate_limits, queue_limits
from xirang_platform.platform import run_tags as rt


@pytest.fixture
def e(tmp_path: Path) -> Iterator[Engine]:
    with engine(tmp_path, "sqlite") as platform:
        yield platform


def limits(e: Engine) -> list[dict]:
    """The tag concurrency limits as Dagster's daemon and webserver read them."""
    return list(e.instance.get_concurrency_config().run_queue_config.tag_concurrency_limits)


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


def test_a_held_run_is_explained_only_while_it_waits(e: Engine) -> None:
    # research's cap is 14.4 GPUs: the second 8-GPU inference replica waits for quota.
    first = e.submit("research", "gpu_job", request("inference", 8, project="llm"))
    second = e.submit("research", "gpu_job", request("inference", 8, project="llm"))
    e.tick()
    held = {key: e.tag(second, key) or "" for key in (rt.HOLD_REASON, rt.POSITION, rt.ESTIMATED_START)}
    assert held[rt.POSITION] == "#1 in inference"
    assert [{"key": k, "value": v, "limit": 0} for k, v in held.items()] == limits(e)[len(gate_limits()) :]

    e.dequeue()
    e.release_sensors(first)
    assert e.tick().admitted == [second]

    assert [e.tag(second, key) for key in held] == ["", "", ""]  # blanked with the gate's opening
    assert limits(e) == gate_limits()  # nothing waits: nothing to explain
    e.dequeue()
    assert e.launched()[-1] == second


def test_only_the_first_runs_of_each_tier_are_explained(e: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_tags, "EXPLAINED_PER_TIER", 1)
    e.submit("research", "gpu_job", request("inference", 8, project="llm"))
    waiting = [e.submit("research", "gpu_job", request("inference", 8, project="llm")) for _ in range(2)]
    e.tick()

    assert [e.tag(r, rt.POSITION) for r in waiting] == ["#1 in inference", "#2 in inference"]  # both tagged
    listed = [x["value"] for x in limits(e) if x["key"] == rt.POSITION]
    assert listed == ["#1 in inference"]  # only the first explained in the dialog


@pytest.mark.parametrize(
    "stored",
    [
        pytest.param("not json", id="not JSON"),
        pytest.param('["a list"]', id="JSON of another shape"),
    ],
)
def test_an_unreadable_record_leaves_the_gates_and_the_daemon_working(e: Engine, stored: str) -> None:
    e.instance.daemon_cursor_storage.set_cursor_values({KEY: stored})
    run = e.submit("research", "gpu_job", request("offline-training", 1, project="llm"))

    assert queue_limits(e.instance) == []
    assert limits(e) == gate_limits()
    e.dequeue()  # the daemon's iteration reads the config: it must not fail for want of an explanation
    assert e.launched() == []
    e.tick()
    e.dequeue()
    assert e.launched() == [run]
