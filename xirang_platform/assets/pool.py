"""The GPU pool and the quota ledger in Dagster's UI (DESIGN.md sections 3 and 6).

`gpu_pool` is an external asset: the platform does not materialize it, it observes it. Once a minute
the `gpu_pool_observer` sensor records an observation whose numeric metadata (GPUs allocated per tier,
borrowed, idle, utilization, queue length) Dagster's asset page plots over time. The asset check
`ledger_balances_match_entries` recomputes every balance from the ledger's append-only entries and
fails, naming the account and field, on any difference.
"""

from __future__ import annotations

from collections.abc import Iterable

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    AssetSpec,
)

from xirang_platform.ledger.rebuild import RebuildReport
from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.model import Allocation, Tier

GPU_POOL = AssetKey("gpu_pool")
POOL_GROUP = "platform"
OBSERVE_EVERY_S = 60
LEDGER_CHECK = "ledger_balances_match_entries"

gpu_pool_spec = AssetSpec(
    GPU_POOL,
    group_name=POOL_GROUP,
    description="The shared GPU pool: allocation by tier, borrowing, idle GPUs and the queue, observed once a minute.",
)


def pool_observation(pool_milli: int, allocations: Iterable[Allocation], queued_runs: int) -> dict[str, float | int]:
    """The numeric metadata of one observation: GPUs (not milli) by tier, borrowed, idle, queue length."""
    by_tier = {tier: 0 for tier in Tier}
    borrowed = 0
    for a in allocations:
        by_tier[a.request.tier] += a.milli
        borrowed += a.milli if a.borrowed else 0
    allocated = sum(by_tier.values())
    meta: dict[str, float | int] = {
        f"gpus_{tier.value.replace('-', '_')}": round(milli / MILLI_PER_GPU, 3) for tier, milli in by_tier.items()
    }
    meta |= {
        "gpus_allocated": round(allocated / MILLI_PER_GPU, 3),
        "gpus_borrowed": round(borrowed / MILLI_PER_GPU, 3),
        "gpus_idle": round((pool_milli - allocated) / MILLI_PER_GPU, 3),
        "gpus_total": round(pool_milli / MILLI_PER_GPU, 3),
        "utilization": round(allocated / pool_milli, 4) if pool_milli else 0.0,
        "queued_runs": queued_runs,
    }
    return meta


def check_result(report: RebuildReport) -> AssetCheckResult:
    """Pass when every stored balance equals the sum of its entries; else fail and list the differences."""
    lines = [f"{d.account}.{d.field}: stored {d.stored}, from entries {d.from_entries}" for d in report.differences]
    return AssetCheckResult(
        passed=report.ok,
        severity=AssetCheckSeverity.ERROR,
        metadata={"accounts": len(report.balances), "differences": len(report.differences)},
        description="balances equal the sum of their entries" if report.ok else "; ".join(lines[:20]),
    )
