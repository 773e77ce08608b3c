"""A run worker killed with its code server (a crashed host's processes): the tick ends the run and
gives its GPUs back (issue 20 item 6: such runs stayed STARTED holding their GPUs for 20 minutes).

Real code servers and Dagster's `DefaultRunLauncher` (every run a process of its own), on SQLite
and on dagster-postgres. With its code server alive, Dagster's own server fails a run whose process
died; with the code server gone too, only the tick can tell.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterRunStatus

from tests.dagster.engine_harness import Engine, engine, request
from xirang_platform.dagster_defs import run_workers

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
WAIT = {"test/outcome": "wait"}


@pytest.fixture(params=BACKENDS)
def e(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    with engine(tmp_path, request.param, processes=True) as platform:
        yield platform


def started_worker(e: Engine, run_id: str) -> run_workers.Worker:
    """Wait until the run's worker process runs its op; its process."""
    found: list[run_workers.Worker] = []

    def up() -> bool:
        worker = run_workers.find_worker(e.instance, run_id)
        found[:] = [worker] if worker is not None else []
        return bool(found) and e.status(run_id) == DagsterRunStatus.STARTED

    e.wait_for(f"run {run_id} started", up)
    return found[0]


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def kill_worker_and_its_code_server(worker: run_workers.Worker) -> None:
    server = parent_of(worker.pid)
    os.kill(server, signal.SIGKILL)  # first, so it cannot fail the run itself
    os.kill(worker.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while run_workers.alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)


def test_a_run_whose_worker_and_code_server_were_killed_is_ended_and_its_gpus_released(e: Engine) -> None:
    crashed = e.submit("research", "gpu_job", request("offline-training", 4, project="llm") | WAIT)
    survivor = e.submit("product", "gpu_job", request("online-training", 2) | WAIT)
    e.tick()
    e.dequeue()
    kill_worker_and_its_code_server(started_worker(e, crashed))
    started_worker(e, survivor)
    assert e.status(crashed) == DagsterRunStatus.STARTED  # nobody told Dagster

    report = e.tick()

    assert e.status(crashed) == DagsterRunStatus.FAILURE
    assert "its run worker is gone" in e.messages(crashed)[-1]
    assert e.held() == {survivor}
    assert f"ended run {crashed}: its run worker is gone (killed, or its host crashed)" in report.repairs
    assert e.status(survivor) == DagsterRunStatus.STARTED
    assert e.ledger.rebuild().ok
