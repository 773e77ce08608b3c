"""Elastic training in the cycle (DESIGN.md section 11): admission at the largest size that fits,
growth into lasting idle units, and shrinks instead of stops.

The rules, in the order a cycle applies them (`ElasticBooks`; docs/design-notes.md, record E1):

1. **Admission.** In the normal pass (and the lending pass) an elastic request is considered at its
   minimum size (`at_minimum`), so it takes no unit another request of the queue could use in this
   cycle. Once every request had its turn, each elastic admission of the cycle is enlarged to the
   largest size that fits in what is left (`extend_admitted`): in quota where it was admitted in
   quota, borrowed where it borrowed.
2. **Shrinks.** An elastic run's size above its minimum is preemptible by any request, whatever
   its tier (it was taken from units nobody waiting wanted; its minimum keeps its tier's rules).
   A request that does not fit first tries a plan of shrinks alone (`plan_shrinks`): candidates
   lowest tier, borrowed, largest surplus first, each shrunk to its minimum until the request fits;
   then every shrink it does not need is undone, newest first, and each one kept is raised back to
   the largest size that still lets it fit; a run shrunk again in the cycle keeps one resize. A shrink loses
   only the restart (the run checkpoints on its notice), a stop loses the work since the last
   checkpoint and the whole run's place, so a plan of shrinks is preferred to any plan that stops a
   run. A plan mixing shrinks and stops is not searched: without a shrinks-only plan the bounded
   planner plans stops (`preemption/`).
3. **Growth.** A running elastic run grows (`grow_running`) only into milli that stayed free for
   `elastic_grow_idle_s` (`Snapshot.lasting_free`, `LastingFree`) and that nobody waiting wants: the
   free milli less what every request held for room this cycle asks. A run grows within the cap it
   runs under: an in-quota run in quota, a borrowed one borrowed (an `Allocation` is borrowed or not,
   and turning an in-quota run borrowed would move its in-quota part out of its tenant's books: a
   request of the tenant would then find room in quota that stopping the run no longer gives back).

Bounds (`result.CycleWork.elastic_placements` counts the placements they try): extending or growing
one run tries at most `size_tries(len(range.sizes()))` placements (a bisection over its sizes); a
shrink plan tries one placement per candidate, per undo and per bisection step of a kept shrink,
each one step of the planner's budget (`preemption.scope_search.Steps`), and stops once the
request's steps are spent (one more for the plan's last check): at most `plan_steps_per_request + 1`
per request, within the cycle's steps.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling import quota
from xirang_platform.scheduling.cycle_books import CycleBooks
from xirang_platform.scheduling.holds import GangReservations
from xirang_platform.scheduling.model import (
    Admit,
    Allocation,
    GpuSlice,
    HoldReason,
    NodeShare,
    Placement,
    PreemptReason,
    Request,
    Resize,
    ResizeKind,
)
from xirang_platform.scheduling.placement import place
from xirang_platform.scheduling.preemption.planner import PreemptionPlanner
from xirang_platform.scheduling.preemption.victims import CycleVictims, reason_for
from xirang_platform.scheduling.state import ClusterState

# Holds of requests that wait for room: growth leaves the milli they ask for.
WANTS_ROOM = (HoldReason.NO_FIT, HoldReason.RESERVED_FOR_GANG, HoldReason.DEFERRED)


def at_size(request: Request, gpus: int) -> Request:
    """`request` asking `gpus` GPUs, its CPU and memory scaled with them (totals per size)."""
    if gpus == request.gpus:
        return request
    return replace(
        request,
        gpus=gpus,
        cpu_milli=request.cpu_milli * gpus // request.gpus,
        memory_mib=request.memory_mib * gpus // request.gpus,
    )


def at_minimum(request: Request) -> Request:
    """An elastic request as the normal pass considers it: at its smallest size (others unchanged)."""
    if request.elastic is None:
        return request
    return at_size(request, request.elastic.min)


def size_tries(sizes: int) -> int:
    """The most placements a bisection over `sizes` candidate sizes tries (the stated bound)."""
    return math.ceil(math.log2(sizes)) + 1 if sizes > 0 else 0


def shrunk_placement(placement: Placement, request: Request) -> Placement:
    """`placement` holding only `request.gpus` of its whole GPUs: GPUs go from the nodes where it holds
    fewest first (so nodes empty out whole), in name order among equals; CPU and memory
    are split over the nodes kept in proportion to the GPUs there."""
    per_node: dict[str, list[GpuSlice]] = {}
    for s in placement.slices:
        per_node.setdefault(s.node, []).append(s)
    drop = len(placement.slices) - request.gpus
    if drop < 0:
        raise ValueError(f"cannot shrink {len(placement.slices)} GPUs to {request.gpus}")
    for node in sorted(per_node, key=lambda n: (len(per_node[n]), n)):
        if drop == 0:
            break
        take = min(drop, len(per_node[node]))
        per_node[node] = per_node[node][: len(per_node[node]) - take]
        drop -= take
    kept = [(n, per_node[n]) for n in (s.node for s in placement.shares) if per_node.get(n)]
    return Placement(
        slices=tuple(s for _, slices in kept for s in slices),
        shares=_split_shares([(n, len(slices)) for n, slices in kept], request),
    )


def _split_shares(gpus_per_node: list[tuple[str, int]], request: Request) -> tuple[NodeShare, ...]:
    total = sum(g for _, g in gpus_per_node)
    shares = []
    cpu_left, mem_left = request.cpu_milli, request.memory_mib
    for i, (node, g) in enumerate(gpus_per_node):
        last = i == len(gpus_per_node) - 1
        cpu = cpu_left if last else request.cpu_milli * g // total
        mem = mem_left if last else request.memory_mib * g // total
        cpu_left, mem_left = cpu_left - cpu, mem_left - mem
        shares.append(NodeShare(node, cpu, mem))
    return tuple(shares)


def shrink_reason(request: Request, victim: Allocation, under_cap: bool) -> PreemptReason | None:
    """Why `request` may shrink the elastic run `victim`, or None (its size is at its minimum): as it
    may preempt it (`victims.reason_for`), else `reclaim`: an elastic run's size above its minimum
    was taken from units nobody waiting wanted (at admission, or growing), and any request that
    needs them takes them back, whatever its tier, so that no request waits longer for it."""
    if victim.request.elastic is None or victim.request.gpus <= victim.request.elastic.min:
        return None
    return reason_for(request, victim, under_cap) or PreemptReason.RECLAIM


@dataclass
class LastingFree:
    """The pool's free milli over time (the caller records it as it changes), and the least of it over
    the last `span_s`: milli that stayed free that long (`Snapshot.lasting_free`)."""

    span_s: float
    _steps: deque[tuple[float, int]] | None = None

    def record(self, now: float, free_milli: int) -> None:
        """The free milli from `now` on."""
        steps = self._steps if self._steps is not None else deque()
        self._steps = steps
        if steps and steps[-1][0] == now:
            steps.pop()
        if not steps or steps[-1][1] != free_milli:
            steps.append((now, free_milli))
        # Keep the step in force at the window's start, drop what is older.
        while len(steps) > 1 and steps[1][0] <= now - self.span_s:
            steps.popleft()

    def lasting(self, now: float) -> int:
        """The least free milli over `[now - span_s, now]`; 0 before the history covers the span."""
        steps, start = self._steps, now - self.span_s
        if not steps or steps[0][0] > start:
            return 0
        # The step in force at the window's start, and every later one.
        first = max(i for i, (t, _) in enumerate(steps) if t <= start)
        return min(v for i, (_, v) in enumerate(steps) if i >= first)


class ElasticBooks(CycleBooks):
    """The elastic rules of one cycle over its books (the module docstring says which, in order)."""

    reservations: GangReservations  # the cycle's (`cycle._CycleRun`)
    resizes: list[Resize]
    resized: dict[str, Allocation]  # the runs resized this cycle: their allocation now
    extended: int  # elastic admissions this cycle enlarged
    elastic_placements: int  # placements tried by the elastic rules (`result.CycleWork`)
    _pending: Sequence[Request]
    _has_elastic_runs: bool | None  # whether the snapshot runs an elastic run (read when first asked)

    def start_elastic(self, pending: Sequence[Request]) -> None:
        """Set up the elastic books (called once, before the cycle considers anything)."""
        self.resizes, self.resized, self.extended, self.elastic_placements = [], {}, 0, 0
        self._pending, self._has_elastic_runs = pending, None

    def _elastic_runs(self) -> bool:
        """Whether any run of the snapshot is elastic (only then may a shrink or a growth happen);
        read once a cycle, and only by a request that does not fit or a growth pass."""
        if self._has_elastic_runs is None:
            runs = self.snapshot.allocations.values()
            self._has_elastic_runs = any(a.request.elastic is not None for a in runs)
        return self._has_elastic_runs

    # -- 2: shrinks instead of stops ----------------------------------------------------------------

    def try_shrinks(self, request: Request, allowed: np.ndarray | None) -> bool:
        """Admit `request` by shrinking elastic runs alone, if a plan of shrinks makes it fit within its
        cap (what its own tenant's shrunk runs give back counts), or past it where it may borrow; True
        if it was admitted that way."""
        if not self._elastic_runs():
            return False
        plan = self.plan_shrinks(request, allowed)
        if plan is None:
            return False
        for victim, new_size, reason in plan:
            self._shrink(victim, new_size, request, reason)
        self._victims_changed()
        headroom = self.headroom(request)
        placement = place(self.state, request, self.config.scorer, self.priority, allowed, headroom)
        if placement is None and self.may_borrow(request):
            placement = place(self.state, request, self.config.scorer, self.priority, allowed, None)
        if placement is None:
            raise AssertionError(f"shrink plan for {request.id} left no placement: a scheduler bug")
        self._admit(request, placement, headroom)
        return True

    def plan_shrinks(
        self, request: Request, allowed: np.ndarray | None
    ) -> list[tuple[Allocation, int, PreemptReason]] | None:
        """The shrinks that let `request` fit (each run, its new size, why), or None (module docstring, 2)."""
        under = quota.under_cap(self.book, self.balances, request.tenant, request.project, self.ratio)
        candidates = []
        for a in [*self.running_now(), *(r.new for r in self.resizes if r.kind is ResizeKind.SHRINK)]:
            reason = shrink_reason(request, a, under)
            if reason is not None:
                surplus = a.request.gpus - a.request.elastic.min  # type: ignore[union-attr]
                candidates.append((-a.request.tier.rank, not a.borrowed, -surplus, a.id, a, reason))
        if not candidates:
            return None
        candidates.sort(key=lambda c: c[:4])
        if not self.steps.begin():
            return None
        trial = _Trial(self, request, allowed)
        taken: list[tuple[Allocation, int, PreemptReason]] = []
        for *_, a, reason in candidates:
            if self.steps.spent:
                return None
            low = a.request.elastic.min  # type: ignore[union-attr]
            trial.swap(a, _shrunk(a, low))
            taken.append((a, low, reason))
            if trial.fits():
                break
        else:
            return None
        # Undo what it does not need, newest first; raise each kept one as far as it still fits.
        kept: list[tuple[Allocation, int, PreemptReason]] = []
        for a, low, reason in reversed(taken[:-1]):
            if self.steps.spent:  # the rest stay shrunk: a valid plan, no longer minimal
                kept.append((a, low, reason))
                continue
            trial.swap(_shrunk(a, low), a)
            if trial.fits():
                continue
            trial.swap(a, _shrunk(a, low))
            kept.append((a, low, reason))
        kept.append(taken[-1])
        return [(a, trial.largest_kept(a, low), reason) for a, low, reason in kept]

    def _shrink(self, victim: Allocation, size: int, by: Request, reason: PreemptReason) -> None:
        new = _shrunk(victim, size, self.now)
        self._resize(victim, new, ResizeKind.SHRINK, by.id, reason)

    # -- 1: admission at the largest size that fits -------------------------------------------------

    def extend_admitted(self) -> None:
        """Enlarge every elastic admission of the cycle, in admission order, to the largest size that
        fits in what the whole queue left (module docstring, 1). An enlarged admission moves to the
        end of the cycle's admissions: it was decided last, within the cap as the others left it."""
        for ad in list(self.admits):
            a = ad.allocation
            if a.request.elastic is None or a.request.gpus >= a.request.elastic.max:
                continue
            grown = self._larger(a, self.state.capacity_milli - self.state.allocated_milli)
            if grown is not None:
                self.admits.remove(ad)
                self.admits.append(Admit(grown))
                self.admitted_milli[a.request.tier.rank] += grown.milli - a.milli
                self.extended += 1

    # -- 3: growth into lasting idle units ----------------------------------------------------------

    def grow_running(self) -> None:
        """Grow running elastic runs, oldest first, into milli that stayed free `elastic_grow_idle_s`
        and that no request held for room this cycle asks for (module docstring, 3)."""
        lasting = self.snapshot.lasting_free
        if lasting is None or self.config.elastic_grow_idle_s is None or not self._elastic_runs():
            return
        asks = {r.id: r.total_milli for r in self._pending}
        wanted = sum(asks.get(h.request_id, 0) for h in self.holds if h.reason in WANTS_ROOM)
        free = self.state.capacity_milli - self.state.allocated_milli
        budget = min(lasting, free) - wanted
        touched = {r.request_id for r in self.returns}
        runs = sorted(self.running_now(), key=lambda a: (a.start, a.id))
        for a in runs:
            if budget < MILLI_PER_GPU:
                return
            if a.request.elastic is None or a.request.gpus >= a.request.elastic.max or a.id in touched:
                continue
            if a.id in self.resized:
                continue
            grown = self._larger(a, budget, resize=True)
            if grown is not None:
                budget -= grown.milli - a.milli

    # -- shared -------------------------------------------------------------------------------------

    def _larger(self, a: Allocation, budget: int, *, resize: bool = False) -> Allocation | None:
        """`a` at the largest larger size (a bisection over its sizes) that fits on the free units plus
        its own, taking at most `budget` more milli, within its cap (past it only where `a` is borrowed,
        if it may borrow). Recorded (an admission replaced, or a
        `Resize` GROW when `resize`) and returned; None when no larger size fits."""
        request = a.request
        rng = request.elastic
        assert rng is not None
        most = request.gpus + budget // MILLI_PER_GPU
        sizes = [s for s in rng.sizes() if request.gpus < s <= most]
        if not sizes:
            return None
        self._uncharge(a)
        self.state.release(a.placement)
        headroom = self.headroom(request)
        may_borrow = a.borrowed
        allowed = self.reservations.allowed_for(request)
        found: tuple[Request, Placement] | None = None
        lo, hi = 0, len(sizes) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            bigger = at_size(request, sizes[mid])
            borrows = may_borrow and bigger.total_milli > headroom and self.may_borrow(bigger)
            limit = None if borrows else headroom
            self.elastic_placements += 1
            placement = place(self.state, bigger, self.config.scorer, self.priority, allowed, limit)
            if placement is not None:
                found, hi = (bigger, placement), mid - 1
            else:
                lo = mid + 1
        if found is None:
            self.state.apply(a.placement)
            self._charge(a)
            return None
        bigger, placement = found
        borrowed = a.borrowed or placement.milli > headroom
        new = replace(a, request=bigger, placement=placement, borrowed=borrowed, start=self.now if resize else a.start)
        self.state.apply(placement)
        self._charge(new)
        self.cache.capacity_taken()
        if resize:
            self.resizes.append(Resize(a, new, ResizeKind.GROW, self.now))
            self.resized[a.id] = new
        return new

    def _resize(
        self, old: Allocation, new: Allocation, kind: ResizeKind, by: str | None, reason: PreemptReason | None
    ) -> None:
        """Record a resize of a running run: its units and charges move from `old` to `new`. A run
        shrunk again in the same cycle (another request needed more) has one resize, from its
        allocation before the cycle to the last one, with the last request it made room for."""
        self.state.release(old.placement)
        self._uncharge(old)
        self.state.apply(new.placement)
        self._charge(new)
        earlier = next((i for i, r in enumerate(self.resizes) if r.old.id == old.id), None)
        if earlier is None:
            self.resizes.append(Resize(old, new, kind, self.now, by, reason))
        else:
            self.resizes[earlier] = Resize(self.resizes[earlier].old, new, kind, self.now, by, reason)
        self.resized[old.id] = new

    def running_now(self) -> list[Allocation]:
        """The snapshot's runs as this cycle may still stop or grow them: less its victims and the
        runs resized (a shrunk one may only shrink further: `plan_shrinks`)."""
        stopped = {p.victim.id for p in self.preempts}
        return [a for a in self.snapshot.allocations.values() if a.id not in stopped and a.id not in self.resized]

    def _victims_changed(self) -> None:
        """A run shrank: its units moved, so the victim lists (built from the snapshot) are listed
        again from what runs now, and every answer that depended on capacity is dropped."""
        runs: Mapping[str, Allocation] = {a.id: a for a in self.running_now()}
        self.victims = CycleVictims(runs, self.now, self.config)
        self.planner = PreemptionPlanner(self.victims, self.config.scorer, self.priority, self.steps)
        self.cache.capacity_grew()

    def _admit(self, request: Request, placement: Placement, headroom: int | None = None) -> Allocation:
        return self._admit_on(request, placement, headroom)


class _Trial:
    """A shrink plan being tried: a copy of the cycle's capacity and balances with the shrinks so far."""

    def __init__(self, books: ElasticBooks, request: Request, allowed: np.ndarray | None) -> None:
        self.books, self.request, self.allowed = books, request, allowed
        self.state = books.state.copy()
        self.balances = dict(books.balances)
        # Shrinks only add free units, so a request that may borrow now still may once they are done.
        self.may_borrow = books.may_borrow(request)

    def swap(self, old: Allocation, new: Allocation) -> None:
        """`old`'s units and charges become `new`'s."""
        _swap(self.state, old.placement, new.placement)
        quota.charge_allocation(self.books.book, self.balances, old, -old.milli)
        quota.charge_allocation(self.books.book, self.balances, new)

    def fits(self) -> bool:
        """Whether the request fits now within its cap (one step of the planner's budget)."""
        books, r = self.books, self.request
        books.steps.spend()
        books.elastic_placements += 1
        ratio = books.config.overcommit.ratio(self.state.allocated_fraction)  # shrinks lower the allocation
        headroom = quota.headroom(books.book, self.balances, r.tenant, r.project, ratio)
        limit = None if self.may_borrow and headroom < r.total_milli else headroom
        return place(self.state, r, books.config.scorer, books.priority, self.allowed, limit) is not None

    def largest_kept(self, a: Allocation, low: int) -> int:
        """The largest size of `a` (shrunk to `low` here) with which the request still fits: a
        bisection over its sizes between `low` and its size now; the trial keeps `a` at that size."""
        sizes = [s for s in a.request.elastic.sizes() if low <= s < a.request.gpus]  # type: ignore[union-attr]
        best, lo, hi = low, 0, len(sizes) - 1  # sizes[hi] == low, largest first
        current = _shrunk(a, low)
        while lo < hi and not self.books.steps.spent:
            mid = (lo + hi) // 2
            trying = _shrunk(a, sizes[mid])
            self.swap(current, trying)
            if self.fits():
                best, hi, current = sizes[mid], mid, trying
            else:
                self.swap(trying, current)
                lo = mid + 1
        return best


def _shrunk(a: Allocation, size: int, now: float | None = None) -> Allocation:
    """`a` at `size` GPUs on a subset of its own (`shrunk_placement`), starting at `now` if given."""
    request = at_size(a.request, size)
    return replace(
        a,
        request=request,
        placement=shrunk_placement(a.placement, request),
        start=a.start if now is None else now,
        checkpointed_at=None if now is not None else a.checkpointed_at,
    )


def _swap(state: ClusterState, old: Placement, new: Placement) -> None:
    state.release(old)
    state.apply(new)
