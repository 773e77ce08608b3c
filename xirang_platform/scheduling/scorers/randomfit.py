"""A uniform feasible node, for baselines."""

from __future__ import annotations

import zlib

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.state import ClusterState


class RandomFit:
    """A uniform feasible node and, for a GPU share, a uniform GPU that fits.

    The draw is seeded from `seed`, the request's id and the cluster's allocated milli, so one
    input always gives one answer: a cycle stays pure (calling it twice decides the same) and
    checking whether a request could ever fit consumes nothing.
    """

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def pick(
        self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray, priority: np.ndarray
    ) -> tuple[int, tuple[int, ...]]:
        rng = np.random.default_rng([self.seed, zlib.crc32(request.id.encode()), int(state.allocated_milli)])
        k = int(rng.integers(len(nodes)))
        node = int(nodes[k])
        if request.gpus == 0:
            return node, ()
        fitting = np.flatnonzero(state.gpu_free[node] >= need[k])
        if request.gpus == 1 and request.milli_per_gpu < MILLI_PER_GPU:
            return node, (int(rng.choice(fitting)),)
        return node, tuple(int(g) for g in fitting[: request.gpus])
