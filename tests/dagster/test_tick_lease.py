"""One scheduling tick writes at a time, a dry run writes nothing, and one request the ledger
refuses never fails the tick (issue 20, items 1 and 5; DESIGN.md sections 6 and 7). Once on SQLite
and once on dagster-postgres with the ledger on PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from dagster import DagsterRunStatus
from dagster_graphql.test.utils import execute_dagster_graphql

from sensors.scheduling_tick import DRY_RUN, TICK_SENSOR_NAME
from tests.control.platform_builders import two_tenants
from tests.dagster.engine_harness import DRY_RUN_MUTATION, Engine, engine, request
from xirang_platform.control import run_tags as rt
from xirang_platform.control.accounts import sync_accounts
from xirang_platform.control.tick_ledger import write_ledger
from xirang_platform.control.tick_plan import GatedRun, plan_tick
from xirang_platform.dagster_defs.coordinator import request_run_tags
from xirang_platform.ledger import Ledger
from xirang_platform.scheduling.model import Allocation, GpuSlice, NodeShare, Placement, Request, Tier

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
CONFIG = two_tenants()  # the tick property test's platform, planned without Dagster

# A tick that crashes holding the lease: takes it, says so, and waits to be killed.
HOLDER = """
import sys, time
from xirang_platform.ledger import Ledger
lease = Ledger(sys.argv[1], migrate=False).tick_lease()
print(lease.__enter__() or "held", flush=True)
time.sleep(600)
"""


@pytest.fixture(params=BACKENDS)
def e(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    with engine(tmp_path, request.param) as platform:
        yield platform


def test_a_tick_skips_and_writes_nothing_while_another_tick_holds_the_lease(e: Engine) -> None:
    run = e.submit("research", "gpu_job", request("offline-training", 2, project="llm"))
    other = Ledger(e.ledger.url, migrate=False)  # another tick's ledger, on its own connections

    with other.tick_lease() as busy:
        assert busy == ""
        report = e.tick()

    assert report.skipped.startswith("tick skipped: another scheduling tick holds the ledger's tick lease")
    assert report.admitted == []
    assert e.held() == set()
    assert e.tag(run, rt.GATE) == "queued"
    assert e.tick().admitted == [run]  # the lease is free again
    other.close()


def test_a_crashed_ticks_lease_dies_with_it(e: Engine) -> None:
    run = e.submit("research", "gpu_job", request("offline-training", 2, project="llm"))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, e.ledger.url],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"
    assert e.tick().skipped != ""

    holder.send_signal(signal.SIGKILL)
    holder.wait()

    def admitted() -> bool:
        return e.tick().admitted == [run]

    e.wait_for("the dead holder's lease to go", admitted)
    assert e.held() == {run}


def test_the_uis_test_sensor_runs_the_tick_dry_and_writes_nothing(e: Engine) -> None:
    run = e.submit("research", "gpu_job", request("offline-training", 2, project="llm"))
    selector = {
        "repositoryLocationName": "research",
        "repositoryName": "__repository__",
        "sensorName": TICK_SENSOR_NAME,
    }

    result = execute_dagster_graphql(e.workspace.create_request_context(), DRY_RUN_MUTATION, {"selector": selector})

    assert result.errors is None
    evaluation = result.data["sensorDryRun"]["evaluationResult"]
    assert evaluation == {"skipReason": DRY_RUN, "error": None}
    assert e.held() == set()
    assert e.tag(run, rt.GATE) == "queued"
    assert e.ledger.entries() == [x for x in e.ledger.entries() if x.kind == "quota"]
    e.sensors()  # the sensor daemon's own tick admits it
    assert e.held() == {run}
    assert e.tag(run, rt.GATE) == rt.GATE_OPEN


def test_a_request_the_ledger_cannot_store_fails_alone_and_the_cycle_is_written(e: Engine) -> None:
    # A preempted mark past the 32-bit column: PostgreSQL said `integer out of range` for the whole
    # cycle, every tick. The tag parser now bounds it (the ledger refuses such a request by name too:
    # tests/ledger/test_ledger_capacity.py); the tick fails that run alone and admits the rest.
    bad = e.submit("research", "gpu_job", request("offline-training", 2, project="llm"))
    e.instance.add_run_tags(bad, {rt.PREEMPTED: "3000000000"})
    good = e.submit("product", "gpu_job", request("online-training", 2))

    report = e.tick()

    assert report.admitted == [good]
    assert bad in report.failed
    assert e.status(bad) == DagsterRunStatus.FAILURE
    assert "xirang/preempted='3000000000' is out of range" in e.tag(bad, rt.HOLD_REASON)
    assert e.held() == {good}
    assert e.ledger.rebuild(e.gpu_pool.platform().pool).ok


def test_a_cycle_the_ledger_refuses_whole_is_a_reason_for_the_next_tick_not_a_failed_tick(tmp_path: Path) -> None:
    # Another writer reserved the run meanwhile (on other GPUs): the ledger refuses the cycle's second
    # reservation of it with `InvalidTransition`, which used to end the tick.
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.sqlite", policy=CONFIG.overcommit)
    sync_accounts(ledger, CONFIG.book)
    asked = Request("run-1", "research", "llm", Tier.ONLINE_TRAINING, 0.0, gpus=2)
    waiting = [GatedRun("run-1", request_run_tags(asked), "research")]
    plan = plan_tick(CONFIG.pool, ledger.quota_book(), [], waiting, 0.0, CONFIG)
    [admit] = plan.result.admits
    taken = {(s.node, s.gpu) for s in admit.allocation.placement.slices}
    node, gpu = next((u.node, u.gpu_index) for u in CONFIG.pool.units() if (u.node, u.gpu_index) not in taken)
    elsewhere = Placement((GpuSlice(node, gpu, 1000),), (NodeShare(node, 0, 0),))
    ledger.reserve(Allocation(replace(asked, gpus=1), elsewhere, start=0.0, confirmed=False))

    why = write_ledger(ledger, plan)

    assert why is not None
    assert "request 'run-1' is already reserved" in why
    assert [a.placement for a in ledger.allocations()] == [elsewhere]
    ledger.close()
