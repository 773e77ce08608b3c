"""What one cycle leaves for the next (`CycleMemo`): the live tick re-runs `cycle` every few seconds
over a mostly unchanged queue and pool, so the next cycle starts from the last one's work.

The memo is data, returned in `CycleResult.memo` and handed back by the caller (`cycle(..., memo=)`);
nothing is kept between calls anywhere else. Every carried fact is checked against the new snapshot
before it is used, so a stale memo (a cycle whose decisions were not applied, another writer, a
different pool) costs time, never a different decision:

- balances and the reclaimable allocations: updated by the difference between the allocations the
  memo saw (as the cycle's decisions leave them) and the snapshot's; carried only by a cycle that
  kept them itself (a caller that hands over its balances, with no victim listed, gets none: a
  fill of 10,000 pods then does not copy every allocation once per pod);
- placements that found no room: carried while no node they could use gained capacity (a node
  that gained is re-checked alone, or its (domain, model) group for a gang);
- whether a shape could ever fit: carried while the pool is the same;
- the queues in order (`order.Queues`) and the last hold of each request, re-used when its reason
  and message are unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from itertools import compress
from operator import is_not

import numpy as np

from xirang_platform.pool.model import Pool
from xirang_platform.scheduling import quota
from xirang_platform.scheduling.config import SchedulerConfig
from xirang_platform.scheduling.holds import KeptHold
from xirang_platform.scheduling.model import Admit, Allocation, Preempt, Request, Return
from xirang_platform.scheduling.order import Queues
from xirang_platform.scheduling.placement import is_single_node, place
from xirang_platform.scheduling.state import ClusterState

PlaceKey = tuple  # (request shape, allowed-nodes token (None: all), milli limit (None: any))


@dataclass(frozen=True)
class CycleMemo:
    """The end of one cycle, as its decisions leave the pool, for the next cycle to start from."""

    pool: Pool
    book: quota.QuotaBook
    config: SchedulerConfig
    state: ClusterState  # free capacity once the cycle's decisions are applied
    # What runs once they are applied, and its balances: None when the cycle kept no books of its own
    # (its caller handed over balances and no victim was listed), so the next cycle needs none from here.
    allocations: Mapping[str, Allocation] | None
    balances: Mapping[quota.AccountKey, quota.Balance] | None  # charged from `allocations`
    # The allocations of `allocations` that may ever be preempted; None when no cycle listed them yet.
    reclaimable: Mapping[str, Allocation] | None
    no_fit: Mapping[PlaceKey, Request]  # placements that found no room on `state`, with a request of the shape
    never_fits: Mapping[tuple, bool]  # per shape: whether it fits nowhere even on the empty pool
    queues: Queues | None  # the pending queues the cycle ordered
    holds: Mapping[str, KeptHold]  # the last hold of each request, its class numbered in `classes`
    classes: Mapping[tuple, int]  # the classes of requests the cycles met, numbered

    def fits(self, pool: Pool, book: quota.QuotaBook, config: SchedulerConfig) -> bool:
        """Whether this memo was made for the same pool, quota book and scheduler settings (the scorer
        aside: it chooses among the placements that exist, and the memo keeps only whether one does)."""
        return (
            (self.pool is pool or self.pool == pool)
            and (self.book is book or self.book == book)
            and (self.config is config or replace(self.config, scorer=config.scorer) == config)
        )


def _charge_key(a: Allocation) -> tuple:
    """What an allocation's charge to its accounts depends on."""
    return (a.request.tenant, a.request.project, a.milli, a.borrowed, a.confirmed)


def carried_books(
    memo: CycleMemo, allocations: Mapping[str, Allocation]
) -> tuple[quota.Balances | None, dict[str, Allocation] | None]:
    """The balances and reclaimable allocations of `allocations`, from the memo's by their difference
    (None, None when the memo carries no books; reclaimable None when it carries none listed)."""
    before = memo.allocations
    if before is None or memo.balances is None:
        return None, None
    balances = dict(memo.balances)
    reclaimable = dict(memo.reclaimable) if memo.reclaimable is not None else None
    book, earlier = memo.book, before.get
    for aid in before.keys() - allocations.keys():
        gone = before[aid]
        quota.charge_allocation(book, balances, gone, -gone.milli)
        if reclaimable is not None:
            reclaimable.pop(aid, None)
    # Only the allocations that are not the very object the memo holds (a C-level pass over all).
    moved = compress(allocations.items(), map(is_not, map(earlier, allocations.keys()), allocations.values()))
    for aid, a in moved:
        old = earlier(aid)
        if old is not None:
            if _charge_key(old) == _charge_key(a) and quota.is_reclaimable(old) == quota.is_reclaimable(a):
                continue
            quota.charge_allocation(book, balances, old, -old.milli)
        quota.charge_allocation(book, balances, a)
        _track(reclaimable, a)
    return balances, reclaimable


def applied(
    allocations: Mapping[str, Allocation],
    reclaimable: Mapping[str, Allocation] | None,
    preempts: Iterable[Preempt],
    returns: Iterable[Return],
    admits: Iterable[Admit],
) -> tuple[dict[str, Allocation], dict[str, Allocation] | None]:
    """The allocations, and the reclaimable ones among them (None: not listed), once a cycle's
    decisions are applied."""
    after = dict(allocations)
    after_reclaimable = dict(reclaimable) if reclaimable is not None else None
    for p in preempts:
        del after[p.victim.id]
        if after_reclaimable is not None:
            after_reclaimable.pop(p.victim.id, None)
    changed = [replace(after[r.request_id], borrowed=False) for r in returns]
    for a in [*changed, *(ad.allocation for ad in admits)]:
        after[a.id] = a
        _track(after_reclaimable, a)
    return after, after_reclaimable


def _track(reclaimable: dict[str, Allocation] | None, a: Allocation) -> None:
    """Keep `a` in `reclaimable` (when listed) exactly when it may ever be preempted."""
    if reclaimable is None:
        return
    if quota.is_reclaimable(a):
        reclaimable[a.id] = a
    else:
        reclaimable.pop(a.id, None)


class Growth:
    """The nodes where any free capacity (GPU milli or memory, CPU, memory) is larger than at the
    memo's end, and the scopes a carried miss is checked on again because of them."""

    def __init__(self, before: ClusterState, now: ClusterState) -> None:
        # Equal row stamps mean equal rows (`derived.py`): only the rows whose stamps differ are compared.
        rows = np.flatnonzero(now.row_stamp != before.row_stamp)
        self.nodes: np.ndarray = np.zeros(len(now.row_stamp), dtype=bool)
        if len(rows):
            gpu = (now.gpu_free[rows] > before.gpu_free[rows]) | (now.gpu_mem_free[rows] > before.gpu_mem_free[rows])
            host = (now.cpu_free[rows] > before.cpu_free[rows]) | (now.mem_free[rows] > before.mem_free[rows])
            self.nodes[rows] = gpu.any(axis=1) | host
        self.none = not self.nodes.any()
        self._groups: np.ndarray | None = None
        self._views: dict[bool, tuple[np.ndarray, ClusterState]] = {}

    def groups(self, state: ClusterState) -> np.ndarray:
        """The nodes of every (domain, model) group that holds a grown node."""
        if self._groups is None:
            group = state.domain_id * (len(state.model_names) + 1) + state.model_id
            self._groups = np.isin(group, np.unique(group[self.nodes]))
        return self._groups

    def still_no_fit(
        self,
        state: ClusterState,
        request: Request,
        allowed: np.ndarray | None,
        limit: int | None,
        config: SchedulerConfig,
        priority: np.ndarray,
    ) -> bool:
        """Whether a placement that found no room at the memo's end still finds none on `state`:
        placement is monotone in free capacity, so only the scopes holding a grown node are looked
        at again (the node; its (domain, model) group for a gang; the pool for a mixed gang)."""
        if self.none:
            return True
        gang = not is_single_node(request)
        if gang and request.tier.rules.mixed_fallback:
            return False
        rows, view = self._view(state, gang)
        scope = allowed[rows] if allowed is not None else None
        return place(view, request, config.scorer, priority[rows], scope, limit) is None

    def _view(self, state: ClusterState, gang: bool) -> tuple[np.ndarray, ClusterState]:
        """The rows re-checked (grown nodes; their groups for a gang) and a copy of them, taken once:
        capacity only shrinks in a cycle until a preemption (which drops the carried misses), so a
        miss on the copy is a miss on the state at any later point of the cycle."""
        if gang not in self._views:
            rows = np.flatnonzero(self.groups(state) if gang else self.nodes)
            self._views[gang] = (rows, state.rows(rows))
        return self._views[gang]
