"""Every private Dagster name the platform, its tests and benchmarks use, and the platform's one
direct write to Dagster's run tables: what a Dagster upgrade can break without a deprecation.

Written for `DAGSTER_VERSION` (pinned in pyproject.toml); `tests/dagster/test_dagster_compat.py`
fails on any other version. On an upgrade, re-check each section below against the new release's
source, then move the pin and `DAGSTER_VERSION` together:

1. the names imported from `dagster._*` still exist with the same meaning (a missing one fails at
   import; a changed one fails the tests of its importers);
2. `is_daemon_tick`: the sensor daemon still names an evaluation's log key after its tick;
3. `write_run_tags`: still statement for statement what `SqlRunStorage.add_run_tags` does
   (`tests/dagster/test_run_writes.py` compares both, on SQLite and PostgreSQL);
4. `held_filter`: a `RunsFilter` tag whose value is a list still matches a run with any of them.

Nothing else imports `dagster._*` (ruff's banned-api rule, `[tool.ruff.lint.flake8-tidy-imports]`).
"""

from __future__ import annotations

from collections.abc import Mapping

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter, SensorEvaluationContext

# -- the platform's private names ---------------------------------------------------------------------
from dagster._config import validate_config
from dagster._core.definitions.sensor_definition import SensorType
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition
from dagster._core.errors import DagsterExecutionInterruptedError  # what Dagster's own termination raises
from dagster._core.events import EngineEventData, StepMaterializationData
from dagster._core.execution.plan.resume_retry import ReexecutionStrategy
from dagster._core.instance.config import dagster_instance_config
from dagster._core.launcher import LaunchRunContext
from dagster._core.remote_origin import (
    GrpcServerCodeLocationOrigin,
    InProcessCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.run_coordinator.queued_run_coordinator import RunQueueConfig
from dagster._core.storage.legacy_storage import LegacyRunStorage
from dagster._core.storage.runs.schema import RunsTable, RunTagsTable
from dagster._core.storage.runs.sql_run_storage import SqlRunStorage
from dagster._core.storage.sqlalchemy_compat import db_fetch_mappings, db_select
from dagster._core.storage.tags import GRPC_INFO_TAG, PARTITION_NAME_TAG, PARTITION_SET_TAG

# -- the test harness's private names (tests/, bench/) ------------------------------------------------
from dagster._core.test_utils import create_run_for_test, create_test_daemon_workspace_context
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import BaseWorkspaceRequestContext, WorkspaceProcessContext
from dagster._core.workspace.load_target import (
    CompositeTarget,
    InProcessWorkspaceLoadTarget,
    PythonFileTarget,
    WorkspaceFileTarget,
)
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon
from dagster._daemon.sensor import execute_sensor_iteration, execute_sensor_iteration_loop
from dagster._serdes import deserialize_value, serialize_value
from dagster._serdes.config_class import ConfigurableClassData
from dagster._time import get_current_datetime

from xirang_platform.control import run_tags as rt

DAGSTER_VERSION = "1.13.27"
# The run launcher that executes a run inside the launching daemon, as instance config names it.
SYNC_IN_MEMORY_RUN_LAUNCHER = {
    "module": "dagster._core.launcher.sync_in_memory_run_launcher",
    "class": "SyncInMemoryRunLauncher",
}

__all__ = [
    "DAGSTER_VERSION",
    "GRPC_INFO_TAG",
    "PARTITION_NAME_TAG",
    "BaseWorkspaceRequestContext",
    "CompositeTarget",
    "ConfigurableClassData",
    "DagsterExecutionInterruptedError",
    "EngineEventData",
    "GrpcServerCodeLocationOrigin",
    "InProcessCodeLocationOrigin",
    "InProcessWorkspaceLoadTarget",
    "LaunchRunContext",
    "LoadableTargetOrigin",
    "PythonFileTarget",
    "QueuedRunCoordinatorDaemon",
    "ReexecutionStrategy",
    "RemoteJobOrigin",
    "RemoteRepositoryOrigin",
    "SYNC_IN_MEMORY_RUN_LAUNCHER",
    "RunQueueConfig",
    "SensorType",
    "StepMaterializationData",
    "UnresolvedAssetJobDefinition",
    "WorkspaceFileTarget",
    "WorkspaceProcessContext",
    "create_run_for_test",
    "create_test_daemon_workspace_context",
    "dagster_instance_config",
    "execute_sensor_iteration",
    "execute_sensor_iteration_loop",
    "held_filter",
    "is_daemon_tick",
    "sql_run_storage",
    "validate_config",
    "write_run_tags",
]


def is_daemon_tick(context: SensorEvaluationContext) -> bool:
    """Whether this evaluation is one of the sensor daemon's ticks (else a dry run: the UI's "Test
    sensor", or a direct call). The daemon names each evaluation's log key after its tick,
    `[repository, sensor, tick id]` (`SensorLaunchContext.log_key`); the webserver's `sensorDryRun`
    and a direct call pass none, and Dagster makes one ending in a timestamp (`YYYYmmdd_HHMMSS`) or
    leaves it empty. Dagster has no public flag for it."""
    key = context.log_key
    return key is not None and len(key) > 0 and str(key[-1]).isdigit()


# -- the direct table write ---------------------------------------------------------------------------


def write_run_tags(instance: DagsterInstance, tags_by_run: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Add `tags_by_run[run_id]` to each run (new keys added, existing keys overwritten), in one
    transaction where the run storage is SQL. Returns the ids written, sorted; a run that no longer
    exists (deleted since the tick read it) is skipped.

    Dagster writes tags one run at a time: `DagsterInstance.add_run_tags` opens a connection, reads
    the run, rewrites its body and its tag rows and commits (on SQLite a new connection and a disk
    sync per call), so a tick that admits many runs spent seconds there before the last gate opened
    (figures: docs/design-notes.md, record D5). This does the same writes for every run of a tick in
    one connection and one transaction, through Dagster's storage objects (the run storage's
    connection, its table definitions), statement for statement as `SqlRunStorage.add_run_tags`. A
    run storage that is not SQL (none ships with Dagster) gets one `add_run_tags` per run."""
    wanted = {rid: dict(tags) for rid, tags in tags_by_run.items() if tags}
    if not wanted:
        return []
    storage = sql_run_storage(instance)
    if storage is None:
        written = [rid for rid in sorted(wanted) if instance.has_run(rid)]
        for rid in written:
            instance.add_run_tags(rid, wanted[rid])
        return written
    with storage.connect() as conn:
        rows = db_fetch_mappings(
            conn,
            db_select([RunsTable.c.run_id, RunsTable.c.run_body, RunsTable.c.status]).where(
                RunsTable.c.run_id.in_(sorted(wanted))
            ),
        )
        runs = {
            row["run_id"]: deserialize_value(row["run_body"], DagsterRun).with_status(DagsterRunStatus(row["status"]))
            for row in rows
        }
        now = get_current_datetime()
        added = []
        for rid in sorted(runs):
            current = dict(runs[rid].tags or {})
            new = wanted[rid]
            merged = {**current, **new}
            conn.execute(
                RunsTable.update()
                .where(RunsTable.c.run_id == rid)
                .values(
                    run_body=serialize_value(runs[rid].with_tags(merged)),
                    partition=merged.get(PARTITION_NAME_TAG),
                    partition_set=merged.get(PARTITION_SET_TAG),
                    update_timestamp=now,
                )
            )
            for key, value in sorted(new.items()):
                if key in current:
                    conn.execute(
                        RunTagsTable.update()
                        .where((RunTagsTable.c.run_id == rid) & (RunTagsTable.c.key == key))
                        .values(value=value)
                    )
                else:
                    added.append({"run_id": rid, "key": key, "value": value})
        if added:
            conn.execute(RunTagsTable.insert(), added)
    return sorted(runs)


def sql_run_storage(instance: DagsterInstance) -> SqlRunStorage | None:
    """The instance's SQL run storage (SQLite or PostgreSQL, unwrapped from a `storage:` config), else None."""
    storage = instance.run_storage
    if isinstance(storage, LegacyRunStorage):
        storage = storage._storage.run_storage  # noqa: SLF001 (the wrapper exposes no accessor)
    return storage if isinstance(storage, SqlRunStorage) else None


def held_filter() -> RunsFilter:
    """Dagster's filter for the queued runs behind a closed gate (any of `run_tags.CLOSED_GATES`)."""
    return RunsFilter(statuses=[DagsterRunStatus.QUEUED], tags={rt.GATE: list(rt.CLOSED_GATES)})
