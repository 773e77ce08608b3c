"""Release on run end: run-status sensors for success, failure and cancel give the units back.

One `release_run` does the work for all three (and is idempotent: a run the ledger holds nothing
for, such as a preempted victim whose units the tick already took back, is a no-op). The sensors
watch every code location, so they live in one location only (the one that runs the tick). A
release a sensor misses is caught by the next tick's reconcile. A release also has the launcher
delete what it created for the run (`Launcher.stop`; with the `k8s` launcher its DRA claim
template, its gang's Service and Indexed Job: `K8sSubmitter.stop`; nothing locally). A resized
elastic run's allocation is not released when the run ends on its notice: it is its resumption's
(`control/resize.py`).
"""

from __future__ import annotations

import logging

from dagster import (
    DagsterRunStatus,
    DefaultSensorStatus,
    RunStatusSensorContext,
    RunStatusSensorDefinition,
    run_status_sensor,
)

from resources.gpu_pool import GpuPoolResource
from sensors.cadence import SENSOR_LOOP_S, minimum_interval
from xirang_platform.control.reconcile import ENDED_CAUSE
from xirang_platform.control.resize import awaits_resumption
from xirang_platform.launch.k8s_cluster import K8sUnavailable
from xirang_platform.launch.launcher import Launcher, platform_launcher
from xirang_platform.ledger.errors import LedgerError
from xirang_platform.ledger.ledger import Ledger
from xirang_platform.pool.model import Pool

_logger = logging.getLogger("xirang.release")

RELEASE_SENSORS = {
    status: (f"xirang_release_on_{name}", ENDED_CAUSE[status.value])
    for status, name in (
        (DagsterRunStatus.SUCCESS, "success"),
        (DagsterRunStatus.FAILURE, "failure"),
        (DagsterRunStatus.CANCELED, "cancel"),
    )
}


def release_run(ledger: Ledger, run_id: str, cause: str, pool: Pool, launcher: Launcher | None = None) -> bool:
    """Release the allocation of `run_id` if the ledger holds one, and have the launcher delete what
    it created for the run (`Launcher.stop`: its Kubernetes objects); True when it did."""
    allocations = ledger.allocations()
    allocation = next((a for a in allocations if a.id == run_id), None)
    if allocation is None:
        return False
    pool_milli = pool.gpu_milli
    fraction = min(1.0, sum(a.milli for a in allocations) / pool_milli) if pool_milli else 0.0
    try:
        ledger.release(run_id, cause, fraction)
    except LedgerError as e:  # released meanwhile (by reconcile): nothing left to do
        _logger.info("release of %s skipped: %s", run_id, e)
        return False
    if launcher is not None:
        launcher.stop(allocation, pool)
    return True


def build_release_sensors() -> list[RunStatusSensorDefinition]:
    """The three run-status sensors (success, failure, cancel), watching every code location."""
    return [_release_sensor(status, name, cause) for status, (name, cause) in RELEASE_SENSORS.items()]


def _release_sensor(status: DagsterRunStatus, name: str, cause: str) -> RunStatusSensorDefinition:
    @run_status_sensor(
        run_status=status,
        name=name,
        monitor_all_code_locations=True,
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=minimum_interval(SENSOR_LOOP_S),
        description=f"Releases a run's GPU allocation in the quota ledger when the run ends ({cause}).",
    )
    def release_on_end(context: RunStatusSensorContext, gpu_pool: GpuPoolResource) -> None:
        run_id = context.dagster_run.run_id
        run = context.instance.get_run_by_id(run_id) or context.dagster_run  # its tags as the tick left them
        if awaits_resumption(run.status.value, run.tags):
            context.log.info(f"run {run_id} was resized: its new allocation waits for its resumption")
            return
        launcher: Launcher | None
        try:
            launcher = platform_launcher(gpu_pool.launcher)
        except K8sUnavailable as exc:  # release the units anyway; the objects stay (logged)
            context.log.error(f"run {run_id}: its Kubernetes objects are not deleted: {exc}")
            launcher = None
        if release_run(gpu_pool.ledger(), run_id, cause, gpu_pool.pool(), launcher):
            context.log.info(f"released the allocation of run {run_id} ({cause})")

    return release_on_end
