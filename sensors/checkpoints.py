"""Checkpoints the tick reads from Dagster: an asset a GPU run materialized counts as a checkpoint.

A run reports its own checkpoints through `GpuPoolResource.checkpointed`; what it materialized is
in Dagster's event log, which the run cannot forget to report. At each tick, for every allocation
that could be a victim (its tier preemptible as held: P2, or borrowed), the latest
`ASSET_MATERIALIZATION` of its run (one indexed read per such run) moves the ledger's checkpoint time
when it is later, and the snapshot's `Allocation.checkpointed_at` with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from dagster import DagsterEventType, DagsterInstance

from xirang_platform.ledger.ledger import Ledger
from xirang_platform.scheduling.model import Allocation


def materialized_checkpoints(instance: DagsterInstance, allocations: Sequence[Allocation]) -> dict[str, float]:
    """Run id -> when it last materialized an asset, for the preemptible allocations whose run did
    so after the checkpoint the ledger holds for it."""
    out: dict[str, float] = {}
    for a in allocations:
        if not a.request.tier.rules.preemptible_when(a.borrowed):
            continue
        found = instance.get_records_for_run(
            a.id, of_type=DagsterEventType.ASSET_MATERIALIZATION, limit=1, ascending=False
        ).records
        if found and (a.checkpointed_at is None or found[0].timestamp > a.checkpointed_at):
            out[a.id] = found[0].timestamp
    return out


def with_checkpoints(instance: DagsterInstance, ledger: Ledger, allocations: Sequence[Allocation]) -> list[Allocation]:
    """`allocations` with the checkpoints their runs' materializations add, recorded in the ledger."""
    times = materialized_checkpoints(instance, allocations)
    if not times:
        return list(allocations)
    ledger.checkpointed_many(times)
    return [replace(a, checkpointed_at=times[a.id]) if a.id in times else a for a in allocations]
