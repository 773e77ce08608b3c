"""The daily-partitioned `gpu_usage` asset (DESIGN.md section 10): per tenant, project and UTC day,
GPU-hours in quota, borrowed (and from whom), lent, preempted and lost, rebuilt from the ledger's
entries (`operations/usage.py`). Its metadata holds the day's table and, per tenant, the figures the UI
plots across partitions. It asks for no GPU, so it launches as soon as it is requested."""

# No `from __future__ import annotations`: Dagster reads the context annotations at runtime.

import time
from datetime import date
from typing import Any

from dagster import AssetExecutionContext, DailyPartitionsDefinition, MaterializeResult, MetadataValue, asset

from resources.gpu_pool import GpuPoolResource
from xirang_platform.operations.usage import UsageRow, totals, usage, usage_table

USAGE_PARTITIONS = DailyPartitionsDefinition(start_date="2026-01-01", timezone="UTC")


@asset(
    name="gpu_usage",
    partitions_def=USAGE_PARTITIONS,
    description="GPU-hours per tenant, project and day: in quota, borrowed (from whom), lent, preempted, lost; "
    "rebuilt from the quota ledger's entries (DESIGN.md section 10).",
)
def gpu_usage(context: AssetExecutionContext, gpu_pool: GpuPoolResource) -> MaterializeResult:
    """One day's usage and chargeback, from the ledger."""
    day = date.fromisoformat(context.partition_key)
    step = gpu_pool.platform().scheduler.checkpoint_interval_s
    rows = usage(gpu_pool.ledger().entries(), day, day, time.time(), step)
    return MaterializeResult(metadata=usage_metadata(day, rows))


def usage_metadata(day: date, rows: list[UsageRow]) -> dict[str, Any]:
    """The asset's metadata for one day: the table (or the line saying there was none), the totals
    and each tenant's figures."""
    docs = [r.as_dict() for r in rows]
    table = usage_table(docs) if docs else f"no GPU usage recorded on {day} (UTC)"
    metadata: dict[str, Any] = {"day": day.isoformat(), "rows": len(docs), "usage": MetadataValue.md(table)}
    metadata |= {f"total {k}": round(v, 6) for k, v in totals(rows).items()}
    for tenant in sorted({r.tenant for r in rows}):
        metadata |= {f"{tenant} {k}": round(v, 6) for k, v in totals([r for r in rows if r.tenant == tenant]).items()}
    return metadata
