"""Victims chosen by the work since their reported checkpoints, through the real tick: a run reports a
checkpoint with `GpuPoolResource.checkpointed`, an asset it materializes counts as one, the ledger
keeps the last one per allocation, and the tick's snapshot reads it (`Allocation.checkpointed_at`).

Pool (tests/dagster/pool.yaml): two 8-GPU H100 servers and one 4 x L40S server. research's P2 run
`whole` takes one H100 server; research's `left` and product's `right` (P2, 4 GPUs each) share the
other. A product inference replica then needs 4 H100 GPUs: either half is a victim of the same size
and age, so the one that saved its work more recently is chosen.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from dagster import AssetKey, AssetMaterialization, DagsterEvent, DagsterEventType

from tests.dagster.engine_harness import Engine, engine, request
from xirang_platform.control import run_tags as rt
from xirang_platform.dagster_compat import StepMaterializationData

H100 = {"gpu_model": "H100-SXM"}
LATER_S = 100.0  # the preempting tick runs this long after the admitting one


@pytest.fixture
def e(tmp_path: Path) -> Iterator[Engine]:
    with engine(tmp_path, "sqlite") as platform:
        yield platform


def materialized(e: Engine, run_id: str) -> None:
    """Record that run `run_id` materialized an asset, as its step would."""
    run = e.run(run_id)
    event = DagsterEvent(
        event_type_value=DagsterEventType.ASSET_MATERIALIZATION.value,
        job_name=run.job_name,
        event_specific_data=StepMaterializationData(AssetMaterialization(AssetKey("prep"))),
    )
    e.instance.report_dagster_event(event, run_id)


def reported(e: Engine, run_id: str) -> None:
    """The run reports a saved checkpoint through the pool resource."""
    e.gpu_pool.checkpointed(e.run(run_id), step=3)


Report = Callable[[Engine, str], None]


@pytest.mark.parametrize(
    ("reports", "want_victim"),
    [
        pytest.param(
            [("left", reported)], "left", id="the half that reported a checkpoint is chosen over one that did not"
        ),
        pytest.param(
            [("right", reported)], "right", id="whichever half reported one: the order follows the report, not the id"
        ),
        pytest.param(
            [("left", reported), ("right", materialized)],
            "right",
            id="a materialized asset counts as a checkpoint, and the later one wins",
        ),
        pytest.param(
            [("right", materialized), ("left", reported)],
            "left",
            id="a reported checkpoint after the other's materialization wins",
        ),
    ],
)
def test_the_victim_is_the_run_that_checkpointed_most_recently(
    e: Engine, reports: list[tuple[str, Report]], want_victim: str
) -> None:
    start = time.time()
    runs = {
        "whole": e.submit("research", "gpu_job", request("offline-training", 8, project="llm", **H100)),
        "left": e.submit("research", "gpu_job", request("offline-training", 4, project="llm", **H100)),
        "right": e.submit("product", "gpu_job", request("offline-training", 4, **H100)),
    }
    assert sorted(e.tick(start).admitted) == sorted(runs.values())
    nodes = {a.id: {s.node for s in a.placement.slices} for a in e.ledger.allocations()}
    assert nodes[runs["left"]] == nodes[runs["right"]] != nodes[runs["whole"]]
    for name, report in reports:
        report(e, runs[name])
        time.sleep(0.01)  # each report strictly later than the one before
    serving = e.submit("product", "gpu_job", request("inference", 4, **H100))

    result = e.tick(start + LATER_S)

    assert result.admitted == [serving]
    assert result.preempted == [runs[want_victim]]
    assert e.tag(runs[want_victim], rt.PREEMPTED_BY) == f"preempted by run {serving} (priority)"


def test_a_checkpoint_report_is_recorded_on_the_runs_allocation(e: Engine) -> None:
    run_id = e.submit("research", "gpu_job", request("offline-training", 4, project="llm"))
    e.tick()
    before = time.time()
    e.gpu_pool.checkpointed(e.run(run_id), step=7)
    (held,) = e.ledger.allocations()
    assert held.checkpointed_at is not None
    assert before <= held.checkpointed_at <= time.time()


def test_a_run_without_an_allocation_reports_checkpoints_harmlessly(e: Engine) -> None:
    run_id = e.submit("research", "gpu_job", {})
    assert e.tag(run_id, rt.GATE) == rt.GATE_NONE
    e.gpu_pool.checkpointed(e.run(run_id), step=1)
    assert e.ledger.allocations() == []
