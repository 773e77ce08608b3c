"""`gpu_probe`: a one-op job that reports what the platform gave its run (allocation, devices, wait).

Launch it with `xirang/*` tags (tier, GPUs) to see admission at work from the UI or GraphQL; the
benchmark and the concurrent-submission test use it as the smallest real run.
"""

# No `from __future__ import annotations`: Dagster reads the resource annotations at runtime.

import os

from dagster import JobDefinition, OpExecutionContext, job, op

from resources.gpu_pool import GpuPoolResource
from xirang_platform.dagster_defs.assets.admission import admission_metadata


@op(name="report_allocation")
def report_allocation(context: OpExecutionContext, gpu_pool: GpuPoolResource) -> dict:
    """Log and return the run's allocation, `CUDA_VISIBLE_DEVICES` and queue wait."""
    meta = admission_metadata(context, gpu_pool)
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    context.log.info(
        f"allocation {meta.get('allocation')}, CUDA_VISIBLE_DEVICES={devices!r}, wait {meta.get('queue_wait_s')} s"
    )
    return {"cuda_visible_devices": devices, "allocated_gpus": meta.get("allocated_gpus", 0.0)}


def probe_job() -> JobDefinition:
    """The `gpu_probe` job (its GPU request comes from the run's tags)."""

    @job(name="gpu_probe", description="Reports the allocation the platform gave this run.")
    def gpu_probe() -> None:
        report_allocation()

    return gpu_probe
