"""One scheduling cycle: `cycle(snapshot, pending, now, config) -> CycleResult` (DESIGN.md section 5).

Pure and deterministic: it works on a copy of the snapshot's state, reads no clock but `now`, and
returns its decisions as data. The simulator and the Dagster layer call this same function and
apply the decisions through `apply.apply_cycle`, in the order returns, preempts, shrinks, admits,
growths (elastic runs: `elastic`); a preempted victim waits again as `Preempt.requeued()`.

Requests of one class (shape, tenant, project, borrow back-off) meet the same answer until an
admission or preemption changes their tenant's balances, the cap ratio or the pool's free capacity
grows: a class's hold is decided once and repeated for the rest of it. The live tick passes each
cycle's `CycleResult.memo` to the next (`cycle_memo.CycleMemo`), which decides the same, faster.

`_CycleRun` holds the rules, method by method in the order of DESIGN.md section 5; what they
record goes through its books (`cycle_books.CycleBooks`: the private copy of capacity and balances,
the decisions), and every answer it re-uses through one cache (`cycle_cache.CycleCache`).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

from xirang_platform.scheduling import quota
from xirang_platform.scheduling.config import DEFAULT_CONFIG, SchedulerConfig
from xirang_platform.scheduling.cycle_cache import AWAITS_LENDING
from xirang_platform.scheduling.cycle_memo import CycleMemo
from xirang_platform.scheduling.elastic import ElasticBooks, at_minimum
from xirang_platform.scheduling.holds import (
    CLASS_HOLDS,
    MOST_RESERVATION_MOVES,
    BackfillIndex,
    GangReservations,
    ReservedGang,
    already_running_message,
    deferred_message,
    hold_ratio,
    is_gang,
    never_fits_message,
    no_fit_message,
    reservation_scope,
    rounded_past_cap_message,
)
from xirang_platform.scheduling.model import (
    Allocation,
    HoldReason,
    Placement,
    Request,
)
from xirang_platform.scheduling.order import Queues, queue_order
from xirang_platform.scheduling.placement import place
from xirang_platform.scheduling.preemption.cost import Plan
from xirang_platform.scheduling.preemption.reference import plan_preemption_exhaustive
from xirang_platform.scheduling.preemption.victims import Headroom
from xirang_platform.scheduling.result import CycleResult, CycleWork
from xirang_platform.scheduling.snapshot import Snapshot

_ID = attrgetter("id")


def cycle(
    snapshot: Snapshot,
    pending: Sequence[Request],
    now: float,
    config: SchedulerConfig = DEFAULT_CONFIG,
    memo: CycleMemo | None = None,
    out_of_time: Callable[[], bool] | None = None,
) -> CycleResult:
    """Decide, for every pending request, admit (maybe after preempting), or hold with a reason.

    `memo`: the previous cycle's `CycleResult.memo`, to start from its work (the same decisions; a
    memo made for another pool, book or config is ignored). `out_of_time`: the live tick's
    wall-clock guard; once it says so, every request not yet decided is held `deferred` (DESIGN.md
    5.6; without it the cycle is bounded by its step budget alone, and decides the same anywhere)."""
    fitted = config.fitted(pending, (a.request for a in snapshot.allocations.values()))
    if memo is not None and not memo.fits(snapshot.pool, snapshot.book, fitted):
        memo = None
    run = _CycleRun(snapshot, now, fitted, memo, out_of_time)
    # Elastic requests take their turn at their smallest size; what is left enlarges them at the end.
    if any(r.elastic is not None for r in pending):
        pending = [at_minimum(r) for r in pending]
    run.start_elastic(pending)
    # A request already running is never admitted again: held with a reason, out of the order.
    pending = run.hold_running(pending)
    queues = Queues.of(pending, memo.queues if memo is not None else None)
    run.queues = queues
    # Starving gangs get units held back before anything is placed, so the hold binds every request
    # it concerns whatever its place in the order.
    run.reserve_for_starving_gangs()
    # Order: tier, resumed first, fair share between tenants, submit time, id; admit what fits in
    # quota. A request that would borrow waits for the lending pass.
    run.consider(queue_order(pending, snapshot.book, run.balances, queues))
    # A gang blocked since its hold lifted, or since it came to its turn, gets units held from here on.
    if run.reservations.blocked is None:
        run.hold_for_blocked_gang()
    # Requests a hold kept out get another turn, in the same order, once its gang got its units.
    run.reconsider_held()
    # Idle units are lent only once every in-quota request of the cycle had its turn.
    run.lend()
    # Automatic return last: a return takes only the room under the cap that this cycle's admissions
    # left, so it never creates an overage that a preemption would then have to repair.
    run.return_borrowed()
    # Elastic runs: this cycle's admissions at the largest size that fits in what the queue left, then
    # running ones grown into lasting idle units nobody waiting wants (DESIGN.md section 11).
    run.extend_admitted()
    run.grow_running()
    return run.result()


@dataclass
class _CycleRun(ElasticBooks):
    """The rules of one cycle (DESIGN.md section 5), in the order the section gives them, over the
    cycle's books (`CycleBooks`: capacity, balances, decisions and the cache)."""

    reservations: GangReservations = field(default_factory=GangReservations)  # units held back for starving gangs
    held_ids: frozenset[str] = frozenset()  # the gangs `reservations` holds units for
    held_for_gang: list[Request] = field(default_factory=list)  # held `reserved-for-gang` by this hold, in order
    to_reconsider: list[Request] = field(default_factory=list)  # held by a hold that has since changed
    borrowers: list[Request] = field(default_factory=list)  # would borrow: considered in the lending pass
    lending_open: bool = False  # the lending pass has begun: a request past its cap borrows at its turn
    backfill: BackfillIndex | None = None
    starving: list[Request] | None = None  # the gangs past the starvation bound, highest tier first, then oldest
    timed_out: bool = False  # the wall-clock guard said so: every request not yet decided is deferred
    reservation_moves: int = -1  # changes of the gang reservation after its first (`holds.MOST_RESERVATION_MOVES`)
    turns: int = 0  # requests considered, each turn (`result.CycleWork`)

    # -- 5.1, 5.4: every request in order, as many admitted as fit ----------------------------------

    def consider(self, requests: Iterable[Request]) -> None:
        """Decide each request in turn: the hold its class met, if nothing that answer depends on
        changed since; else `_consider` it. (The loop most of a steady tick is spent in: kept lean.)

        Python's cycle collector is paused meanwhile (and restored as the caller had it): the loop
        makes no reference cycles, but a fill makes several objects per admission and hold, and each
        full collection walks every object the process holds (issue 9: about 5% of a 16,000-node fill).
        """
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._consider_each(requests)
        finally:
            if collecting:
                gc.enable()

    def _consider_each(self, requests: Iterable[Request]) -> None:
        answer, holds, out_of_time = self.cache.answer, self.holds, self.out_of_time
        for request in requests:
            self.turns += 1
            if out_of_time is not None and (self.timed_out or out_of_time()):
                self.timed_out = True
                self.class_no = self.cache.class_of(request)
                self._hold(request, HoldReason.DEFERRED, None, deferred_message)
                continue
            class_no, known, hold = answer(request, self.held_ids)  # a gang units are held for: afresh
            if hold is not None:  # the hold its class met stands
                if hold.reason is HoldReason.RESERVED_FOR_GANG:
                    self.held_for_gang.append(request)  # another turn once the hold changes
                holds.append(hold)
                continue
            if known is AWAITS_LENDING:  # its class waits for the lending pass
                self.borrowers.append(request)
                continue
            admitted, self.last_hold, self.class_no = len(self.admits), None, class_no
            self._consider(request)
            held = self.last_hold
            # A hold that needs room to exist (rounded past the cap) may not outlive another
            # tenant's admission, which moves neither the epoch nor this tenant's version.
            if held is AWAITS_LENDING or (
                len(self.admits) == admitted
                and held is not None
                and held.reason in CLASS_HOLDS
                and held.build is not rounded_past_cap_message
            ):
                self.cache.remember(class_no, request.tenant, held)

    # -- 5.2: quota check, placement, preemption ----------------------------------------------------

    def _consider(self, request: Request) -> None:
        """Quota check, placement, and if needed a preemption plan, for one request."""
        # Whether the account exists and its caps could ever hold the request: the same answer for
        # its whole class (tenant, project and shape decide it), so a class that passed passes.
        if not self.cache.account_holds(self.class_no):
            if not self.book.knows(request.tenant, request.project):
                check = quota.check(self.book, self.balances, request, self.ratio)
                self._hold(request, HoldReason.UNKNOWN_ACCOUNT, check.message)
                return
            never = quota.cap_never_fits(self.book, request, self.config.overcommit)
            if never is not None:
                self._hold(request, HoldReason.EXCEEDS_CAP, never.message)
                return
            self.cache.account_held(self.class_no)
        allowed = self.reservations.allowed_for(request)
        headroom = self.headroom(request)
        placement = self.cache.place(request, allowed, headroom)
        if placement is None and self.may_borrow(request):
            placement = self.cache.place(request, allowed, None)
            if placement is not None and self._defer_borrow(request, headroom):
                return
        if placement is not None:
            self._admit(request, placement, headroom)
            return
        # The verdict is needed only now, and placing changed neither the balances nor the ratio.
        check = quota.check(self.book, self.balances, request, self.ratio)
        if self.cache.never_fits(request):
            self._hold(request, HoldReason.NEVER_FITS, None, never_fits_message)
            return
        if self._try_preemption(request, check, allowed):
            return
        self._hold_waiting(request, check, allowed)

    def _hold_waiting(self, request: Request, check: quota.QuotaCheck, allowed: np.ndarray | None) -> None:
        """Hold a request that may run later: over its cap, behind the gang reservation, or no room."""
        if check.verdict is quota.Verdict.OVER_QUOTA:
            self._hold(request, HoldReason.OVER_QUOTA, check.message)
            return
        if check.verdict is quota.Verdict.BORROW and not self.may_borrow(request):
            wait = self.lending.wait_text(request, self.balances, self.state)
            self._hold(request, HoldReason.OVER_QUOTA, f"{check.message[: check.message.index(';')]}; {wait}")
            return
        rounded_past_cap = check.verdict is quota.Verdict.IN_QUOTA and not request.tier.may_borrow
        if rounded_past_cap and self.cache.place(request, allowed, None) is not None:
            self._hold(request, HoldReason.OVER_QUOTA, self.headroom(request), rounded_past_cap_message)
            return
        gang = self.reservations.binding(request) if allowed is not None else None
        if gang is not None and self.cache.fits_anywhere(request):
            message = f"units are held back for the starving gang {gang.id}"
            self._hold(request, HoldReason.RESERVED_FOR_GANG, message)
            self.held_for_gang.append(request)
            return
        self._hold(request, HoldReason.NO_FIT, None, no_fit_message)

    def _try_preemption(self, request: Request, check: quota.QuotaCheck, allowed: np.ndarray | None) -> bool:
        """Plan and record a preemption for `request`; True if it was admitted that way, or held
        `deferred` because the cycle's search budget is spent (DESIGN.md 5.6)."""
        if not self.config.preemption:
            return False
        key = (request.shape, request.tenant, request.project, check.verdict, allowed is None)
        # A plan of shrinks alone comes first (`elastic`); one that failed for the key fails again until
        # capacity grows (a shrink or a stop: `CycleCache.capacity_grew`), unless the budget cut it.
        shrinks = ("shrinks", *key[:4], self.cache.allowed_token(allowed), self.may_borrow(request))
        if not self.cache.no_plan(shrinks):
            if self.try_shrinks(request, allowed):
                return True
            if not self.steps.spent:
                self.cache.found_no_plan(shrinks)
        if check.verdict is quota.Verdict.BORROW and not request.tier.rules.may_preempt:
            return False  # past its cap, a tier that may not preempt runs on idle units only
        if self.cache.no_plan(key):
            return False
        if self.victims.none_for(request, self.book, self.balances, self.ratio):
            self.cache.found_no_plan(key)
            return False
        if not self.steps.begin():
            self._hold(request, HoldReason.DEFERRED, None, deferred_message)
            return True
        room = Headroom(request, self.state, self.book, self.balances, self.config)
        if self.config.exhaustive_preemption:
            candidates = self.victims.candidates(request, self.state, self.book, self.balances, self.ratio)
            args = (room, self.victims.cost, self.config.scorer, self.priority, allowed)
            plan = plan_preemption_exhaustive(self.state, request, candidates, *args) if candidates else None
        else:
            table = self.victims.listed(self.state)
            mask = table.eligible(request, self.book, self.balances, self.ratio)
            found = self.planner.plan(self.state, request, mask, room, allowed)
            under = quota.under_cap(self.book, self.balances, request.tenant, request.project, self.ratio)
            victims = [(table.ordered[k], table.reason(request, k, under)) for k in found[0]] if found else []
            plan = Plan(tuple(victims), found[1]) if found else None
        if plan is None:
            if not self.steps.cut:  # a search the budget stopped is no answer for the rest of the key
                self.cache.found_no_plan(key)
            return False
        for victim, reason in plan.victims:
            self._preempt(victim, request, reason)
        self.cache.capacity_grew()
        if self._admit(request, plan.placement).borrowed:
            raise AssertionError(f"a preemption admitted {request.id} past its cap: a scheduler bug")
        return True

    # -- 5.3: the gang reservation -------------------------------------------------------------------

    def reserve_for_starving_gangs(self) -> None:
        """Hold units back for starving gangs (`holds.is_gang`, past the starvation bound, that could
        run in quota), highest tier first, then oldest: the oldest keeps where it fits now, if it does,
        and the oldest blocked one (it does not fit now) gets the nodes `reservation_scope` picks among
        the rest. Never for a gang that could only run borrowed."""
        gangs: list[ReservedGang] = []
        blocked = None
        free: np.ndarray | None = None  # the nodes not held for the oldest gang
        fits_beside: dict[tuple, bool] = {}  # per shape: whether it fits on `free` (one state: one answer)

        def fits(gang: Request) -> bool:
            if free is None:
                return self.cache.fits_anywhere(gang)
            found = fits_beside.get(gang.shape)
            if found is None:
                found = fits_beside[gang.shape] = self.cache.place(gang, free, None) is not None
            return found

        # Once the oldest is held, a gang that fits beside it needs no hold: skipped unchecked.
        for gang in self._starving_gangs(lambda g: not gangs or not fits(g)):
            if not fits(gang):
                scope = reservation_scope(self.state, gang, self.priority, free)
                if scope is not None:
                    gangs.append(ReservedGang(gang, scope))
                    blocked = gang
                    break
            elif not gangs:
                fits_now = place(self.state, gang, self.config.scorer, self.priority)
                if fits_now is not None:
                    where = np.isin(np.array(self.state.names), fits_now.nodes)
                    gangs.append(ReservedGang(gang, where))
                    free = ~where
        self._set_reservations(GangReservations(gangs, blocked))

    def hold_for_blocked_gang(self) -> None:
        """Once the blocked gang's hold has done its work (or none was made), the hold passes to the
        oldest starving gang held `no-fit` so far this cycle (blocked now: capacity only shrank since)."""
        blocked_id = getattr(self.reservations.blocked, "id", None)
        kept = [held for held in self.reservations.gangs if held.gang.id != blocked_id]
        held = kept[0].nodes if kept else None
        made = self.cache.kept_holds

        def blocked(gang: Request) -> bool:
            found = made.get(gang.id)
            held_no_fit = found is not None and found.hold.reason is HoldReason.NO_FIT
            return held_no_fit and all(k.gang.id != gang.id for k in kept)

        # Each move gives the requests the old hold kept out another turn: bounded, so a cycle in which
        # many starving gangs get their units does not consider the queue once per gang (the rest get
        # their hold next cycle).
        moves_left = self.reservation_moves < MOST_RESERVATION_MOVES
        for gang in self._starving_gangs(blocked) if moves_left else ():
            scope = reservation_scope(self.state, gang, self.priority, None if held is None else ~held)
            if scope is not None:
                self._set_reservations(GangReservations([*kept, ReservedGang(gang, scope)], gang))
                return
        if len(kept) < len(self.reservations.gangs):  # else nothing changed
            self._set_reservations(GangReservations(kept))

    def _starving_gangs(self, among: Callable[[Request], bool]) -> Iterator[Request]:
        """The gangs (of those `among` accepts) past the starvation bound, not admitted, that could run
        in quota, highest tier first, then oldest. The caller changes no balance while it reads them."""
        if self.queues is None or math.isinf(self.config.starvation_wait_s):  # inf: fill mode
            return
        if self.starving is None:  # the same gangs all cycle long
            self.starving = self.queues.oldest_first(self.now, self.config.starvation_wait_s, is_gang)
        admitted: set[str] | None = None
        verdicts: dict[tuple, bool | None] = {}  # per account and size: `_quota_verdict`
        for gang in self.starving:
            if not among(gang):
                continue
            if admitted is None:
                admitted = {a.request_id for a in self.admits}
            if gang.id in admitted:
                continue
            key = (gang.tenant, gang.project, gang.total_milli, gang.tier.rank)
            verdict = verdicts[key] if key in verdicts else verdicts.setdefault(key, self._quota_verdict(gang))
            if verdict is False or self.cache.never_fits(gang):
                continue
            if verdict or self._in_quota_without_backfill(gang):
                yield gang
            else:  # a younger gang of the same account, size and tier has less backfill to discount
                verdicts[key] = False

    def _set_reservations(self, reservations: GangReservations) -> None:
        """Make `reservations` the cycle's: the requests the old ones kept out get another turn, and answers
        given under it no longer stand."""
        self.reservation_moves += 1
        self.reservations = reservations
        self.held_ids = frozenset(held.gang.id for held in reservations.gangs)
        self.to_reconsider.extend(self.held_for_gang)
        self.held_for_gang = []
        self.cache.new_epoch()

    def _admit(self, request: Request, placement: Placement, headroom: int | None = None) -> Allocation:
        """Admit `request` on `placement` (`CycleBooks._admit_on`); a gang units were held for lifts
        its hold, which passes to the next blocked gang if it was the blocked one."""
        allocation = self._admit_on(request, placement, headroom)
        if request.id in self.held_ids:  # its hold has done its work
            if self.reservations.blocked is not None and request.id == self.reservations.blocked.id:
                self.hold_for_blocked_gang()  # the next blocked gang's, if any
            else:
                self._set_reservations(
                    GangReservations(
                        [g for g in self.reservations.gangs if g.gang.id != request.id], self.reservations.blocked
                    )
                )
        return allocation

    def _quota_verdict(self, gang: Request) -> bool | None:
        """Whether `gang` could run in quota: True at the ratio now, False not even at the highest one
        (or no such account), None when it depends on the backfill (`_in_quota_without_backfill`)."""
        if not self.book.knows(gang.tenant, gang.project):
            return False
        need = gang.total_milli
        if self.headroom(gang) >= need:
            return True
        most = quota.headroom(self.book, self.balances, gang.tenant, gang.project, self.config.overcommit.max_ratio)
        return None if most >= need else False

    def _in_quota_without_backfill(self, gang: Request) -> bool:
        """Whether `gang` fits its caps at the ratio without the backfill its hold is there to stop
        (`holds.hold_ratio`)."""
        ratio = hold_ratio(self.config.overcommit, self.state, self._backfill_since(gang))
        return quota.headroom(self.book, self.balances, gang.tenant, gang.project, ratio) >= gang.total_milli

    def _backfill_since(self, gang: Request) -> int:
        """GPU milli of the work of `gang`'s tier or below admitted since it was submitted and still
        held: the snapshot's (less this cycle's victims) and this cycle's admissions."""
        if self.backfill is None:
            self.backfill = BackfillIndex.of(self.snapshot.allocations.values())
        rank, since = gang.tier.rank, gang.submit_time
        milli = self.backfill.since(rank, since)
        for p in self.preempts:
            if p.victim.request.tier.rank >= rank and p.victim.start >= since:
                milli -= p.victim.milli
        return milli + sum(self.admitted_milli[rank:])

    def reconsider_held(self) -> None:
        """Consider again, in their order, the requests a hold kept out once it changed (its gang got
        its units), until no hold changes."""
        while self.to_reconsider:
            again, self.to_reconsider = self.to_reconsider, []
            ids = {r.id for r in again}
            self.holds = [h for h in self.holds if h.request_id not in ids]
            self.consider(again)

    # -- 5.5: lending, returns, requests already running --------------------------------------------

    def hold_running(self, pending: Sequence[Request]) -> Sequence[Request]:
        """Hold every pending request whose id is already running (DESIGN.md 5.5); the rest, in order."""
        running = self.snapshot.allocations
        if not running or running.keys().isdisjoint(map(_ID, pending)):
            return pending
        for r in pending:
            if r.id in running:
                self.class_no = self.cache.class_of(r)  # the memo files every hold under its request's class
                self._hold(r, HoldReason.ALREADY_RUNNING, running[r.id].start, already_running_message)
        return [r for r in pending if r.id not in running]

    def _defer_borrow(self, request: Request, headroom: int) -> bool:
        """Whether `request`, past its cap and with room to borrow now, waits for the lending pass
        (DESIGN.md 5.5: a borrower never takes units a pending in-quota request of their owner could
        use in the same cycle). A gang units are held for borrows at its turn: the hold already keeps
        its nodes from the others. One that finds no room is held (or plans a preemption) at its turn."""
        if self.lending_open or headroom >= request.total_milli or request.id in self.held_ids:
            return False
        self.borrowers.append(request)
        self.last_hold = AWAITS_LENDING  # the rest of its class waits too, until its tenant or the epoch moves
        return True

    def lend(self) -> None:
        """The lending pass: the requests that would borrow, in their order, on what in-quota work left."""
        self.lending_open = True
        if not self.borrowers:
            return
        self.cache.new_epoch()  # no class waits for this pass any more
        borrowers, self.borrowers = self.borrowers, []
        self.consider(borrowers)
        self.reconsider_held()

    def return_borrowed(self) -> None:
        """Automatic return, oldest first: a borrowed allocation turns in-quota when its accounts have
        room for it both before this cycle and after it (so every step of the applied log keeps its caps)."""
        if not any(b.borrowed for b in self.balances.values()):
            return
        stopped = {p.victim.id for p in self.preempts}
        stopped |= self.resized.keys()
        borrowed = [a for a in self.snapshot.allocations.values() if a.borrowed and a.id not in stopped]
        fit_before = quota.returnable(self.book, self.start_balances, borrowed, self.start_ratio)
        for a in quota.returnable(self.book, self.balances, fit_before, self.ratio):
            self._return(a)

    # -- the result ---------------------------------------------------------------------------------

    def result(self) -> CycleResult:
        return CycleResult(
            admits=tuple(self.admits),
            preempts=tuple(self.preempts),
            holds=tuple(self.holds),
            returns=tuple(self.returns),
            resizes=tuple(self.resizes),
            reserved_for=oldest.id if (oldest := self.reservations.oldest) is not None else None,
            work=CycleWork(
                plan_steps=self.config.plan_steps_per_cycle - self.steps.cycle_left,
                placements=self.cache.placements,
                reservation_moves=max(0, self.reservation_moves),
                turns=self.turns,
                elastic_placements=self.elastic_placements,
            ),
            # Resized runs and enlarged admissions are not what the memo's books would carry.
            memo=None if self.resizes or self.extended else self._memo(),
        )
