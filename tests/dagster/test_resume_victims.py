"""Which ended runs the resumption sensors requeue (`sensors/resume.pending_victims`)."""

from __future__ import annotations

import pytest
from dagster import DagsterRunStatus
from dagster._core.test_utils import create_run_for_test, instance_for_test

from sensors.resume import pending_victims
from xirang_platform import run_tags as rt

PENDING = {rt.RESUME: rt.RESUME_PENDING, rt.PREEMPTED_BY: "priority: inference replica"}


@pytest.mark.parametrize(
    ("status", "tags", "requeued"),
    [
        pytest.param(DagsterRunStatus.CANCELED, PENDING, True, id="victim canceled while running"),
        pytest.param(DagsterRunStatus.FAILURE, PENDING, True, id="victim failed while being stopped as it started"),
        pytest.param(DagsterRunStatus.FAILURE, {}, False, id="a run that failed on its own is not a victim"),
        pytest.param(DagsterRunStatus.CANCELED, {}, False, id="a run a user canceled is not a victim"),
        pytest.param(
            DagsterRunStatus.CANCELED,
            {**PENDING, rt.RESUME: rt.RESUME_REQUESTED},
            False,
            id="a victim whose resumption exists",
        ),
    ],
)
def test_only_preempted_runs_still_pending_are_requeued(status: DagsterRunStatus, tags: dict, requeued: bool) -> None:
    with instance_for_test() as instance:
        run = create_run_for_test(instance, job_name="gpu_job", status=status, tags=tags)
        found = [r.run_id for r in pending_victims(instance, None)]
        assert found == ([run.run_id] if requeued else [])
