"""A real `dagster dev` deployment on PostgreSQL to crash: kill -9 run workers, or a whole host's
processes (daemon, webserver, code servers, run workers), and time how long the units take to come back.

For the crash test (`tests/dagster/test_live_crash.py`) and the benchmark (`bench/crash_recovery.py`).
Dagster's storage and the ledger live in PostgreSQL (URLs from the caller), the instance is the
repository's `dagster.yaml` with that storage, the platform the live scene's (`live_scene.py`: four
H100s and two L40S). Runs are research's architecture sweep asking one H100 each, paced to last
minutes, so that they are running when they are killed. `code` is the tree `dagster dev` imports
the platform from (this one, or an older revision's, for the benchmark's baseline).
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from dagster import DagsterInstance

from xirang_platform.control import run_tags as rt
from xirang_platform.dagster_defs.run_workers import Worker, alive, find_worker
from xirang_platform.devtools import devserver
from xirang_platform.devtools.live_scene import submit_sweep, write_live_platform
from xirang_platform.ledger.ledger import Ledger

SWEEP_CONFIG = {"widths": [16], "epochs": 900, "epoch_pause_s": 1.0}  # 15 minutes, unless killed
LONG_SWEEP = {"ops": {"research__architecture_sweep": {"config": SWEEP_CONFIG}}}
IN_PROGRESS = ("STARTING", "STARTED", "CANCELING")
ENDED = ("SUCCESS", "FAILURE", "CANCELED")


@dataclass
class Deployment:
    """One deployment's files (under `root`), its storage, and the `dagster dev` now running it."""

    root: Path
    home: Path
    config: Path
    ledger_url: str
    code: Path
    server: devserver.DevServer | None = None
    _instance: DagsterInstance | None = field(default=None, repr=False)
    _ledger: Ledger | None = field(default=None, repr=False)

    @property
    def instance(self) -> DagsterInstance:
        """The deployment's instance, opened in this process (it reads the same PostgreSQL)."""
        if self._instance is None:
            self._instance = DagsterInstance.from_config(str(self.home))
        return self._instance

    @property
    def ledger(self) -> Ledger:
        """The deployment's ledger."""
        if self._ledger is None:
            self._ledger = Ledger(self.ledger_url)
        return self._ledger

    def start(self) -> float:
        """Start `dagster dev` and wait until both code locations are loaded; the seconds it took."""
        began = time.monotonic()
        env = {"XIRANG_CONFIG": str(self.config), "PYTHONPATH": str(self.code)}
        self.server = devserver.start(self.home, env=env, cwd=self.code)
        self.server.wait_ready(2, timeout=600)
        return time.monotonic() - began

    def crash(self) -> None:
        """kill -9 every process of the deployment at once, as a host crash would."""
        if self.server is not None:
            self.server.kill()
            self.server = None

    def stop(self) -> None:
        """End the deployment's processes (gracefully first) and close what this process opened."""
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None
        if self._instance is not None:
            self._instance.dispose()
            self._instance = None

    def submit(self) -> str:
        """Submit a long sweep on two H100s through the webserver's GraphQL; its run id."""
        assert self.server is not None, "start the deployment first"
        from dagster_graphql import DagsterGraphQLClient

        client = DagsterGraphQLClient("127.0.0.1", port_number=self.server.port, timeout=120)
        return submit_sweep(client, LONG_SWEEP)

    def status(self, run_id: str) -> str:
        """The run's status, read from the storage."""
        run = self.instance.get_run_by_id(run_id)
        return run.status.value if run is not None else "MISSING"

    def running_worker(self, run_id: str, *, started: bool = True, timeout_s: float = 600) -> Worker:
        """Wait until the run's worker process is up (and, when `started`, the run STARTED); the worker."""
        deadline = time.monotonic() + timeout_s
        while True:
            worker = find_worker(self.instance, run_id)
            status = self.status(run_id)
            if worker is not None and alive(worker) and (status == "STARTED" or not started):
                return worker
            if status in ENDED or time.monotonic() > deadline:
                tail = self.server.tail() if self.server else ""
                raise RuntimeError(f"run {run_id} did not start (it is {status}):\n{tail}")
            time.sleep(0.25)

    def held(self) -> set[str]:
        """Run ids the ledger holds a live allocation for."""
        return {a.id for a in self.ledger.allocations()}

    def running(self) -> set[str]:
        """Run ids that hold units by Dagster's account: in progress, or admitted and waiting to launch."""
        out = set()
        for run in self.instance.get_runs():
            status = run.status.value
            if status in IN_PROGRESS or (status == "QUEUED" and run.tags.get(rt.GATE) == rt.GATE_OPEN):
                out.add(run.run_id)
        return out

    def wait_released(self, run_ids: set[str], limit_s: float, since: float | None = None) -> float | None:
        """Seconds from `since` (monotonic; default now) until the ledger holds nothing for `run_ids`
        and each has ended; None when `limit_s` passed first."""
        since = time.monotonic() if since is None else since
        while time.monotonic() - since <= limit_s:
            if not (self.held() & run_ids) and all(self.status(r) in ENDED for r in run_ids):
                return time.monotonic() - since
            time.sleep(0.25)
        return None

    def wait_consistent(self, limit_s: float) -> set[str] | None:
        """Wait (at most `limit_s`) until the ledger's live allocations are exactly the running runs
        and no run is in progress without a live worker; the running runs, or None at the limit."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() <= deadline:
            running = self.running()
            if self.held() == running:
                return running
            time.sleep(0.5)
        return None


@contextmanager
def deployment(root: Path, dagster_url: str, ledger_url: str, code: Path = devserver.REPO) -> Iterator[Deployment]:
    """A deployment under `root` on Dagster storage `dagster_url` and ledger `ledger_url`, importing the
    platform from `code`; every process it started is ended on exit."""
    root.mkdir(parents=True, exist_ok=True)
    config = write_live_platform(root, research_gpus=4, product_gpus=4)
    doc = yaml.safe_load(config.read_text())
    doc["ledger_url"] = ledger_url
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    home = devserver.prepare_home(root / "dagster", code / "dagster.yaml")
    instance = yaml.safe_load((home / "dagster.yaml").read_text())
    instance["storage"] = {"postgres": {"postgres_url": dagster_url}}
    instance["run_coordinator"]["config"]["platform_config"] = str(config)
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance, sort_keys=False))
    dep = Deployment(root, home, config, ledger_url, code)
    try:
        yield dep
    finally:
        dep.stop()


def kill(worker: Worker) -> None:
    """kill -9 one run worker; returns once it is gone."""
    with suppress(ProcessLookupError):
        os.kill(worker.pid, signal.SIGKILL)
    while alive(worker):
        time.sleep(0.05)


def summary(seconds: list[float | None], limit_s: float) -> dict[str, Any]:
    """Median and max of recovery times; a trial that reached the limit counts as the limit."""
    done = sorted(s if s is not None else limit_s for s in seconds)
    return {
        "trials": len(done),
        "median_s": round(statistics.median(done), 2),
        "max_s": round(done[-1], 2),
        "reached_limit": sum(1 for s in seconds if s is None),
        "limit_s": limit_s,
    }
