"""Best fit: the fullest node that fits, fullest GPUs."""

from __future__ import annotations

import numpy as np

from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.scorers.base import best_fit_gpus
from xirang_platform.scheduling.state import ClusterState


class BestFit:
    """The fullest node that fits, fullest GPUs.

    Default: least GPU milli left after placing, then least CPU left, then node priority.
    `integer_score=True`: FGD's repository BestFit, int(100 * (1 - 0.5 cpu_left/128000 -
    0.5 gpu_left/8000)), ties to node priority; coarse, so priority decides more often.
    """

    name = "bestfit"

    def __init__(self, integer_score: bool = False) -> None:
        self.integer_score = integer_score

    def pick(
        self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray, priority: np.ndarray
    ) -> tuple[int, tuple[int, ...]]:
        gpu_left = state.free_milli[nodes] - request.gpus * need
        cpu_left = state.cpu_free[nodes] - request.cpu_milli
        if self.integer_score:
            waste = cpu_left / 128000 * 0.5 + gpu_left / 8000 * 0.5
            score = ((1.0 - waste) * 100.0).astype(np.int64)
            best = np.flatnonzero(score == score.max())
            k = best[np.argmin(priority[nodes[best]])]
        else:
            k = np.lexsort((priority[nodes], cpu_left, gpu_left))[0]
        node = int(nodes[k])
        if request.gpus == 0:
            return node, ()
        return node, best_fit_gpus(state.gpu_free[node], request.gpus, int(need[k]))
