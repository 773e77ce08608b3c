"""Which ended runs the resumption sensors requeue (`sensors/resume.pending_victims`): preempted runs
still pending, and only those the ledger recorded as preempted; and what a resumption carries (its
parent's run config, the lineage the ledger recorded)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dagster import AssetKey, DagsterRunStatus, RunsFilter, instance_for_test

from sensors.resume import pending_victims
from tests.dagster.engine_harness import Engine, engine
from xirang_platform.control import run_tags as rt
from xirang_platform.dagster_compat import create_run_for_test
from xirang_platform.dagster_defs.coordinator import planned_assets
from xirang_platform.ledger.ledger import Ledger
from xirang_platform.scheduling.model import Allocation, GpuSlice, NodeShare, Placement, Request, Tier

PENDING = {rt.RESUME: rt.RESUME_PENDING, rt.PREEMPTED_BY: "priority: inference replica"}


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.sqlite")
    ledger.add_tenant("research", 12_000)
    ledger.add_project("research", "llm")
    yield ledger
    ledger.close()


def preempted_in(ledger: Ledger, run_id: str) -> None:
    """Reserve one GPU for `run_id` and preempt it, as a tick does."""
    request = Request(run_id, "research", "llm", Tier.OFFLINE_TRAINING, 10.0, gpus=1)
    placement = Placement((GpuSlice("h100-00", 0, 1000, 0),), (NodeShare("h100-00", 1000, 1024),))
    ledger.reserve(Allocation(request, placement, 10.0, confirmed=False))
    ledger.preempt(run_id, "inference-run", "priority")


@pytest.mark.parametrize(
    ("status", "tags", "recorded", "requeued"),
    [
        pytest.param(DagsterRunStatus.CANCELED, PENDING, True, True, id="victim canceled while running"),
        pytest.param(
            DagsterRunStatus.FAILURE, PENDING, True, True, id="victim failed while being stopped as it started"
        ),
        pytest.param(DagsterRunStatus.FAILURE, {}, True, False, id="a run that failed on its own is not a victim"),
        pytest.param(DagsterRunStatus.CANCELED, {}, False, False, id="a run a user canceled is not a victim"),
        pytest.param(
            DagsterRunStatus.CANCELED,
            {**PENDING, rt.RESUME: rt.RESUME_REQUESTED},
            True,
            False,
            id="a victim whose resumption exists",
        ),
        pytest.param(
            DagsterRunStatus.CANCELED,
            PENDING,
            False,
            False,
            id="a run tagged pending that the ledger never preempted is not a victim",
        ),
    ],
)
def test_only_preempted_runs_still_pending_are_requeued(
    ledger: Ledger, status: DagsterRunStatus, tags: dict, recorded: bool, requeued: bool
) -> None:
    with instance_for_test() as instance:
        run = create_run_for_test(instance, job_name="gpu_job", status=status, tags=tags)
        if recorded:
            preempted_in(ledger, run.run_id)
        found = [r.run_id for r in pending_victims(instance, None, ledger.engine)]
        assert found == ([run.run_id] if requeued else [])


# -- a resumption end to end, in process: the real coordinator, sensor daemon iteration and tick -------

SWEEP = {"ops": {"prep": {"config": {"rows": 5}}, "train": {"config": {"epochs": 60}}}}


def preempt_as_the_tick_does(e: Engine, run_id: str) -> None:
    """The ledger's preemption and the victim's tags, as the tick writes them when it stops a victim."""
    e.ledger.preempt(run_id, "inference-run", "priority")
    e.instance.add_run_tags(
        run_id, {rt.PREEMPTED_BY: "preempted by run inference-run (priority)", rt.RESUME: rt.RESUME_PENDING}
    )


def resumptions_of(e: Engine, victim: str) -> list[Any]:
    """Evaluate the sensors as the daemon does; the runs accepted as `victim`'s resumption."""
    e.sensors()
    return e.instance.get_runs(RunsFilter(tags={rt.PARENT_RUN: victim}))


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_an_asset_run_resumes_with_its_run_config_for_the_remaining_assets(tmp_path: Path, backend: str) -> None:
    with engine(tmp_path, backend) as e:
        victim = e.submit("research", "train_job", {"test/outcome": "fail"}, run_config=SWEEP)
        assert e.tick().admitted == [victim]
        e.dequeue()  # prep materializes, train fails: as if stopped while training
        assert e.status(victim) == DagsterRunStatus.FAILURE
        preempt_as_the_tick_does(e, victim)

        e.wait_for("the resume sensor's run request", lambda: len(resumptions_of(e, victim)) == 1)
        [resumption] = resumptions_of(e, victim)

        # Dagster refuses config for ops outside a selection: only train's is carried, as the sweep gave it.
        assert resumption.run_config == {"ops": {"train": {"config": {"epochs": 60}}}}
        assert planned_assets(e.instance, resumption) == {AssetKey("train")}
        # What it inherits comes from the ledger's record of the preemption.
        assert resumption.tags[rt.PREEMPTED] == "1"
        assert resumption.tags[rt.SUBMIT_TIME] == e.tag(victim, rt.SUBMIT_TIME)
        assert e.tag(victim, rt.RESUME) == rt.RESUME_REQUESTED
        e.tick()  # the sensor iteration's own tick may have admitted it already
        assert e.tag(resumption.run_id, rt.GATE) == rt.GATE_OPEN
        assert e.held() == {resumption.run_id}
        e.dequeue()
        assert e.status(resumption.run_id) == DagsterRunStatus.SUCCESS
        assert "train epochs=60" in e.messages(resumption.run_id)
