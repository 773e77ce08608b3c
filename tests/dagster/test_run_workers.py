"""`run_workers`: a run's worker process found from its run log, alive or gone, waited for."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRun, instance_for_test

from tests.waiting import wait_for
from xirang_platform.dagster_compat import EngineEventData, create_run_for_test
from xirang_platform.dagster_defs import run_workers
from xirang_platform.dagster_defs.run_workers import GRPC_INFO_TAG, Worker


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test() as instance:
        yield instance


def sleeper(seconds: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def state_of(pid: int) -> str:
    """The process's state letter in /proc (`Z`: exited, not yet reaped by its parent)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def run_with_worker(instance: DagsterInstance, pid: int, host: str = "localhost") -> DagsterRun:
    """A run launched through a code server at `host` whose worker logged `pid`, as Dagster's worker does."""
    run = create_run_for_test(instance, job_name="probe", tags={GRPC_INFO_TAG: json.dumps({"host": host})})
    instance.report_engine_event(f"Started process for run (pid: {pid}).", run, EngineEventData.in_process(pid))
    return run


def test_the_worker_is_the_pid_its_run_logged_and_lives_until_killed(instance: DagsterInstance) -> None:
    proc = sleeper(60)
    run = run_with_worker(instance, proc.pid)
    worker = run_workers.find_worker(instance, run.run_id)
    assert worker is not None
    assert worker.pid == proc.pid
    assert run_workers.alive(worker)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not run_workers.alive(worker)


def test_a_zombie_worker_is_gone(instance: DagsterInstance) -> None:
    proc = sleeper(0)
    wait_for("the sleeper to exit, unreaped: a zombie until wait()", lambda: state_of(proc.pid), done="Z".__eq__)
    worker = run_workers.find_worker(instance, run_with_worker(instance, proc.pid).run_id)
    assert worker is not None
    assert not run_workers.alive(worker)
    proc.wait()


def test_a_pid_reused_by_a_later_process_is_not_the_worker() -> None:
    proc = sleeper(60)
    try:
        assert not run_workers.alive(Worker(proc.pid, started_at=time.time() - 3600))
    finally:
        proc.kill()
        proc.wait()


def test_a_run_before_its_worker_logged_has_none(instance: DagsterInstance) -> None:
    run = create_run_for_test(instance, job_name="probe")
    assert run_workers.find_worker(instance, run.run_id) is None


@pytest.mark.parametrize(
    ("tags", "local"),
    [
        pytest.param({GRPC_INFO_TAG: json.dumps({"host": "localhost", "port": 4000})}, True, id="code server here"),
        pytest.param({GRPC_INFO_TAG: json.dumps({"host": "10.0.0.7", "port": 4000})}, False, id="another host"),
        pytest.param({}, False, id="no code server (Kubernetes Job)"),
        pytest.param({GRPC_INFO_TAG: "not json"}, False, id="unreadable tag"),
    ],
)
def test_only_workers_of_code_servers_on_this_host_are_checked(
    instance: DagsterInstance, tags: dict[str, str], local: bool
) -> None:
    assert run_workers.is_local(create_run_for_test(instance, job_name="probe", tags=tags)) is local


def test_wait_ended_returns_once_every_worker_exited(instance: DagsterInstance) -> None:
    procs = [sleeper(1.5), sleeper(0.5)]
    runs = [run_with_worker(instance, p.pid) for p in procs]
    threads = [threading.Thread(target=p.wait) for p in procs]  # a parent reaps its children, as a code server does
    for t in threads:
        t.start()
    assert run_workers.wait_ended(instance, [r.run_id for r in runs], timeout_s=30) == []
    assert all(p.poll() is not None for p in procs)
    for t in threads:
        t.join()


def test_wait_ended_names_the_workers_still_running_at_the_timeout(instance: DagsterInstance) -> None:
    proc = sleeper(60)
    try:
        run = run_with_worker(instance, proc.pid)
        assert run_workers.wait_ended(instance, [run.run_id], timeout_s=0.3) == [run.run_id]
    finally:
        proc.kill()
        proc.wait()
