"""The pool at one instant as people read it, in GPUs: allocated per tier, borrowed, idle, queued.

The `gpu_pool` asset observes it (`dagster_defs/assets/pool.py`) and the autoscaling sensor reports
its borrowed GPUs; both read it through `GpuPoolResource.pool_state`, which counts the gated queue.
`cap_ratio_now` is the one cap ratio every report shows (`xirang quota show`, the exporter's
`xirang_cap_gpus`, the queue view): the ratio the cycle applies at the pool's allocation now.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from xirang_platform.pool.model import MILLI_PER_GPU, Pool
from xirang_platform.scheduling.model import Allocation, Tier
from xirang_platform.scheduling.quota import OvercommitPolicy


@dataclass(frozen=True)
class PoolState:
    """The pool at one instant, in GPUs: allocated per tier, borrowed, idle, and the queue."""

    capacity_gpus: float
    allocated_by_tier: dict[str, float]
    borrowed_gpus: float
    queued_runs: int

    @property
    def allocated_gpus(self) -> float:
        """GPUs allocated over all tiers."""
        return sum(self.allocated_by_tier.values())

    @property
    def idle_gpus(self) -> float:
        """GPUs allocated to nobody."""
        return self.capacity_gpus - self.allocated_gpus

    @property
    def utilization(self) -> float:
        """Allocated over capacity (0 for a pool without GPUs)."""
        return self.allocated_gpus / self.capacity_gpus if self.capacity_gpus else 0.0

    def as_metadata(self) -> dict[str, float]:
        """Flat numeric values, for asset observations (Dagster plots numeric metadata over time)."""
        out: dict[str, float] = {f"allocated_gpus_{t}": v for t, v in sorted(self.allocated_by_tier.items())}
        out.update(
            capacity_gpus=self.capacity_gpus,
            allocated_gpus=self.allocated_gpus,
            borrowed_gpus=self.borrowed_gpus,
            idle_gpus=self.idle_gpus,
            utilization=round(self.utilization, 4),
            queued_runs=float(self.queued_runs),
        )
        return out


def pool_state(pool: Pool, allocations: Iterable[Allocation], queued_runs: int = 0) -> PoolState:
    """`pool` with `allocations` (the ledger's), counted per tier and borrowed, and `queued_runs` waiting."""
    by_tier = {t.value: 0.0 for t in Tier}
    borrowed = 0.0
    for a in allocations:
        by_tier[a.request.tier.value] += a.milli / MILLI_PER_GPU
        borrowed += a.milli / MILLI_PER_GPU if a.borrowed else 0.0
    return PoolState(pool.gpu_milli / MILLI_PER_GPU, by_tier, borrowed, queued_runs)


def allocated_fraction(allocated_milli: int, capacity_milli: int) -> float:
    """The share of the pool's GPU milli the live allocations hold, 0..1 (0 for a pool without GPUs)."""
    return min(1.0, allocated_milli / capacity_milli) if capacity_milli else 0.0


def cap_ratio_now(policy: OvercommitPolicy, allocated_milli: int, capacity_milli: int) -> float:
    """The cap ratio while `allocated_milli` of the pool's `capacity_milli` is allocated: the load-adaptive
    ratio the cycle admits under (`policy.max_ratio`, the ceiling, only while the pool is lightly used)."""
    return policy.ratio(allocated_fraction(allocated_milli, capacity_milli))


NOT_IN_POOL = "(not in the pool)"  # the model row of slices on nodes the pool no longer has


def allocated_by_model(pool: Pool, allocations: Iterable[Allocation]) -> dict[str, dict[str, float]]:
    """GPUs the allocations hold per GPU model of the pool and per tier (every model and tier, zeros
    included; slices on nodes the pool lacks under `NOT_IN_POOL`), models sorted."""
    model_of = {n.name: n.model_name for n in pool.nodes if n.gpus}
    out = {model: {t.value: 0.0 for t in Tier} for model in sorted(set(model_of.values()))}
    for a in allocations:
        for s in a.placement.slices:
            row = out.setdefault(model_of.get(s.node, NOT_IN_POOL), {t.value: 0.0 for t in Tier})
            row[a.request.tier.value] += s.milli / MILLI_PER_GPU
    return out
