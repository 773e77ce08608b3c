"""The GPU pool and the quota ledger in Dagster's UI (DESIGN.md sections 3 and 6).

`gpu_pool` is an external asset: the platform does not materialize it, it observes it. Once a minute
the `gpu_pool_observer` sensor records an observation whose numeric metadata (GPUs allocated per tier,
borrowed, idle, utilization, queue length) Dagster's asset page plots over time. The asset check
`ledger_balances_match_entries` recomputes every balance from the ledger's append-only entries and
fails, naming the account and field, on any difference.
"""

# No `from __future__ import annotations`: Dagster reads the resource annotations at runtime.

import time

from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    AssetObservation,
    AssetSpec,
    DefaultSensorStatus,
    MetadataValue,
    SensorEvaluationContext,
    SensorResult,
    asset_check,
    sensor,
)

from resources.gpu_pool import GpuPoolResource
from xirang_platform.ledger.rebuild import RebuildReport
from xirang_platform.operations.queue_view import queue_markdown, read_queue

GPU_POOL = AssetKey("gpu_pool")
POOL_GROUP = "platform"
OBSERVE_EVERY_S = 60
LEDGER_CHECK = "ledger_balances_match_entries"

gpu_pool_spec = AssetSpec(
    GPU_POOL,
    group_name=POOL_GROUP,
    description="The shared GPU pool: allocation by tier, borrowing, idle GPUs and the queue, observed once a minute.",
)


def check_result(report: RebuildReport) -> AssetCheckResult:
    """Pass when every stored balance equals the sum of its entries; else fail and list the differences."""
    lines = [f"{d.account}.{d.field}: stored {d.stored}, from entries {d.from_entries}" for d in report.differences]
    return AssetCheckResult(
        passed=report.ok,
        severity=AssetCheckSeverity.ERROR,
        metadata={"accounts": len(report.balances), "differences": len(report.differences)},
        description="balances equal the sum of their entries" if report.ok else "; ".join(lines[:20]),
    )


@asset_check(asset=GPU_POOL, name=LEDGER_CHECK, description="The ledger's balances equal the sum of its entries.")
def ledger_balances_match_entries(gpu_pool: GpuPoolResource) -> AssetCheckResult:
    """Rebuild every balance from the append-only entries (DESIGN.md section 6, invariant 4)."""
    return check_result(gpu_pool.ledger().rebuild())


@sensor(
    name="gpu_pool_observer",
    minimum_interval_seconds=OBSERVE_EVERY_S,
    default_status=DefaultSensorStatus.RUNNING,
    description="Records the pool's allocation by tier, borrowing, idle GPUs and queue, and checks the ledger.",
)
def gpu_pool_observer(context: SensorEvaluationContext, gpu_pool: GpuPoolResource) -> SensorResult:
    """Once a minute: one `gpu_pool` observation, and the ledger check's evaluation."""
    state = gpu_pool.pool_state(context.instance)
    now = time.time()
    queue = queue_markdown(read_queue(context.instance, gpu_pool.ledger(), gpu_pool.platform(), now), now)
    check = check_result(gpu_pool.ledger().rebuild())
    return SensorResult(
        asset_events=[
            AssetObservation(GPU_POOL, metadata={**state.as_metadata(), "queue": MetadataValue.md(queue)}),
            AssetCheckEvaluation(
                asset_key=GPU_POOL,
                check_name=LEDGER_CHECK,
                passed=check.passed,
                severity=check.severity,
                metadata=check.metadata,
                description=check.description,
            ),
        ]
    )
