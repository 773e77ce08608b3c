"""The gate and the queue tags in Dagster's queue config: what holds a run in Dagster's own queue
daemon, and what its queue-criteria dialog lists (`dagster_defs/queue_criteria.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sensors import queue_tags
from sensors.scheduling_tick import run_tick
from tests.dagster.engine_harness import Engine, engine, request
from xirang_platform.control import run_tags as rt
from xirang_platform.dagster_defs.queue_criteria import KEY, gate_limits, queue_limits


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


def test_a_tick_between_estimates_keeps_the_last_estimated_start(e: Engine) -> None:
    e.submit("research", "gpu_job", request("inference", 8, project="llm"))
    second = e.submit("research", "gpu_job", request("inference", 8, project="llm"))
    e.tick()
    estimated = e.tag(second, rt.ESTIMATED_START)
    third = e.submit("research", "gpu_job", request("inference", 8, project="llm"))

    report = run_tick(e.instance, e.gpu_pool, estimate=False)

    assert report.estimate_s is None
    assert (e.tag(second, rt.ESTIMATED_START), e.tag(second, rt.POSITION)) == (estimated, "#1 in inference")
    # a run held since the last estimate gets its place now and its estimate with the next one
    assert (e.tag(third, rt.POSITION), e.tag(third, rt.ESTIMATED_START)) == ("#2 in inference", None)
    assert e.tick().estimate_s is not None
    assert e.tag(third, rt.ESTIMATED_START) is not None


@pytest.mark.parametrize(
    ("took_s", "after_s", "due"),
    [
        pytest.param(0.02, 5.0, True, id="a small queue's estimate is made every tick"),
        pytest.param(6.0, 5.0, False, id="a 6 s estimate is not made again at the next tick"),
        pytest.param(6.0, 60.0, True, id="a 6 s estimate is made again after ten times its time"),
    ],
)
def test_the_estimate_takes_at_most_a_tenth_of_the_ticks_time(took_s: float, after_s: float, due: bool) -> None:
    assert queue_tags.estimate_due(100.0, took_s, 100.0 + after_s) is due


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
