"""The consistent view a cycle decides on, and the scheduler's configuration."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType

import numpy as np

from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.model import Allocation
from xirang_platform.scheduling.quota import AccountKey, Balance, OvercommitPolicy, QuotaBook
from xirang_platform.scheduling.scoring import BestFit, NodeScorer
from xirang_platform.scheduling.state import ClusterState


@dataclass(frozen=True)
class SchedulerConfig:
    """How the scheduler behaves; every field has the default DESIGN.md gives.

    - `min_runtime_s`: an allocation younger than this is never preempted (anti-thrash).
    - `starvation_wait_s`: after waiting this long, the oldest blocked gang gets units held back
      from backfill.
    - `preemption`: False turns preemption off (FGD's fill method: a placed pod never moves).
    - `scorer`: the node scorer for single-node placements.
    - `node_priority_seed`: None orders node ties by name; a seed draws a fixed random node order
      (FGD's simulator breaks ties that way).
    """

    overcommit: OvercommitPolicy = field(default_factory=OvercommitPolicy)
    min_runtime_s: float = 600.0
    starvation_wait_s: float = 1800.0
    preemption: bool = True
    scorer: NodeScorer = field(default_factory=BestFit)
    node_priority_seed: int | None = None

    def node_priority(self, node_count: int) -> np.ndarray:
        """Rank of each node in tie-breaks (lower wins); read-only."""
        return _node_priority(self.node_priority_seed, node_count)


@lru_cache(maxsize=16)
def _node_priority(seed: int | None, node_count: int) -> np.ndarray:
    if seed is None:
        order = np.arange(node_count, dtype=np.int64)
    else:
        order = np.random.default_rng(seed).permutation(node_count).astype(np.int64)
    order.setflags(write=False)
    return order


@dataclass(frozen=True)
class Snapshot:
    """The pool, what runs on it, its free capacity and the quota book, as of one instant.

    `state` must agree with `allocations` (use `Snapshot.build` unless you maintain the state
    incrementally, as the simulator does), and so must `balances` when given (a caller that keeps
    them incrementally saves the cycle a walk over every allocation). A cycle never changes a snapshot.
    """

    pool: Pool
    state: ClusterState
    allocations: Mapping[str, Allocation]
    book: QuotaBook
    balances: Mapping[AccountKey, Balance] | None = None  # None: computed from `allocations`

    @classmethod
    def build(cls, pool: Pool, allocations: Iterable[Allocation], book: QuotaBook) -> Snapshot:
        """A snapshot whose state is computed from `allocations`."""
        state = ClusterState(pool)
        by_id: dict[str, Allocation] = {}
        for a in allocations:
            if a.id in by_id:
                raise ValueError(f"allocation {a.id} appears twice in the snapshot")
            state.apply(a.placement)
            by_id[a.id] = a
        return cls(pool, state, MappingProxyType(by_id), book)
