"""The simulator as an asset: replay real traces through the scheduler's `cycle` and record the metrics."""

# No `from __future__ import annotations`: Dagster reads the config and context annotations at runtime.

from pathlib import Path
from typing import Any

from dagster import AssetExecutionContext, Config, MaterializeResult, MetadataValue, asset

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.simulate.inputs import load_book, load_jobs, load_pool
from xirang_platform.simulate.metrics import compute_metrics
from xirang_platform.simulate.replay import replay
from xirang_platform.simulate.traces import limit_jobs


class TraceReplayConfig(Config):
    """Which traces to replay; empty paths mean the bundled openb cluster and pods."""

    nodes: str = ""
    jobs: list[str] = []
    tenants: str = ""
    limit: int = 0
    domain_size: int = 8


@asset(group_name="simulation")
def trace_replay(context: AssetExecutionContext, config: TraceReplayConfig) -> MaterializeResult:
    """Replay real traces through the scheduler and record utilization, waits and preemptions."""
    pool = load_pool(Path(config.nodes) if config.nodes else None, config.domain_size)
    book = load_book(Path(config.tenants) if config.tenants else None, pool)
    jobs = load_jobs(list(config.jobs), book, tenants_given=bool(config.tenants))
    jobs = limit_jobs(jobs, config.limit or None)
    result = replay(pool, book, jobs)
    metrics = compute_metrics(result.events, pool.gpu_milli / MILLI_PER_GPU)
    context.log.info(f"replayed {len(jobs)} jobs on {len(pool.nodes)} nodes in {result.cycles} cycles")
    metadata: dict[str, Any] = {k: v for k, v in metrics.items() if isinstance(v, int | float) and v == v}
    metadata["cycles"] = result.cycles
    metadata["metrics"] = MetadataValue.json({k: v for k, v in metrics.items() if v == v})
    return MaterializeResult(metadata=metadata)
