"""Who may borrow what, now: the rules a cycle asks before it runs a request past its cap.

DESIGN.md section 6 lets a P1/P2 request past its cap run on idle units; `docs/design-notes.md`
records how this code refines it: a reclaimed request waits out its back-off unless capacity whose
idleness has lasted (or is forecast to last) covers it, and no borrow takes idle quota that its owner
is forecast to take back before the borrower's first checkpoint (the lending forecast: it saves the
borrower's work where no notice lets it checkpoint, and the churn of lending and reclaiming where
one does, docs/preemption-notice.md). The sums are
`quota`'s; this module decides with them for one cycle.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from xirang_platform.scheduling import quota
from xirang_platform.scheduling.config import SchedulerConfig
from xirang_platform.scheduling.model import Allocation, Request
from xirang_platform.scheduling.quota import AccountKey, IdleHistory
from xirang_platform.scheduling.snapshot import Snapshot
from xirang_platform.scheduling.state import ClusterState

IdleView = dict[AccountKey, int]


def idle_views(
    history: IdleHistory | None, config: SchedulerConfig, allocations: Iterable[Allocation], now: float
) -> tuple[IdleView | None, IdleView | None]:
    """A snapshot's `lasting_idle` and `idle_ahead` from the lenders' `history` (the simulator's, or
    the ledger's for the live tick), both None without one. `idle_ahead` is None when the forecast is
    off; else it covers the tenants whose in-quota work includes a tier that preempts victims younger
    than a checkpoint interval (P0 by default), the idle quota `history` forecasts to stay idle that
    long. Other owners take units back only from victims old enough to have checkpointed, so their
    idle quota is lent as it comes."""
    if history is None:
        return None, None
    lasting = history.lasting_idle(now, config.lend_after_s)
    step, span = config.checkpoint_interval_s, config.lend_forecast_s
    if step is None or span is None:
        return lasting, None
    fast = {
        a.request.tenant for a in allocations if not a.borrowed and config.min_runtime_for(a.request.tier.rules) < step
    }
    return lasting, history.idle_ahead(now, span, step, fast)


@dataclass(frozen=True)
class Lending:
    """The borrowing rules of one cycle: its snapshot (book, idle history, forecast), config and clock.
    The balances and the capacity state are the cycle's own, passed in as they move."""

    snapshot: Snapshot
    config: SchedulerConfig
    now: float

    def may_borrow(self, request: Request, balances: quota.Balances, state: ClusterState) -> bool:
        """Whether `request` may run past its cap now: its tier may borrow, it fits in the free units
        their owners are not forecast to take back soon, and if a borrowed run of it was reclaimed, its
        back-off has ended or it fits in capacity whose idleness has lasted (or is forecast to last)."""
        if not request.tier.may_borrow or self.forecast_refuses(request, balances, state):
            return False
        reclaimed = request.reclaimed_at
        if reclaimed is None or self.now - reclaimed >= self.config.borrow_backoff_s(request.reclaims):
            return True
        return request.total_milli <= self.lasting_lendable(request, balances, state)

    def lasting_lendable(self, request: Request, balances: quota.Balances, state: ClusterState) -> int:
        """The milli `request`'s tenant may borrow out of idle quota that stayed idle `lend_after_s` or
        is forecast to stay idle a checkpoint interval (0 when the snapshot carries no idle history)."""
        lasting = self.snapshot.lasting_idle
        if lasting is None:
            return 0
        idle = quota.staying_idle(lasting, self.snapshot.idle_ahead)
        return quota.lasting_lendable(self.snapshot.book, balances, idle, state.capacity_milli, request.tenant)

    def lendable_ahead(self, request: Request, balances: quota.Balances, state: ClusterState) -> int:
        """The free milli `request` may borrow, less the idle quota its owners are forecast to take back
        within a checkpoint interval (`quota.lendable_ahead`)."""
        free = state.capacity_milli - state.allocated_milli
        return quota.lendable_ahead(balances, self.snapshot.idle_ahead, free, request.tenant)

    def forecast_refuses(self, request: Request, balances: quota.Balances, state: ClusterState) -> bool:
        """Whether the lending forecast (`Snapshot.idle_ahead`, when there is one) leaves too little to lend."""
        if self.snapshot.idle_ahead is None:
            return False
        return request.total_milli > self.lendable_ahead(request, balances, state)

    def wait_text(self, request: Request, balances: quota.Balances, state: ClusterState) -> str:
        """Why a request may not borrow now, and when it may."""
        if self.forecast_refuses(request, balances, state):
            lendable = self.lendable_ahead(request, balances, state)
            return quota.forecast_text(self.config.checkpoint_interval_s, lendable)
        again = (request.reclaimed_at or 0.0) + self.config.borrow_backoff_s(request.reclaims)
        text = f"its borrowed run was reclaimed at t={request.reclaimed_at:g}, so it may borrow again from t={again:g}"
        if self.snapshot.lasting_idle is None:
            return text
        lendable = max(0, self.lasting_lendable(request, balances, state))
        return f"{text}, or sooner out of quota idle for {self.config.lend_after_s:g} s ({lendable} milli now)"
