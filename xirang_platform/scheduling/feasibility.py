"""Which nodes could hold a request right now: the filters every placement rule starts from."""

from __future__ import annotations

import numpy as np

from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.state import ClusterState


def eligible_nodes(state: ClusterState, request: Request) -> np.ndarray:
    """Boolean mask of nodes whose GPU model, compute level and GPU memory suit `request`,
    whatever is free on them."""
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
    mask = eligible_nodes(state, request) if eligible is None else eligible.copy()
    mask &= state.cpu_free >= request.cpu_milli
    mask &= state.mem_free >= request.memory_mib
    if request.whole_gpus and request.gpus:
        mask &= state.whole_free >= request.gpus
    elif request.gpus == 1 and not request.gpu_memory_mib:
        mask &= state.max_free >= unit_rounded(state, request.milli_per_gpu)  # one GPU: the freest one decides
    elif request.gpus:
        need = unit_rounded(state, request.milli_per_gpu)
        fitting = state.usable_gpus(need, request.gpu_memory_mib).sum(axis=1)
        mask &= fitting >= request.gpus
    return np.flatnonzero(mask)
