"""What a node scorer is, and the GPU choices several scorers share.

A scorer sees the feasible nodes (every one can hold the request) and picks one. Ties between
nodes go to the lowest `priority` value (a fixed order per pool: by name, or a seeded permutation,
as FGD's simulator does), so a replay reproduces exactly.
"""

from __future__ import annotations

from typing import Protocol, TypeGuard

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
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


class NodeLocalScorer(NodeScorer, Protocol):
    """A scorer whose choice is made on node-local scores: `node_scores` gives each of `nodes` a
    score that depends only on that node's own row of `state` (and the scorer's fixed settings, the
    pool's static facts), and `pick` always returns a node with the highest score among `nodes`.

    Placement then keeps the scores per request shape, recomputes them only on the nodes that changed
    (`placement.place_by_node_scores`) and hands only the top-scoring candidates to `pick_top`,
    which makes `pick`'s choice among them without scoring them again.
    """

    def node_scores(self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray) -> np.ndarray: ...

    def pick_top(
        self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray, priority: np.ndarray
    ) -> tuple[int, tuple[int, ...]]: ...


def is_node_local(scorer: NodeScorer) -> TypeGuard[NodeLocalScorer]:
    """Whether `scorer` declares node-local scores (`NodeLocalScorer`; cheaper than `isinstance`)."""
    return callable(getattr(scorer, "node_scores", None))


def best_fit_gpus(free: np.ndarray, count: int, need: int) -> tuple[int, ...]:
    """The `count` fullest GPUs of one node that still have `need` free, lowest index on ties."""
    order = np.lexsort((np.arange(len(free)), free))  # ascending free, then index
    chosen = [int(g) for g in order if free[g] >= need][:count]
    return tuple(sorted(chosen))


def first_free_gpus(free: np.ndarray, count: int) -> tuple[int, ...]:
    """The `count` lowest-index fully free GPUs of one node (FGD's rule for whole-GPU pods)."""
    return tuple(int(g) for g in np.flatnonzero(free >= MILLI_PER_GPU)[:count])


def lowest_priority(candidates: np.ndarray, priority: np.ndarray) -> int:
    """The candidate node that comes first in the tie-break order."""
    return int(candidates[np.argmin(priority[candidates])])
