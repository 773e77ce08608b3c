"""Where an allocation sits, as the ledger stores it (migration 0002).

An allocation row carries its request's fields and the start the cycle gave it; its GPU slices and
node shares are rows of `allocation_slices` and `allocation_shares`, in placement order. Reading
them back gives exactly the `Allocation` the cycle admitted, so `Snapshot.build(pool,
ledger.allocations(), book)` rebuilds the cluster state a scheduling tick works on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, select

from xirang_platform.ledger.errors import InvalidAmount, InvalidPlacement, LedgerError
from xirang_platform.ledger.tables import NODE_LENGTH, SHARES, SLICES, AllocState
from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.model import Allocation, GpuRange, GpuSlice, NodeShare, Placement, Request, Tier

NO_PLACEMENT = Placement((), ())
# The largest value of an `integer` column on both databases (PostgreSQL's is 32 bits).
MAX_COLUMN_INT = 2**31 - 1


def check_columns(a: Allocation) -> None:
    """Refuse an allocation whose numbers its columns cannot hold: every count and amount a whole
    number in 0..2^31-1, every time finite (PostgreSQL would fail the whole transaction with
    `integer out of range`; SQLite stores NaN as NULL). Names the field, the value and the fix."""
    r, p = a.request, a.placement
    numbers: list[tuple[str, object]] = [
        ("gpus", r.gpus),
        ("milli_per_gpu", r.milli_per_gpu),
        ("milli", a.milli),
        ("cpu_milli", r.cpu_milli),
        ("memory_mib", r.memory_mib),
        ("gpu_memory_mib", r.gpu_memory_mib),
        ("min_compute_level", r.min_compute_level),
        ("preempted", r.preempted),
        ("reclaims", r.reclaims),
    ]
    numbers += [(f"slice {i} {name}", v) for i, s in enumerate(p.slices) for name, v in _slice_numbers(s)]
    numbers += [(f"share {i} {name}", v) for i, sh in enumerate(p.shares) for name, v in _share_numbers(sh)]
    for name, value in numbers:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COLUMN_INT:
            raise InvalidAmount(
                f"request '{r.id}' has {name} = {value!r}, which the ledger cannot store: it must be a whole number "
                f"in 0..{MAX_COLUMN_INT}; fix the run's tags (or the pool) that gave it"
            )
    times = [("submit_time", r.submit_time), ("start", a.start), ("reclaimed_at", r.reclaimed_at)]
    for name, t in times:
        if t is not None and (isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t)):
            raise InvalidAmount(
                f"request '{r.id}' has {name} = {t!r}, which the ledger cannot store: a time is a finite number of "
                f"seconds; fix the run's tags that gave it"
            )


def _slice_numbers(s: GpuSlice) -> list[tuple[str, object]]:
    return [("gpu", s.gpu), ("milli", s.milli), ("gpu_memory_mib", s.gpu_memory_mib)]


def _share_numbers(sh: NodeShare) -> list[tuple[str, object]]:
    return [("cpu_milli", sh.cpu_milli), ("memory_mib", sh.memory_mib)]


def check_placement(a: Allocation) -> None:
    """Refuse a placement the ledger cannot hold: one slice per GPU of the request, each 1..1000 milli
    of a named node's GPU, non-negative shares on named nodes."""
    r, p = a.request, a.placement
    if len(p.slices) != r.gpus:
        raise InvalidPlacement(
            f"allocation '{r.id}' has {len(p.slices)} GPU slices for a request of {r.gpus} GPUs: reserve the "
            f"allocation the scheduling cycle admitted (one slice per GPU)"
        )
    for s in p.slices:
        _check_node(r.id, s.node)
        if s.gpu < 0 or not 0 < s.milli <= MILLI_PER_GPU or s.gpu_memory_mib < 0:
            raise InvalidPlacement(
                f"allocation '{r.id}' has a bad slice {s}: a slice is 1..{MILLI_PER_GPU} milli of GPU index >= 0 "
                f"with GPU memory >= 0"
            )
    for sh in p.shares:
        _check_node(r.id, sh.node)
        if sh.cpu_milli < 0 or sh.memory_mib < 0:
            raise InvalidPlacement(f"allocation '{r.id}' has a negative CPU or memory share on node '{sh.node}'")
    nodes = [sh.node for sh in p.shares]
    if len(set(nodes)) != len(nodes):
        raise InvalidPlacement(f"allocation '{r.id}' has two shares on one node: give one share per node")


def _check_node(request_id: str, node: str) -> None:
    if not isinstance(node, str) or not 0 < len(node) <= NODE_LENGTH:
        raise InvalidPlacement(
            f"allocation '{request_id}' names node {node!r}: a node name is 1-{NODE_LENGTH} characters"
        )


def request_columns(a: Allocation) -> dict[str, Any]:
    """The `allocations` columns that record `a`'s request and start."""
    r = a.request
    return {
        "tier": r.tier.value,
        "gpus": r.gpus,
        "milli_per_gpu": r.milli_per_gpu,
        "submit_time": r.submit_time,
        "cpu_milli": r.cpu_milli,
        "memory_mib": r.memory_mib,
        "gpu_memory_mib": r.gpu_memory_mib,
        "min_compute_level": r.min_compute_level,
        "gpu_models": json.dumps(sorted(r.gpu_models)),
        "single_node": r.single_node,
        "preempted": r.preempted,
        "reclaimed_at": r.reclaimed_at,
        "reclaims": r.reclaims,
        "started_at": a.start,
        "gpus_min": r.elastic.min if r.elastic is not None else None,
        "gpus_max": r.elastic.max if r.elastic is not None else None,
        "gpus_step": r.elastic.step if r.elastic is not None else None,
    }


def request_of(row: Any) -> Request:
    """The request an allocation row records."""
    return Request(
        id=row.request_id,
        tenant=row.tenant,
        project=row.project,
        tier=Tier(row.tier),
        submit_time=row.submit_time,
        gpus=row.gpus,
        milli_per_gpu=row.milli_per_gpu or MILLI_PER_GPU,
        cpu_milli=row.cpu_milli,
        memory_mib=row.memory_mib,
        gpu_memory_mib=row.gpu_memory_mib,
        min_compute_level=row.min_compute_level,
        gpu_models=frozenset(json.loads(row.gpu_models)),
        single_node=bool(row.single_node),
        preempted=row.preempted,
        reclaimed_at=row.reclaimed_at,
        reclaims=row.reclaims,
        elastic=_elastic_of(row),
    )


def _elastic_of(row: Any) -> GpuRange | None:
    """The elastic range an allocation row records (None: a fixed request, or a row from before 0007)."""
    low, high = getattr(row, "gpus_min", None), getattr(row, "gpus_max", None)
    if low is None or high is None:
        return None
    return GpuRange(low, high, getattr(row, "gpus_step", None) or 1)


def to_allocation(row: Any, placement: Placement) -> Allocation:
    """The core's `Allocation` of an allocation row with its placement."""
    return Allocation(
        request_of(row),
        placement,
        start=row.started_at,
        borrowed=bool(row.borrowed),
        confirmed=row.state == AllocState.COMMITTED,
        checkpointed_at=row.checkpointed_at,
    )


def read_placements(conn: Connection, rows: Iterable[Any], *, for_accounting: bool = False) -> list[Placement]:
    """The placements of these allocation rows, in their order (two queries per 500 rows).

    A row reserved before placements were stored (migration 0002) cannot be placed: refused, unless
    `for_accounting`, where only its milli matters (the quota rules) and it counts as one unnamed
    slice per GPU."""
    rows = list(rows)
    unplaced = sorted(r.request_id for r in rows if not r.placed)
    if unplaced and not for_accounting:
        raise LedgerError(
            f"allocations {', '.join(unplaced[:5])}{' ...' if len(unplaced) > 5 else ''} were reserved before the "
            f"ledger stored placements (migration 0002), so where they run is unknown: release them "
            f"(`Ledger.release`) and let the scheduler admit them again"
        )
    ids = [r.id for r in rows]
    slices: dict[int, list[GpuSlice]] = {i: [] for i in ids}
    shares: dict[int, list[NodeShare]] = {i: [] for i in ids}
    for chunk in _chunks(ids):
        query = (
            select(SLICES).where(SLICES.c.allocation_id.in_(chunk)).order_by(SLICES.c.allocation_id, SLICES.c.position)
        )
        for s in conn.execute(query):
            slices[s.allocation_id].append(GpuSlice(s.node, s.gpu, s.milli, s.gpu_memory_mib))
        query = (
            select(SHARES).where(SHARES.c.allocation_id.in_(chunk)).order_by(SHARES.c.allocation_id, SHARES.c.position)
        )
        for sh in conn.execute(query):
            shares[sh.allocation_id].append(NodeShare(sh.node, sh.cpu_milli, sh.memory_mib))
    return [
        Placement(tuple(slices[r.id]), tuple(shares[r.id]))
        if r.placed
        else Placement(tuple(GpuSlice("", g, r.milli_per_gpu) for g in range(r.gpus)), ())
        for r in rows
    ]


def _chunks(ids: list[int], size: int = 500) -> Iterable[list[int]]:
    # Bounded IN lists (SQLite allows a limited number of bound parameters per statement).
    for start in range(0, len(ids), size):
        yield ids[start : start + size]
