"""Which nodes could hold a request right now: the filters every placement rule starts from.

`eligible_nodes` depends only on static facts and is computed once per pool and request kind;
`fit_mask` is `single_node_fit` kept per request shape and re-checked only on the nodes that changed.
"""

from __future__ import annotations

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.derived import FEW_ROWS
from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.state import ClusterState

Rows = np.ndarray | slice


def eligible_nodes(state: ClusterState, request: Request) -> np.ndarray:
    """Boolean mask of nodes whose GPU model, compute level and GPU memory suit `request`,
    whatever is free on them (read-only: computed once per pool and kind of request)."""
    key = ("eligible", request.gpus > 0, request.gpu_models, request.min_compute_level, request.gpu_memory_mib)
    return state.static_fact(key, lambda: _read_only(_eligible(state, request)))


def _read_only(values: np.ndarray) -> np.ndarray:
    values.setflags(write=False)
    return values


def _eligible(state: ClusterState, request: Request) -> np.ndarray:
    n = len(state.names)
    mask = np.ones(n, dtype=bool)
    if request.gpus == 0:
        return mask
    mask &= state.gpu_count > 0
    if request.gpu_models:
        allowed = [k for k, m in enumerate(state.model_names) if m in request.gpu_models]
        mask &= np.isin(state.model_id, allowed)
    if request.min_compute_level:
        mask &= state.compute_level >= request.min_compute_level
    if request.gpu_memory_mib:
        mask &= state.gpu_memory_mib >= request.gpu_memory_mib
    return mask


def unit_rounded(state: ClusterState, milli: int) -> np.ndarray:
    """Per node, `milli` rounded up to a whole number of that node's compute units (read-only;
    computed once per value and pool)."""
    rounded = state.rounded.get(milli)
    if rounded is None:
        unit = state.unit_milli
        rounded = state.rounded[milli] = -(-milli // unit) * unit
        rounded.setflags(write=False)
    return rounded


def single_node_fit(state: ClusterState, request: Request, eligible: np.ndarray | None = None) -> np.ndarray:
    """Indices (ascending) of the nodes that can hold all of `request` on their own right now:
    CPU, memory, and `gpus` GPUs each with the (unit-rounded) milli and the request's GPU memory free."""
    mask = eligible_nodes(state, request) if eligible is None else eligible
    return np.flatnonzero(mask & capacity_fit(state, request, slice(None)))


def fit_mask(state: ClusterState, request: Request) -> np.ndarray:
    """`single_node_fit` as a mask over all nodes, kept per request shape and updated only on the
    rows that changed since the last call (read-only)."""
    eligible = eligible_nodes(state, request)
    return state.derived.per_node(
        state, ("fit", request.shape), lambda rows: eligible[rows] & capacity_fit(state, request, rows)
    )


def capacity_fit(state: ClusterState, request: Request, rows: Rows) -> np.ndarray:
    """Per node of `rows`, whether its free CPU, memory and GPUs could hold all of `request`."""
    if isinstance(rows, np.ndarray) and len(rows) <= FEW_ROWS:  # what an admission changed: in scalars
        return np.array([row_fits(state, request, r) for r in rows.tolist()], dtype=bool)
    mask = (state.cpu_free[rows] >= request.cpu_milli) & (state.mem_free[rows] >= request.memory_mib)
    if request.whole_gpus and request.gpus:
        mask &= state.whole_free[rows] >= request.gpus
    elif request.gpus == 1 and not request.gpu_memory_mib:
        mask &= state.max_free[rows] >= unit_rounded(state, request.milli_per_gpu)[rows]  # the freest GPU decides
    elif request.gpus:
        usable = state.gpu_free[rows] >= unit_rounded(state, request.milli_per_gpu)[rows][:, None]
        if request.gpu_memory_mib:
            usable &= state.gpu_mem_free[rows] >= request.gpu_memory_mib
        mask &= usable.sum(axis=1) >= request.gpus
    return mask


def row_fits(state: ClusterState, request: Request, row: int) -> bool:
    """`capacity_fit` of the one row `row`, the same rule read as Python scalars (cheaper than array calls)."""
    if state.cpu_free.item(row) < request.cpu_milli or state.mem_free.item(row) < request.memory_mib:
        return False
    if not request.gpus:
        return True
    if request.whole_gpus:
        return state.whole_free.item(row) >= request.gpus
    need = unit_rounded(state, request.milli_per_gpu).item(row)
    if request.gpus == 1 and not request.gpu_memory_mib:
        return state.max_free.item(row) >= need  # the freest GPU decides
    return _gpus_fit(request, need, state.gpu_free[row].tolist(), state.gpu_mem_free[row].tolist())


def values_fit(request: Request, need: int, cpu: int, memory: int, free: list[int], gpu_memory: list[int]) -> bool:
    """`capacity_fit` of one node given as values: `cpu` and `memory` free, per GPU `free` milli and
    `gpu_memory` MiB; `need`: the request's milli per GPU rounded to the node's unit."""
    if cpu < request.cpu_milli or memory < request.memory_mib:
        return False
    if not request.gpus:
        return True
    if request.whole_gpus:
        return free.count(MILLI_PER_GPU) >= request.gpus
    return _gpus_fit(request, need, free, gpu_memory)


def _gpus_fit(request: Request, need: int, free: list[int], gpu_memory: list[int]) -> bool:
    """Whether `request.gpus` GPUs each have `need` milli and the request's GPU memory free."""
    if request.gpu_memory_mib:
        least = request.gpu_memory_mib
        return len([f for f, m in zip(free, gpu_memory, strict=True) if f >= need and m >= least]) >= request.gpus
    return len([f for f in free if f >= need]) >= request.gpus
