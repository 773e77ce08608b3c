"""The consistent view a cycle decides on."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.config import SchedulerConfig as SchedulerConfig  # re-exported for callers
from xirang_platform.scheduling.model import Allocation
from xirang_platform.scheduling.quota import AccountKey, Balance, QuotaBook
from xirang_platform.scheduling.state import ClusterState


@dataclass(frozen=True)
class Snapshot:
    """The pool, what runs on it, its free capacity and the quota book, as of one instant.

    `state` must agree with `allocations` (use `Snapshot.build` unless you maintain the state
    incrementally, as the simulator does), and so must `balances` when given (a caller that keeps
    them incrementally saves the cycle a walk over every allocation). A cycle never changes a snapshot.
    `lasting_idle` is, per tenant account, the least idle quota it had over the last
    `SchedulerConfig.lend_after_s` (`quota.IdleHistory`); None when the caller keeps no such history.
    `idle_ahead` is, per tenant account, how much of its idle quota is forecast to stay idle for the
    checkpoint interval (`IdleHistory.idle_ahead` over `SchedulerConfig.lend_forecast_s`); None: no forecast.
    `lasting_free` is the least free GPU milli of the pool over the last
    `SchedulerConfig.elastic_grow_idle_s` (`elastic.LastingFree`): what elastic runs may grow into.
    """

    pool: Pool
    state: ClusterState
    allocations: Mapping[str, Allocation]
    book: QuotaBook
    balances: Mapping[AccountKey, Balance] | None = None  # None: computed from `allocations`
    lasting_idle: Mapping[AccountKey, int] | None = None  # None: see `lending.Lending.may_borrow`
    idle_ahead: Mapping[AccountKey, int] | None = None  # None: every idle unit may be lent
    lasting_free: int | None = None  # None: no elastic run grows (`elastic.LastingFree`)

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
