"""Preemption and resumption end to end with real processes: each code location in its own gRPC
code server, every run a process of its own (Dagster's `DefaultRunLauncher`), the victim terminated
while it runs, its resumption submitted by the real sensor daemon; once on SQLite and once on
dagster-postgres.

Pool and quotas as in `test_engine.py`: 16 H100 GPUs (two 8-GPU servers) and 4 L40S; research
12 GPUs (cap 14.4), product 8.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterEventType, DagsterRunStatus, RunsFilter

from sensors.resume import materialized_assets
from tests.dagster.engine_harness import PLATFORM, Engine, engine, request
from xirang_platform.control import run_tags as rt
from xirang_platform.dagster_defs.coordinator import planned_assets
from xirang_platform.ledger.preemptions import preemption_records

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
WAIT = {"test/outcome": "wait"}
LONG_BACKOFF = PLATFORM | {"scheduler": {"min_runtime_s": 0, "reclaim_backoff_s": 7200}}


def step_started(e: Engine, run_id: str, step: str) -> bool:
    return any(
        x.dagster_event is not None and x.dagster_event.step_key == step
        for x in e.instance.all_logs(run_id, of_type=DagsterEventType.STEP_START)
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_inference_preempts_borrowed_training_which_resumes_with_only_its_remaining_assets(
    tmp_path: Path, backend: str
) -> None:
    with engine(tmp_path, backend, LONG_BACKOFF, processes=True) as e:
        e.sensors()  # first sensor evaluations: the run-status sensors start watching from here
        # Two 8-GPU runs of research fill the H100s: online training in quota (never preempted), then
        # the asset job's offline training, borrowed past research's cap of 14.4 GPUs.
        in_quota = e.submit("research", "gpu_job", request("online-training", 8, project="llm") | WAIT)
        borrowed = e.submit("research", "train_job", WAIT)
        assert e.tick().admitted == [in_quota, borrowed]
        shares = {a.id: a.borrowed for a in e.ledger.allocations()}
        assert shares == {in_quota: False, borrowed: True}
        e.dequeue()
        e.wait_for("online training to start", lambda: step_started(e, in_quota, "work"))
        e.wait_for("offline training to train", lambda: step_started(e, borrowed, "train"))
        assert materialized_assets(e.instance, borrowed) == {AssetKey("prep")}

        # A product inference replica needs a whole H100 server: the borrowed run is the victim.
        serving = e.submit("product", "gpu_job", request("inference", 8, gpu_model="H100-SXM") | WAIT)
        report = e.tick()

        assert report.preempted == [borrowed]
        assert report.admitted == [serving]
        # research borrowed from the pool and product is under its cap: product reclaims it.
        assert e.tag(borrowed, rt.PREEMPTED_BY) == f"preempted by run {serving} (reclaim)"
        assert report.waiting == [serving]  # its units reserved, it launches once the victim stopped
        e.wait_for("the victim to stop", lambda: e.status(borrowed) == DagsterRunStatus.CANCELED)
        assert [x.request_id for x in e.ledger.entries(kind="preempt") if "/" not in x.account] == [borrowed]
        e.tick()
        assert e.tag(serving, rt.GATE) == rt.GATE_OPEN
        e.dequeue()
        e.wait_for("serving to start", lambda: e.status(serving) == DagsterRunStatus.STARTED)

        # The research location's resume sensor requests the assets the victim had not materialized. The
        # daemon evaluates it once its minimum interval has passed since the first evaluation above (a
        # fast run gets here sooner): evaluate as the daemon's loop does until it has run.
        def resumptions() -> list:
            e.sensors()
            return e.instance.get_runs(RunsFilter(tags={rt.PARENT_RUN: borrowed}))

        e.wait_for("the resume sensor's run request", lambda: len(resumptions()) > 0)
        resumed = e.instance.get_runs(RunsFilter(tags={rt.PARENT_RUN: borrowed}))
        assert len(resumed) == 1
        resumption = resumed[0]
        assert resumption.tags[rt.PREEMPTED] == "1"
        assert resumption.tags[rt.SUBMIT_TIME] == e.tag(borrowed, rt.SUBMIT_TIME)
        assert planned_assets(e.instance, resumption) == {AssetKey("train")}
        e.tick()
        assert e.tag(resumption.run_id, rt.GATE) == "quota"
        # It carries its reclaim, so it may borrow again only after its back-off (2 h here), or sooner out
        # of other tenants' quota that has stayed idle 30 minutes (`lend_after_s`).
        assert resumption.tags[rt.RECLAIMS] == "1"
        # From the ledger's record of the reclaim (when it took the units back), not from a tag.
        record = preemption_records(e.ledger.engine, [borrowed])[borrowed]
        assert resumption.tags[rt.RECLAIMED_AT] == repr(record.at)
        assert "so it may borrow again from" in e.tag(resumption.run_id, rt.HOLD_REASON)

        # Serving ends and releases its server: product's quota is idle, but not yet for 30 minutes; once it
        # has been, the resumption borrows it (long before its back-off ends) and trains to the end.
        e.finish(serving)
        e.wait_for("serving to end", lambda: e.status(serving) == DagsterRunStatus.SUCCESS)
        assert e.release_sensors(serving) == ["xirang_release_on_success"]
        assert e.tick().admitted == []
        assert "so it may borrow again from" in e.tag(resumption.run_id, rt.HOLD_REASON)
        assert e.tick(time.time() + 1800).admitted == [resumption.run_id]
        e.dequeue()
        e.finish(resumption.run_id)
        e.finish(in_quota)
        e.wait_for("the resumption to end", lambda: e.status(resumption.run_id) == DagsterRunStatus.SUCCESS)
        e.wait_for("training to end", lambda: e.status(in_quota) == DagsterRunStatus.SUCCESS)
        assert materialized_assets(e.instance, resumption.run_id) == {AssetKey("train")}
