"""An embedded platform driven in process by Dagster's own daemon code (`xirang demo`, the benchmark).

`write_platform` lays out a temporary platform: its pool, ledger and tenants (`xirang.yaml`) and a
Dagster home whose `dagster.yaml` names the coordinator (the platform's `XirangRunCoordinator`, or
Dagster's stock `QueuedRunCoordinator` as a baseline) and the run launcher. `Embedded` submits runs
with the GraphQL mutation the UI sends (executed in process: no webserver) and drives the daemons,
either a step at a time (`step`: one iteration of Dagster's sensor daemon, that is the scheduling
tick, the release and resumption sensors, each at its own minimum interval, then one of its queue
daemon, which launches; the scripted demo) or as `dagster-daemon run` runs them (`daemons`: each
daemon's own loop in a thread of its own; the admission benchmark, whose runs execute inside the
queue daemon: stepped in one thread, a queue iteration executing fifty runs would hold the tick back).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from dagster import DagsterInstance, DagsterRun, DagsterRunStatus
from dagster_graphql.client.client_queries import CLIENT_SUBMIT_PIPELINE_RUN_MUTATION
from dagster_graphql.test.utils import execute_dagster_graphql

from xirang_platform.dagster_compat import (
    SYNC_IN_MEMORY_RUN_LAUNCHER,
    QueuedRunCoordinatorDaemon,
    WorkspaceFileTarget,
    WorkspaceProcessContext,
    execute_sensor_iteration,
    execute_sensor_iteration_loop,
)

REPO = Path(__file__).resolve().parents[2]
TERMINAL = frozenset({DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED})
COORDINATORS = {
    "xirang": {"module": "xirang_platform.dagster_defs.coordinator", "class": "XirangRunCoordinator"},
    "stock": {"module": "dagster", "class": "QueuedRunCoordinator"},
}
LAUNCHERS = {
    # One process per run, started by the code location's server: what `make run` uses.
    "process": {"module": "dagster", "class": "DefaultRunLauncher"},
    # The run executes inside the launching daemon: admission is measured without process start-up.
    "in-process": SYNC_IN_MEMORY_RUN_LAUNCHER,
}


class EmbeddedError(RuntimeError):
    """The embedded platform did not get somewhere in time; the message says where and what the runs did."""


def write_platform(
    workdir: Path,
    platform: Mapping[str, Any],
    pool: Mapping[str, Any] | None = None,
    *,
    coordinator: str = "xirang",
    launcher: str = "process",
    coordinator_config: Mapping[str, Any] | None = None,
) -> tuple[Path, Path]:
    """Write the platform config (and its pool, when given) and a Dagster home under `workdir`."""
    if pool is not None:
        (workdir / "pool.yaml").write_text(yaml.safe_dump(dict(pool), sort_keys=False))
    config = workdir / "xirang.yaml"
    config.write_text(yaml.safe_dump(dict(platform), sort_keys=False))
    home = workdir / "dagster"
    home.mkdir(parents=True, exist_ok=True)
    settings: dict[str, Any] = {"max_concurrent_runs": 50, "dequeue_interval_seconds": 1, **(coordinator_config or {})}
    if coordinator == "xirang":
        settings["platform_config"] = str(config)
    instance = {
        "storage": {"sqlite": {"base_dir": str(home)}},
        "run_coordinator": {**COORDINATORS[coordinator], "config": settings},
        "run_launcher": LAUNCHERS[launcher],
        "telemetry": {"enabled": False},
        "nux": {"enabled": False},  # no "join the community" dialog over the UI
    }
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance, sort_keys=False))
    return config, home


@dataclass
class Embedded:
    """A running embedded platform: its instance and workspace (code locations), driven step by step."""

    instance: DagsterInstance
    workspace: WorkspaceProcessContext
    queue_every_s: float = 1.0
    on_step: Callable[[], None] | None = None
    _queue: QueuedRunCoordinatorDaemon = field(default_factory=lambda: QueuedRunCoordinatorDaemon(interval_seconds=1))
    # Sensors are evaluated in threads, as the sensor daemon does: a slow one does not hold up the rest.
    _sensor_pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(4, "xirang-sensors"))
    _sensor_futures: dict[str, Future] = field(default_factory=dict)
    _last_queue: float = 0.0
    _threads: list[threading.Thread] = field(default_factory=list)
    _log: logging.Logger = field(default_factory=lambda: logging.getLogger("xirang.embedded"))

    def submit(
        self,
        location: str,
        job: str,
        run_config: Mapping[str, Any] | None = None,
        *,
        tags: Mapping[str, str] | None = None,
        selection: list[list[str]] | None = None,
    ) -> str:
        """Launch `job` of `location` as the UI does (GraphQL `launchPipelineExecution`); the run id."""
        selector: dict[str, Any] = {
            "repositoryLocationName": location,
            "repositoryName": "__repository__",
            "pipelineName": job,
        }
        if selection is not None:
            selector["assetSelection"] = [{"path": path} for path in selection]
        params: dict[str, Any] = {"selector": selector, "runConfigData": dict(run_config or {}), "mode": "default"}
        if tags:
            params["executionMetadata"] = {"tags": [{"key": k, "value": v} for k, v in tags.items()]}
        with self.workspace.create_request_context() as context:
            result = execute_dagster_graphql(context, CLIENT_SUBMIT_PIPELINE_RUN_MUTATION, {"executionParams": params})
        payload = result.data["launchPipelineExecution"]
        if "run" not in payload:
            raise EmbeddedError(f"submitting {job} of {location} failed: {payload}")
        return str(payload["run"]["runId"])

    def step(self) -> None:
        """One sensor-daemon iteration, and one queue-daemon iteration when its interval has passed."""
        list(execute_sensor_iteration(self.workspace, self._log, self._sensor_pool, None, self._sensor_futures))
        now = time.monotonic()
        if now - self._last_queue >= self.queue_every_s:
            self._last_queue = now
            list(self._queue.run_iteration(self.workspace))
        if self.on_step:
            self.on_step()

    @contextmanager
    def daemons(self) -> Iterator[None]:
        """Within the block, Dagster's sensor daemon loop (`execute_sensor_iteration_loop`: an iteration
        every 5 s, each sensor at its own minimum interval) and its queue daemon loop (an iteration every
        `queue_every_s`) run each in a thread of its own, as `dagster-daemon run` runs them."""
        stop = threading.Event()
        loops = [
            execute_sensor_iteration_loop(self.workspace, self._log, stop, threadpool_executor=self._sensor_pool),
            QueuedRunCoordinatorDaemon(interval_seconds=self.queue_every_s).core_loop(self.workspace, stop),
        ]
        self._threads = [threading.Thread(target=_drive, args=(loop, stop), daemon=True) for loop in loops]
        for thread in self._threads:
            thread.start()
        try:
            yield
        finally:
            stop.set()
            for thread in self._threads:
                thread.join()
            self._threads = []

    def wait(self, what: str, done: Callable[[], bool], timeout: float = 300.0, pause_s: float = 0.5) -> None:
        """Until `done()`, step (or, inside `daemons`, let the daemons' threads work); an `EmbeddedError`
        naming `what` and the runs' states after `timeout` s."""
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                states = ", ".join(f"{r.run_id[:8]} {r.job_name}: {r.status.value}" for r in self.runs())
                raise EmbeddedError(f"did not get to '{what}' within {timeout:.0f} s ({states})")
            if not self._threads:
                self.step()
            time.sleep(pause_s)

    def close(self) -> None:
        """Wait for the sensor evaluations in flight."""
        self._sensor_pool.shutdown(wait=True)

    def runs(self) -> list[DagsterRun]:
        """Every run, oldest first."""
        return list(reversed(self.instance.get_runs()))

    def status(self, run_id: str) -> DagsterRunStatus:
        """The run's current status."""
        run = self.instance.get_run_by_id(run_id)
        if run is None:
            raise EmbeddedError(f"no run {run_id}")
        return run.status


def _drive(loop: Iterable[Any], stop: threading.Event) -> None:
    """Iterate a daemon's loop (it yields between and within its iterations) until `stop` is set."""
    for _ in loop:
        if stop.is_set():
            return


@contextmanager
def embedded_platform(config: Path, home: Path, *, queue_every_s: float = 1.0) -> Iterator[Embedded]:
    """The instance of `home` with the repository's code locations loaded (their servers started, and
    stopped on exit); the code servers and the runs see `XIRANG_CONFIG=config`."""
    saved = {k: os.environ.get(k) for k in ("DAGSTER_HOME", "XIRANG_CONFIG")}
    os.environ.update(DAGSTER_HOME=str(home), XIRANG_CONFIG=str(config))
    servers: list[int] = []
    try:
        with DagsterInstance.from_config(str(home)) as instance:
            target = WorkspaceFileTarget(paths=[str(REPO / "workspace.yaml")])
            with WorkspaceProcessContext(instance, target, code_server_log_level="WARNING") as workspace:
                platform = Embedded(instance, workspace, queue_every_s=queue_every_s)
                try:
                    yield platform
                finally:
                    platform.close()
                    servers = code_servers()
        stop_code_servers(servers)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def code_servers() -> list[int]:
    """Pids of this process's children that are Dagster code servers (`dagster api grpc`)."""
    me, found = str(os.getpid()), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = stat.read_text().rsplit(")", 1)[1].split()[1]
            cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if parent == me and b"api" in cmdline and b"grpc" in cmdline:
            found.append(int(stat.parent.name))
    return sorted(found)


def stop_code_servers(pids: Iterable[int], timeout_s: float = 30.0) -> None:
    """Wait for the code servers `pids` (told to shut down with the workspace) to exit; kill those
    still running after `timeout_s`. A server whose runs were cancelled may wait for its orphan
    check, which cannot read the removed instance, and would never exit on its own (it also holds
    the caller's stdout)."""
    deadline = time.monotonic() + timeout_s
    pending = set(pids)
    while pending and time.monotonic() < deadline:
        pending = {p for p in pending if Path(f"/proc/{p}").exists() and _running(p)}
        time.sleep(0.2)
    for pid in sorted(pending):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    if state == "Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True
