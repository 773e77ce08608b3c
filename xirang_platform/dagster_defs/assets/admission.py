"""What the platform did for the run a step executes in: its allocation, its wait, its lineage."""

from __future__ import annotations

from typing import Any

from dagster import DagsterInstance, DagsterRun, MetadataValue

from resources.gpu_pool import GpuPoolResource, StepContext
from xirang_platform.control import run_tags as rt


def gpu_tags(
    tier: str, project: str, *, gpus: int = 0, milli: int = 0, elastic: tuple[int, int, int] | None = None
) -> dict[str, str]:
    """The `xirang/*` asset tags of a step: its tier, the project that pays, whole GPUs, a fraction of
    one, or an elastic training range `(min, max, step)` (DESIGN.md section 11)."""
    tags = {rt.TIER: tier, rt.PROJECT: project}
    if gpus:
        tags[rt.GPUS] = str(gpus)
    if milli:
        tags[rt.GPU_MILLI] = str(milli)
    if elastic is not None:
        low, high, step = elastic
        tags |= {rt.GPUS_MIN: str(low), rt.GPUS_MAX: str(high)} | ({rt.GPUS_STEP: str(step)} if step != 1 else {})
    return tags


def lineage_root(instance: DagsterInstance, run: DagsterRun) -> str:
    """The first run of a lineage: a re-execution names it as its root; a resumption names its parent."""
    if run.root_run_id:
        return run.root_run_id
    seen = {run.run_id}
    while (parent_id := run.tags.get(rt.PARENT_RUN)) and parent_id not in seen:
        parent = instance.get_run_by_id(parent_id)
        if parent is None:
            return parent_id
        seen.add(parent_id)
        run = parent
        if run.root_run_id:
            return run.root_run_id
    return run.run_id


def queue_wait_s(instance: DagsterInstance, run: DagsterRun) -> float | None:
    """Seconds from the original submission (a resumption keeps its parent's) to this run's start."""
    record = instance.get_run_record_by_id(run.run_id)
    if record is None or record.start_time is None:
        return None
    submitted = float(run.tags.get(rt.SUBMIT_TIME) or record.create_timestamp.timestamp())
    return round(record.start_time - submitted, 3)


def admission_metadata(context: StepContext, gpu_pool: GpuPoolResource) -> dict[str, Any]:
    """Asset metadata: the allocation the run got (read through the pool resource) and how long it waited."""
    meta: dict[str, Any] = {}
    allocation = gpu_pool.allocation(context)
    if allocation is not None:
        meta["allocation"] = MetadataValue.json(
            {
                "nodes": [n for n, _, _ in allocation.nodes],
                "gpus": [{"node": n, "gpu": g, "milli": m} for n, g, m, _ in allocation.gpus],
                "milli": allocation.milli,
                "borrowed": allocation.borrowed,
                "launcher": allocation.launcher,
            }
        )
        meta["allocated_gpus"] = round(allocation.milli / 1000, 3)
        meta["borrowed"] = allocation.borrowed
    wait = queue_wait_s(context.instance, context.run)
    if wait is not None:
        meta["queue_wait_s"] = wait
    preempted = context.run.tags.get(rt.PREEMPTED)
    if preempted:
        meta["preemptions_before"] = int(preempted)
    return meta
