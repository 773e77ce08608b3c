"""The engine suite's harness: a real Dagster instance with the platform's coordinator, two
in-process code locations built from `engine_defs.py`, Dagster's queue daemon iteration, and the
platform's tick and sensors, on SQLite or on a fresh PostgreSQL database.

Runs are created from the code locations' jobs exactly as the webserver creates them (remote
origin, code origin, execution plan snapshot) and submitted through `instance.submit_run`, so the
coordinator sees the real workspace. Dagster's `SyncInMemoryRunLauncher` executes a launched run
in the test process, start to end, while the queue daemon iterates: a run's ops end as its
`test/outcome` tag says.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from dagster import (
    AssetKey,
    DagsterEventType,
    DagsterInstance,
    DagsterRunStatus,
    build_run_status_sensor_context,
    instance_for_test,
)
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from resources.gpu_pool import GpuPoolResource
from sensors.release import RELEASE_SENSORS, build_release_sensors
from sensors.scheduling_tick import TickReport, run_tick
from tests.dagster import engine_defs
from tests.waiting import wait_for
from xirang_platform.control import run_tags as rt
from xirang_platform.dagster_compat import (
    SYNC_IN_MEMORY_RUN_LAUNCHER,
    CompositeTarget,
    InProcessCodeLocationOrigin,
    InProcessWorkspaceLoadTarget,
    LoadableTargetOrigin,
    PythonFileTarget,
    QueuedRunCoordinatorDaemon,
    WorkspaceProcessContext,
    create_test_daemon_workspace_context,
)
from xirang_platform.ledger.ledger import Ledger

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFS_FILE = HERE / "engine_defs.py"
POOL_FILE = HERE / "pool.yaml"
DEFAULT_PG = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"

# The UI's sensor dry run (`sensorDryRun`), sent through `execute_dagster_graphql` on `Engine.workspace`.
DRY_RUN_MUTATION = """
mutation($selector: SensorSelector!) {
  sensorDryRun(selectorData: $selector, cursor: null) {
    __typename
    ... on DryRunInstigationTick { evaluationResult { skipReason error { message } } }
    ... on PythonError { message }
  }
}
"""

# research: 12 GPUs (cap 14.4 at ratio 1.2), product: 8 GPUs; the pool holds 20 (two 8-GPU H100
# servers in one domain, one 4 x L40S server).
PLATFORM: dict[str, Any] = {
    "pool": str(POOL_FILE),
    "tenants": {
        "research": {"quota_gpus": 12, "projects": {"llm": {}, "vision": {}}},
        "product": {"quota_gpus": 8, "projects": {"serving": {}}},
    },
    "locations": {"research": "research", "product": "product"},
    "tick": {"interval_s": 1, "location": "research"},
    "scheduler": {"min_runtime_s": 0},
}


def postgres_base_url() -> str:
    """The test PostgreSQL server: `XIRANG_TEST_POSTGRES_URL`, else 127.0.0.1:5432/test."""
    return os.environ.get("XIRANG_TEST_POSTGRES_URL", DEFAULT_PG)


@contextlib.contextmanager
def fresh_postgres_database() -> Iterator[str]:
    """A new, uniquely named PostgreSQL database (URL), dropped afterwards with its connections."""
    base = make_url(postgres_base_url())
    name = f"xirang_dagster_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def ledger_schema(pg_url: str) -> str:
    """A URL on schema `xirang_ledger` of the test database: Dagster's storage and the ledger each
    keep their own alembic version table."""
    engine = create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE SCHEMA xirang_ledger"))
    engine.dispose()
    return (
        make_url(pg_url)
        .update_query_dict({"options": "-csearch_path=xirang_ledger"})
        .render_as_string(hide_password=False)
    )


def storage_overrides(backend: str, pg_url: str | None) -> dict[str, Any]:
    """Dagster storage for the instance: the test's temporary SQLite, or dagster-postgres."""
    if backend == "postgres":
        assert pg_url is not None
        return {"storage": {"postgres": {"postgres_url": pg_url}}}
    return {}


@dataclass
class Engine:
    """One test's platform: instance, workspace, resource, ledger, and the steps a test drives."""

    instance: DagsterInstance
    workspace: WorkspaceProcessContext
    gpu_pool: GpuPoolResource
    flags: Path

    @property
    def ledger(self) -> Ledger:
        return self.gpu_pool.ledger()

    # -- runs ------------------------------------------------------------------------------------

    def create(
        self,
        location: str,
        job: str,
        tags: Mapping[str, str] | None = None,
        assets: list[str] | None = None,
        run_config: Mapping[str, Any] | None = None,
    ) -> str:
        """Create a run of `job` in `location` as the webserver does, without submitting it."""
        context = self.workspace.create_request_context()
        repo = context.get_code_location(location).get_repository("__repository__")
        remote_job = repo.get_full_job(job)
        defs = engine_defs.location_defs(location)
        job_def = defs.resolve_job_def(job)
        selection = [AssetKey(a) for a in assets] if assets else None
        if selection:
            job_def = job_def.get_subset(asset_selection=set(selection))
        run = self.instance.create_run_for_job(
            job_def=job_def,
            remote_job_origin=remote_job.get_remote_origin(),
            job_code_origin=remote_job.get_python_origin(),
            tags=dict(tags or {}),
            asset_selection=frozenset(selection) if selection else None,
            run_config=dict(run_config or {}),
        )
        return run.run_id

    def submit(
        self,
        location: str,
        job: str,
        tags: Mapping[str, str] | None = None,
        assets: list[str] | None = None,
        run_config: Mapping[str, Any] | None = None,
    ) -> str:
        """Create and submit a run (the coordinator decides its gate); returns its id."""
        run_id = self.create(location, job, tags, assets, run_config)
        self.instance.submit_run(run_id, self.workspace.create_request_context())
        return run_id

    def run(self, run_id: str) -> Any:
        run = self.instance.get_run_by_id(run_id)
        assert run is not None
        return run

    def status(self, run_id: str) -> DagsterRunStatus:
        return self.run(run_id).status

    def tag(self, run_id: str, key: str) -> str | None:
        return self.run(run_id).tags.get(key)

    def messages(self, run_id: str) -> list[str]:
        return [e.message for e in self.instance.all_logs(run_id)]

    # -- the platform's steps ----------------------------------------------------------------------

    def tick(self, now: float | None = None) -> TickReport:
        return run_tick(self.instance, self.gpu_pool, now)

    def dequeue(self) -> None:
        """One iteration of Dagster's queue daemon: it launches the runs whose gates are open."""
        list(QueuedRunCoordinatorDaemon(interval_seconds=1).run_iteration(self.workspace))

    def release_sensors(self, run_id: str) -> list[str]:
        """Evaluate the release sensor watching the run's final status, as the sensor daemon would."""
        run = self.run(run_id)
        wanted = {
            DagsterRunStatus.SUCCESS: DagsterEventType.RUN_SUCCESS,
            DagsterRunStatus.FAILURE: DagsterEventType.RUN_FAILURE,
            DagsterRunStatus.CANCELED: DagsterEventType.RUN_CANCELED,
        }[run.status]
        event = self.instance.all_logs(run_id, of_type=wanted)[-1].dagster_event
        fired = []
        for sensor_def in build_release_sensors():
            if sensor_def.name != RELEASE_SENSORS[run.status][0]:
                continue
            with build_run_status_sensor_context(
                sensor_name=sensor_def.name,
                dagster_event=event,
                dagster_instance=self.instance,
                dagster_run=run,
                resources={"gpu_pool": self.gpu_pool},
            ) as context:
                sensor_def(context)
            fired.append(sensor_def.name)
        return fired

    def sensors(self) -> None:
        """One iteration of Dagster's sensor daemon over the code locations' sensors: run requests
        they return are submitted (through the coordinator) as the daemon submits them."""
        from xirang_platform.dagster_compat import execute_sensor_iteration

        list(execute_sensor_iteration(self.workspace, logging.getLogger("test.sensors"), None, None))

    def finish(self, run_id: str, outcome: str = "done") -> None:
        """Tell a waiting run (`test/outcome=wait`) to end: `done` or `fail`."""
        (self.flags / f"{run_id}.{outcome}").touch()

    def wait_for(self, what: str, predicate: Callable[[], bool], guard_s: float = 600.0) -> None:
        """Poll until `predicate` holds (`tests.waiting.wait_for`; runs end on this loaded machine's time)."""
        wait_for(what, predicate, guard_s=guard_s)

    def held(self) -> set[str]:
        """Ids of the runs the ledger holds a live allocation for."""
        return {a.id for a in self.ledger.allocations()}

    def launched(self) -> list[str]:
        """Runs that started, in the order they started."""
        runs = self.instance.get_runs()
        started = [(self.instance.get_run_record_by_id(r.run_id), r.run_id) for r in runs]
        return [rid for rec, rid in sorted((rec.start_time or 0, rid) for rec, rid in started if rec.start_time)]


@contextlib.contextmanager
def engine(
    tmp: Path, backend: str, platform: Mapping[str, Any] | None = None, processes: bool = False
) -> Iterator[Engine]:
    """A platform on `backend` ("sqlite" or "postgres"), its config and ledger under `tmp`.

    `processes=False`: in-process code locations, runs executed in the test process at launch.
    `processes=True`: each code location in its own gRPC code server and Dagster's
    `DefaultRunLauncher`, so every run is a process of its own that can be terminated.
    """
    doc = dict(platform or PLATFORM)
    config = tmp / "xirang.yaml"
    flags = tmp / "flags"
    flags.mkdir()
    with contextlib.ExitStack() as stack:
        pg_url = stack.enter_context(fresh_postgres_database()) if backend == "postgres" else None
        ledger_url = ledger_schema(pg_url) if pg_url else f"sqlite:///{tmp / 'ledger.sqlite'}"
        doc["ledger_url"] = ledger_url
        config.write_text(yaml.safe_dump(doc), encoding="utf-8")
        env = {"XIRANG_CONFIG": str(config), "XIRANG_LEDGER_URL": ledger_url, "XIRANG_TEST_FLAGS": str(flags)}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        stack.callback(_restore, old)
        overrides = {
            **storage_overrides(backend, pg_url),
            "run_coordinator": {
                "module": "xirang_platform.dagster_defs.coordinator",
                "class": "XirangRunCoordinator",
                "config": {"platform_config": str(config), "max_concurrent_runs": 50},
            },
            "run_launcher": {"module": "dagster", "class": "DefaultRunLauncher"}
            if processes
            else SYNC_IN_MEMORY_RUN_LAUNCHER,
        }
        (tmp / "dagster").mkdir()
        instance = stack.enter_context(instance_for_test(overrides=overrides, temp_dir=str(tmp / "dagster")))
        workspace = stack.enter_context(create_test_daemon_workspace_context(_target(processes), instance))
        stack.callback((flags / engine_defs.STOP_ALL).touch)  # before the servers stop: end waiting runs
        gpu_pool = GpuPoolResource(config_path=str(config))
        stack.callback(lambda: gpu_pool.ledger().engine.dispose())
        yield Engine(instance, workspace, gpu_pool, flags)


def _target(processes: bool) -> Any:
    locations = ("research", "product")
    if processes:
        return CompositeTarget(
            [PythonFileTarget(str(DEFS_FILE), f"{loc}_defs", str(REPO), loc) for loc in locations]  # type: ignore[list-item]
        )
    origins = [
        InProcessCodeLocationOrigin(
            LoadableTargetOrigin(python_file=str(DEFS_FILE), attribute=f"{loc}_defs", working_directory=str(REPO)),
            location_name=loc,
        )
        for loc in locations
    ]
    return InProcessWorkspaceLoadTarget(origins)


def _restore(old: Mapping[str, str | None]) -> None:
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def request(tier: str, gpus: int | None = None, milli: int | None = None, **extra: str) -> dict[str, str]:
    """Run tags asking for `gpus` whole GPUs (or `milli` of one) in `tier`; `project` etc. in extra."""
    tags = {rt.TIER: tier}
    if gpus is not None:
        tags[rt.GPUS] = str(gpus)
    if milli is not None:
        tags[rt.GPU_MILLI] = str(milli)
    tags.update(
        {f"xirang/{k.replace('_', '-')}" if not k.startswith(("xirang/", "test/")) else k: v for k, v in extra.items()}
    )
    return tags
