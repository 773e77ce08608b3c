"""The tick carries out an elastic run's resize (DESIGN.md section 11) with the real coordinator,
sensor daemon iteration, queue daemon and tick: the run ends on its notice, its resumption takes over
the allocation of the new size (its gate opens with the new devices) and its tags show the size
history; a shrink and then a grow, each resumed from the run before it. The resizes are decided by
hand (`resize_helpers.resize`), applied through the tick's own ledger write and run step."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from dagster import DagsterRunStatus, RunsFilter

from tests.dagster.engine_harness import Engine, engine, request
from tests.dagster.resize_helpers import resize
from xirang_platform.control import run_tags as rt
from xirang_platform.control.notice import read_notice
from xirang_platform.control.run_allocation import read_allocation_tag
from xirang_platform.launch.local import CUDA_VISIBLE_DEVICES
from xirang_platform.scheduling.model import ResizeKind

ELASTIC = request("offline-training", project="llm", gpus_min="4", gpus_max="8")


def resumption_of(e: Engine, parent: str) -> str:
    """The run the sensors submitted (and the coordinator accepted) as `parent`'s resumption."""
    e.wait_for(
        f"the resumption of {parent}",
        lambda: (e.sensors(), e.instance.get_runs(RunsFilter(tags={rt.PARENT_RUN: parent})))[1] != [],
    )
    [run] = e.instance.get_runs(RunsFilter(tags={rt.PARENT_RUN: parent}))
    return run.run_id


def gpus_and_devices(e: Engine, run_id: str) -> tuple[int, str]:
    """The GPU count of the run's `xirang/allocation` and the devices its environment names."""
    allocation = read_allocation_tag(e.tag(run_id, rt.ALLOCATION))
    assert allocation is not None
    env = e.tag(run_id, rt.ENV) or ""
    return allocation.gpu_count, env.split(f'"{CUDA_VISIBLE_DEVICES}": "', 1)[1].split('"', 1)[0]


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_shrink_then_a_grow_end_the_run_on_its_notice_and_resume_it_at_the_new_size(
    tmp_path: Path, backend: str
) -> None:
    with engine(tmp_path, backend) as e:
        first = e.submit("research", "gpu_job", ELASTIC | {"test/outcome": "fail"})
        assert e.tick().admitted == [first]
        e.dequeue()  # it runs at 8 GPUs and stops, as a run stopping on a notice would
        assert gpus_and_devices(e, first) == (8, "0,1,2,3,4,5,6,7")

        # Shrink to 4: the notice, the new size held for its resumption while the run is gone.
        now = time.time()
        assert resize(e, first, 4, ResizeKind.SHRINK, now).resized == [first]
        notice = read_notice(e.run(first).tags)
        assert notice is not None
        assert (notice.reason, notice.at) == ("resize-shrink", now)
        assert e.tag(first, rt.SIZE_HISTORY) == "8,4"
        assert e.tag(first, rt.RESUME) == rt.RESUME_PENDING
        assert any("resize notice: resized from 8 to 4 GPUs (shrink)" in m for m in e.messages(first))
        e.tick()
        assert e.held() == {first}  # reconcile keeps the new size for the resumption
        assert e.release_sensors(first)
        assert e.held() == {first}  # and so does the release sensor

        second = resumption_of(e, first)
        assert e.held() == {second}  # the claim handed the allocation over
        assert e.tag(second, rt.SIZE_HISTORY) == "8,4"
        assert e.tag(first, rt.RESUME) == rt.RESUME_REQUESTED
        e.tick()
        assert e.tag(second, rt.GATE) == rt.GATE_OPEN
        assert gpus_and_devices(e, second) == (4, "0,1,2,3")

        # Grow back to 8 before it launched: it is cancelled from the queue, its resumption gets 8.
        assert resize(e, second, 8, ResizeKind.GROW, time.time()).resized == [second]
        e.wait_for("the resized run to end", lambda: e.status(second) == DagsterRunStatus.CANCELED)
        third = resumption_of(e, second)
        e.tick()
        assert e.tag(third, rt.GATE) == rt.GATE_OPEN
        assert e.tag(third, rt.SIZE_HISTORY) == "8,4,8"
        assert gpus_and_devices(e, third) == (8, "0,1,2,3,4,5,6,7")
        assert e.tag(third, rt.SUBMIT_TIME) == e.tag(first, rt.SUBMIT_TIME)  # one lineage, one place in line
        e.dequeue()
        assert e.status(third) == DagsterRunStatus.SUCCESS
        [seen] = [m for m in e.messages(third) if m.startswith("allocation: ")]  # what its op was given
        assert f"request='{third}'" in seen
        assert "milli=8000" in seen
        e.release_sensors(third)
        assert e.held() == set()

        resizes = e.ledger.entries(tenant="research", kind="resize")
        changes = {(x.details["old_gpus"], x.details["new_gpus"], x.cause) for x in resizes}
        assert changes == {(8, 4, "shrink"), (4, 8, "grow")}
        assert e.ledger.rebuild(e.gpu_pool.pool()).ok
