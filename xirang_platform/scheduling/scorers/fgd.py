"""Fragmentation gradient descent (Weng et al., USENIX ATC '23), scored as FGD's repository does."""

from __future__ import annotations

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.scorers.base import lowest_priority
from xirang_platform.scheduling.scorers.fragmentation import (
    TypicalWorkload,
    frag_after_share,
    frag_after_whole,
    sigmoid_score,
)
from xirang_platform.scheduling.scorers.memo import ContentMemo, lone_candidate_gpus, memo_scores
from xirang_platform.scheduling.state import ClusterState


class FGD:
    """Fragmentation gradient descent, as FGD's repository scores it.

    Node score int(100 * sigmoid(-dF / 1000)) where dF is the node's fragmentation increase
    (`fragmentation.py`); a GPU share tries every GPU that fits and keeps the best score, first
    index on ties; whole GPUs are the lowest-index free ones; node ties go to the lowest priority.
    """

    name = "fgd"

    def __init__(self, workload: TypicalWorkload | None = None) -> None:
        self.workload = workload or TypicalWorkload.generic()
        self.memo = ContentMemo(self._evaluate, self.workload.access)  # FGD's rule: no access = all free is fragment

    def _evaluate(
        self, cpu: np.ndarray, left: np.ndarray, access: np.ndarray | None, req_cpu: int, need: int, gpus: int
    ):
        access = access if self.workload.models else None  # no constraints: every shape counts, at its probability
        if gpus == 1 and need < MILLI_PER_GPU:
            before, after = frag_after_share(cpu, left, req_cpu, need, self.workload, access)
            per_gpu = np.where(np.isinf(after), -1, sigmoid_score(after - before[:, None]))
            choice = per_gpu.argmax(axis=1)  # first index on ties
            return per_gpu.max(axis=1).astype(np.float64), choice
        before, after = frag_after_whole(cpu, left, req_cpu, gpus, self.workload, access)
        return sigmoid_score(after - before).astype(np.float64), np.full(len(cpu), -1)

    def node_scores(self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray) -> np.ndarray:
        """Node-local (`NodeLocalScorer`): each node's score from its own content; `pick` takes a top one."""
        return memo_scores(self.memo, state, request, nodes, need)[0]

    def pick(
        self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray, priority: np.ndarray
    ) -> tuple[int, tuple[int, ...]]:
        score, _, needs = memo_scores(self.memo, state, request, nodes, need)
        top = score == score.max()
        return self.pick_top(state, request, nodes[top], needs[top], priority)

    def pick_top(
        self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray, priority: np.ndarray
    ) -> tuple[int, tuple[int, ...]]:
        """`pick` among `nodes` that share the top score (`NodeLocalScorer`): the lowest priority."""
        node = lowest_priority(nodes, priority)
        k = int(np.searchsorted(nodes, node))
        return node, lone_candidate_gpus(self.memo, state, request, node, int(need[k]))
