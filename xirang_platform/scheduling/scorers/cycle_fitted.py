"""The default policy where no workload is known in advance: Xirang against what the cycle sees.

FGD, and `Xirang` as the simulator builds it, measure fragmentation against the trace's typical
workload. The live scheduler has no trace: `CycleFittedXirang` measures against the typical workload of
the single-node requests one cycle sees, pending and running (`SchedulerConfig.fitted` hands them
over), and against `TypicalWorkload.generic()` when it sees none. The scorer a cycle uses depends
only on that cycle's snapshot and queue, so the cycle stays pure; fitted scorers are kept for the
next cycles with the same workload, so their score memo carries over.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np

from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.scorers.fragmentation import TypicalWorkload
from xirang_platform.scheduling.scorers.xirang import TYPICAL_COVERAGE, Xirang
from xirang_platform.scheduling.state import ClusterState


class CycleFittedXirang:
    """`Xirang` whose typical workload is learned from the requests of each cycle (`for_requests`).

    Called directly (`pick` without fitting), it is `Xirang` on the generic workload.
    """

    name = "xirang"
    KEPT = 8  # fitted scorers kept, most recently used last

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.unfitted = Xirang(None, **options)
        self._fitted: OrderedDict[tuple, Xirang] = OrderedDict()

    def for_requests(self, requests: Iterable[Request]) -> Xirang:
        """Xirang against the typical workload of the single-node requests among `requests`."""
        single = [r for r in requests if r.single_node]
        if not single:
            return self.unfitted
        workload = TypicalWorkload.from_requests(single, TYPICAL_COVERAGE)
        key = _key(workload)
        scorer = self._fitted.pop(key, None) or Xirang(workload, **self.options)
        self._fitted[key] = scorer
        while len(self._fitted) > self.KEPT:
            self._fitted.popitem(last=False)
        return scorer

    def node_scores(self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray) -> np.ndarray:
        """Xirang's node-local scores against the generic workload (`NodeLocalScorer`)."""
        return self.unfitted.node_scores(state, request, nodes, need)

    def pick(
        self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray, priority: np.ndarray
    ) -> tuple[int, tuple[int, ...]]:
        """Xirang's choice against the generic workload (a cycle fits the scorer first)."""
        return self.unfitted.pick(state, request, nodes, need, priority)

    def pick_top(
        self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray, priority: np.ndarray
    ) -> tuple[int, tuple[int, ...]]:
        """Xirang's `pick_top` against the generic workload (`NodeLocalScorer`)."""
        return self.unfitted.pick_top(state, request, nodes, need, priority)


def _key(wl: TypicalWorkload) -> tuple:
    return (
        wl.cpu.tobytes(),
        wl.milli.tobytes(),
        wl.gpus.tobytes(),
        wl.prob.round(12).tobytes(),
        tuple(tuple(sorted(m)) for m in wl.models),
    )
