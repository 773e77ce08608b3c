"""Node scorers: which feasible node, and which GPUs on it, a single-node request takes.

A scorer sees the feasible nodes (every one can hold the request) and picks one. Ties between
nodes go to the lowest `priority` value (a fixed order per pool: by name, or a seeded permutation,
as FGD's simulator does), so a replay reproduces exactly.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.state import ClusterState


class NodeScorer(Protocol):
    """Chooses a node among `nodes` (indices, ascending) and the GPUs on it for `request`.

    `need` is, per candidate node, the milli each GPU must give (the request's milli per GPU
    rounded up to the node's compute unit). Returns (node index, GPU indices); GPU indices are
    empty for a CPU-only request.
    """

    name: str

    def pick(
        self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray, priority: np.ndarray
    ) -> tuple[int, tuple[int, ...]]: ...


def best_fit_gpus(free: np.ndarray, count: int, need: int) -> tuple[int, ...]:
    """The `count` fullest GPUs of one node that still have `need` free, lowest index on ties."""
    order = np.lexsort((np.arange(len(free)), free))  # ascending free, then index
    chosen = [int(g) for g in order if free[g] >= need][:count]
    return tuple(sorted(chosen))


class BestFit:
    """The fullest node that fits (least free GPU, then CPU, left after placing), fullest GPUs."""

    name = "bestfit"

    def pick(
        self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray, priority: np.ndarray
    ) -> tuple[int, tuple[int, ...]]:
        gpu_left = state.gpu_free[nodes].sum(axis=1) - request.gpus * need
        cpu_left = state.cpu_free[nodes] - request.cpu_milli
        best = np.lexsort((priority[nodes], cpu_left, gpu_left))[0]
        node = int(nodes[best])
        if request.gpus == 0:
            return node, ()
        return node, best_fit_gpus(state.gpu_free[node], request.gpus, int(need[best]))


_SCORERS: dict[str, type] = {"bestfit": BestFit}


def make_scorer(name: str, **options: object) -> NodeScorer:
    """The scorer registered as `name`, built with `options`."""
    try:
        cls = _SCORERS[name]
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r}; choose one of {sorted(_SCORERS)}") from None
    return cls(**options)


def register(name: str, cls: type) -> None:
    """Make a scorer class available to `make_scorer` under `name`."""
    _SCORERS[name] = cls
