"""What the platform did for the run a step executes in: its allocation, its wait, its lineage."""

from __future__ import annotations

from typing import Any

from dagster import AssetExecutionContext, DagsterInstance, DagsterRun, MetadataValue

PARENT_RUN_TAG = "xirang/parent-run"  # TODO(merge issue12a): run_tags.PARENT_RUN


def gpu_tags(tier: str, project: str, *, gpus: int = 0, milli: int = 0) -> dict[str, str]:
    """The `xirang/*` asset tags of a step: its tier, the project that pays, whole GPUs or a fraction of one."""
    tags = {"xirang/tier": tier, "xirang/project": project}
    if gpus:
        tags["xirang/gpus"] = str(gpus)
    if milli:
        tags["xirang/gpu-milli"] = str(milli)
    return tags


def lineage_root(instance: DagsterInstance, run: DagsterRun) -> str:
    """The first run of a lineage: a re-execution names it as its root; a resumption names its parent."""
    if run.root_run_id:
        return run.root_run_id
    seen = {run.run_id}
    while (parent_id := run.tags.get(PARENT_RUN_TAG)) and parent_id not in seen:
        parent = instance.get_run_by_id(parent_id)
        if parent is None:
            return parent_id
        seen.add(parent_id)
        run = parent
        if run.root_run_id:
            return run.root_run_id
    return run.run_id


def admission_metadata(context: AssetExecutionContext) -> dict[str, Any]:
    """Asset metadata: the `xirang/*` tags of the run (its request and allocation) and its queue wait."""
    run = context.run
    record = context.instance.get_run_record_by_id(run.run_id)
    meta: dict[str, Any] = {}
    xirang = {k: v for k, v in sorted(run.tags.items()) if k.startswith("xirang/")}
    if xirang:
        meta["xirang_tags"] = MetadataValue.json(xirang)
    if record is not None and record.start_time is not None:
        meta["queue_wait_s"] = round(record.start_time - record.create_timestamp.timestamp(), 3)
    return meta
