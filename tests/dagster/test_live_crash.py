"""kill -9 at random moments on a real `dagster dev` with Dagster's storage and the ledger on
PostgreSQL: run workers (starting or running), then the whole host (daemon, webserver, code servers,
run workers) and a restart. Afterwards every killed run has ended and the ledger's live allocations
are exactly the running runs (issue 20 item 6: after such crashes 4 runs stayed STARTED holding 11
GPUs for 20 minutes).

The waits are guards against a hung test, not timing assertions: `bench/crash_recovery.py` measures
the bound.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dagster.engine_harness import fresh_postgres_database, ledger_schema
from xirang_platform.devtools import crash_scene
from xirang_platform.devtools.crash_scene import Deployment

pytestmark = pytest.mark.postgres
GUARD_S = 600
WORKER_KILLS = 5


@pytest.fixture
def dep(tmp_path: Path) -> Iterator[Deployment]:
    with fresh_postgres_database() as url, crash_scene.deployment(tmp_path, url, ledger_schema(url)) as d:
        d.start()
        yield d


def test_killed_run_workers_and_a_crashed_host_leave_every_run_ended_and_no_unit_held(dep: Deployment) -> None:
    rng = random.Random(20)
    runs = [dep.submit(), dep.submit()]
    for kill in range(WORKER_KILLS):
        victim = runs[kill]
        worker = dep.running_worker(victim, started=rng.random() < 0.5)  # starting, or already running
        dep.wait_consistent(rng.uniform(0, 3))  # a random moment: ticks and releases go on meanwhile
        crash_scene.kill(worker)
        runs.append(dep.submit())
    for survivor in runs[WORKER_KILLS:]:
        dep.running_worker(survivor)

    dep.crash()  # the host: every process at once, two running runs among them
    dep.start()

    assert dep.wait_released(set(runs), GUARD_S) is not None, (dep.held(), {r: dep.status(r) for r in runs})
    assert {dep.status(r) for r in runs} == {"FAILURE"}
    assert dep.wait_consistent(GUARD_S) == set()
    assert dep.ledger.rebuild().ok
