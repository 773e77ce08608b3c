"""When each waiting request starts, by forward simulation (DESIGN.md section 10): `estimate_starts`.

The estimate replays the live queue through the scheduler's own `cycle` in simulated time, from the
snapshot of now, and applies each simulated cycle's decisions through the one applier
(`scheduling/apply.py`), as the simulator does: tiers, queue order, quotas and caps, gang holds,
lending, returns and preemptions are the cycle's, not a model of them. A request's estimate is the
instant a simulated cycle admits it.

- **Running work** ends at its expected end (`Forecast.ends`: a declared `xirang/expected-duration`
  after its start, else the median duration of the same job's past runs, else unknown). A request a
  simulated cycle admits runs for its own expected duration (`Forecast.durations`), or for an unknown
  time. A preempted victim waits again and, when re-admitted, runs what it had left: its whole
  duration, or with a checkpoint interval the duration less the checkpoints it had saved.
- **Time** moves event to event, never tick by tick: the next cycle runs at the next expected end, or
  at the next instant at which time alone may change a decision while requests wait (a running
  allocation outliving a minimum runtime, a gang reaching the starvation wait, a reclaimed request's
  borrow back-off ending). With `tick_s` (a replay's cycle interval) each instant is rounded up to its
  tick, as a periodic scheduler runs, and the events of one tick meet one cycle. While more events are
  pending than cycles are left, events after the next one by less than `resolution_s` (60 s: the UI
  shows the minute) or `precision` of the time to it (5%) are taken together, at the last of them:
  where ends are dense the cycles are spaced geometrically. A cycle that preempted or deferred, and
  admitted or preempted anything, is followed by one more at the same instant.
- **Unknown ends.** An allocation without an expected end is taken to run past every instant the
  simulation reaches. So a request has an estimate exactly when the known ends (and the admissions
  they lead to) bring it to a start: it starts before any unknown end matters. A request the
  simulation cannot bring to a start without an unknown end (nothing known is left to end, or nothing
  left could change a decision) is `None`, unknown, never a made-up figure; so is one the cycle can
  never admit (`never-fits`, `exceeds-cap`, `unknown-account`). An unknown end that comes earlier can
  move a start forward: the estimate does not guess it, and an estimate is a start the known ends
  alone reach, not a promise against every end that is not known.

The bound: at most `max_cycles` simulated cycles (`EtaResult.cycles`), each of them within the
cycle's own bounds (`CycleWork`: at most `SchedulerConfig.plan_steps_per_cycle` planner steps plus what
the last request it started may spend, `plan_steps_per_request`). A request the simulation has not
admitted when the cycles run out is unknown too, and `EtaResult.horizon` says the bound cut it short.
Pure: no clock but `now`, no I/O; the snapshot is copied, never changed.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from xirang_platform.scheduling import quota
from xirang_platform.scheduling.apply import apply_cycle, pending_after
from xirang_platform.scheduling.config import SchedulerConfig
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.cycle_memo import CycleMemo
from xirang_platform.scheduling.model import Allocation, HoldReason, Request
from xirang_platform.scheduling.snapshot import Snapshot

MAX_CYCLES = 256  # the default bound on simulated cycles; docs/design-notes.md record B13 says why
RESOLUTION_S = 60.0  # events this close are taken together: the UI shows an estimate to the minute
PRECISION = 0.05  # and events this share of the time simulated apart (record B13)
NEVER_STARTS = (HoldReason.NEVER_FITS, HoldReason.EXCEEDS_CAP, HoldReason.UNKNOWN_ACCOUNT)


@dataclass(frozen=True)
class Forecast:
    """What the estimate knows of time: per running allocation id its expected end (Unix seconds;
    None or absent: unknown), per waiting request id its expected duration (seconds; None or absent:
    unknown)."""

    ends: Mapping[str, float | None] = field(default_factory=dict)
    durations: Mapping[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class EtaResult:
    """Per waiting request id its simulated start (None: unknown), and what the simulation spent:
    `cycles` (at most its `max_cycles`), `plan_steps` (the planner's steps over all of them),
    `horizon` (True when the cycle bound, not the queue or the known ends, stopped it)."""

    starts: dict[str, float | None]
    cycles: int = 0
    plan_steps: int = 0
    horizon: bool = False


def estimate_starts(
    snapshot: Snapshot,
    pending: Sequence[Request],
    now: float,
    config: SchedulerConfig,
    forecast: Forecast,
    *,
    max_cycles: int = MAX_CYCLES,
    tick_s: float = 0.0,
    resolution_s: float = RESOLUTION_S,
    precision: float = PRECISION,
    memo: CycleMemo | None = None,
    out_of_time: Callable[[], bool] | None = None,
) -> EtaResult:
    """The simulated start of every request of `pending` from `snapshot` at `now` under `config`
    (the module docstring gives the rules). `memo`: the live tick's last `CycleResult.memo`, if any.
    `out_of_time`: the live tick's wall-clock guard; once it says so, no further cycle runs and the
    requests not yet admitted are unknown (`horizon`), as past the cycle bound."""
    if max_cycles < 1:
        raise ValueError(f"max_cycles must be >= 1 cycle, got {max_cycles}")
    if tick_s < 0:
        raise ValueError(f"tick_s must be >= 0 seconds, got {tick_s}")
    if not 0 <= precision < 1 or resolution_s < 0:
        raise ValueError(
            f"precision must be in [0, 1) (a share of the time simulated) and resolution_s >= 0 seconds, got "
            f"{precision} and {resolution_s}"
        )
    steps = _Steps(tick_s, resolution_s, precision)
    return _Forward(snapshot, pending, now, config, forecast, max_cycles, steps, memo).run(out_of_time)


class _Steps(NamedTuple):
    """How simulated time moves: the live tick's interval (0: none), the least step, the relative one."""

    tick_s: float
    resolution_s: float
    precision: float


class _Forward:
    """One forward simulation: a private copy of the state, the queue, the known ends and the timers."""

    def __init__(
        self,
        snapshot: Snapshot,
        pending: Sequence[Request],
        now: float,
        config: SchedulerConfig,
        forecast: Forecast,
        max_cycles: int,
        steps: _Steps,
        memo: CycleMemo | None,
    ) -> None:
        self.snapshot, self.now, self.config = snapshot, now, config
        self.max_cycles, self.memo = max_cycles, memo
        self.tick_s, self.resolution_s, self.precision = steps
        self.state = snapshot.state.copy()
        self.allocations: dict[str, Allocation] = dict(snapshot.allocations)
        self.balances = dict(
            snapshot.balances
            if snapshot.balances is not None
            else quota.balances_from(snapshot.book, self.allocations.values())
        )
        self.waiting: list[Request] = list(pending)
        self.starts: dict[str, float | None] = {r.id: None for r in pending}
        self.durations: dict[str, float | None] = {r.id: _seconds(forecast.durations.get(r.id)) for r in pending}
        self.ends: dict[str, float | None] = {a: forecast.ends.get(a) for a in self.allocations}
        self.end_heap = [(t, a) for a, t in self.ends.items() if t is not None]  # (expected end, allocation id)
        heapq.heapify(self.end_heap)
        # An allocation's age matters only where it may be a victim: borrowed work (any tier reclaims
        # it), or any preemptible work while a request that may preempt waits.
        self.runtimes = [m for m in config.min_runtimes() if m > 0] if config.preemption else []
        self.preempting = any(r.tier.rules.may_preempt for r in pending)
        self.timers: list[float] = []  # instants at which time alone may change a decision
        for r in self.waiting:
            self._time_for(r)
        for a in self.allocations.values():
            self._age_timers(a)
        heapq.heapify(self.timers)
        self.cycles = self.plan_steps = 0

    def run(self, out_of_time: Callable[[], bool] | None) -> EtaResult:
        t: float | None = self.now
        while t is not None and self.waiting and self.cycles < self.max_cycles:
            if out_of_time is not None and self.cycles > 0 and out_of_time():
                break
            self._end_until(t)
            again = self._cycle(t)
            t = t if again else self._next_instant(t)
        horizon = bool(self.waiting) and t is not None
        return EtaResult(self.starts, self.cycles, self.plan_steps, horizon)

    def _end_until(self, t: float) -> None:
        """Release every allocation whose expected end is at or before `t`."""
        while self.end_heap and self.end_heap[0][0] <= t:
            end, rid = heapq.heappop(self.end_heap)
            if not self._live(end, rid):
                continue  # preempted since, or re-admitted with another end
            a = self.allocations.pop(rid)
            self.state.release(a.placement)
            quota.charge_allocation(self.snapshot.book, self.balances, a, -a.milli)

    def _cycle(self, t: float) -> bool:
        """One simulated cycle at `t`, applied; True when another must follow at the same instant."""
        snapshot = replace(self.snapshot, state=self.state, allocations=self.allocations, balances=self.balances)
        result = cycle(snapshot, self.waiting, t, self.config, self.memo)
        self.memo = result.memo
        self.cycles += 1
        self.plan_steps += result.work.plan_steps
        applied = apply_cycle(
            result, self.state, self.allocations, confirm=True, balances=self.balances, book=self.snapshot.book
        )
        never = {h.request_id for h in result.holds if h.reason in NEVER_STARTS}
        self.waiting = [r for r in pending_after(self.waiting, result) if r.id not in never]
        for _, victim in applied.preempted:
            self.durations[victim.id] = self._left(victim, t)
            self.ends.pop(victim.id, None)
        for r in self.waiting:
            if r.reclaimed_at == t:
                self._time_for(r, push=True)
        for a in applied.admitted:
            if a.id in self.starts and self.starts[a.id] is None:
                self.starts[a.id] = t  # its first admission (a later preemption does not move its start)
            took = self.durations.get(a.id)
            self.ends[a.id] = None if took is None else t + took
            if took is not None:
                heapq.heappush(self.end_heap, (t + took, a.id))
            self._age_timers(a, push=True)
        deferred = any(h.reason is HoldReason.DEFERRED for h in result.holds)
        # Once more at once only after progress: a cycle that decides nothing new would repeat itself.
        return (deferred or bool(result.preempts)) and bool(result.admits or result.preempts)

    def _live(self, end: float, rid: str) -> bool:
        """Whether the end-heap entry (`end`, `rid`) is still `rid`'s expected end (not preempted, not ended)."""
        return rid in self.allocations and self.ends.get(rid) == end

    def _left(self, victim: Allocation, t: float) -> float | None:
        """What a victim preempted at `t` still has to run: its whole run, less the checkpoints it saved."""
        end = self.ends.get(victim.id)
        if end is None:
            return None
        whole = end - victim.start
        step = self.config.checkpoint_interval_s
        saved = math.floor(max(0.0, t - victim.start) / step) * step if step else 0.0
        return max(0.0, whole - saved)

    def _time_for(self, r: Request, push: bool = False) -> None:
        """The instants at which waiting `r` may be decided otherwise: a gang at the starvation wait, a
        reclaimed request at the end of its borrow back-off."""
        if r.gpus > 1:
            self._timer(r.submit_time + self.config.starvation_wait_s, push)
        if r.reclaimed_at is not None:
            self._timer(r.reclaimed_at + self.config.borrow_backoff_s(r.reclaims), push)

    def _age_timers(self, a: Allocation, push: bool = False) -> None:
        """The instants at which `a` outlives each minimum runtime (it may become a victim)."""
        if not (a.borrowed or self.preempting):
            return
        for m in self.runtimes:
            self._timer(a.start + m, push)

    def _timer(self, at: float, push: bool) -> None:
        if at > self.now:
            if push:
                heapq.heappush(self.timers, at)
            else:
                self.timers.append(at)

    def _next_instant(self, t: float) -> float | None:
        """The next instant after `t` at which an end or a timer may change a decision (None: none will).

        The events of the first one's tick (with a tick) are taken together; and while more events are
        pending than cycles are left, so are those after the first by less than `resolution_s` or than
        `precision` of the time from now to it, at the last of them: a lone event is simulated at its
        own instant, and where events are dense the cycles are spaced geometrically, each start at most
        that late."""
        heap = self.end_heap
        while heap and (heap[0][0] <= t or not self._live(*heap[0])):
            heapq.heappop(heap)
        while self.timers and self.timers[0] <= t:
            heapq.heappop(self.timers)
        first = min(
            [x for x in (heap[0][0] if heap else None, self.timers[0] if self.timers else None) if x is not None],
            default=None,
        )
        if first is None:
            return None
        # With a tick, the events of one tick meet one cycle, as they do live. Past that, events are taken
        # together only while more are pending than cycles are left: an affordable simulation is exact.
        limit = self._on_tick(first) if self.tick_s > 0 else first
        if len(heap) + len(self.timers) > self.max_cycles - self.cycles:
            limit = max(limit, first + self.resolution_s, first + self.precision * (first - self.now))
        nxt = first
        taken = []
        while heap and heap[0][0] <= limit:
            entry = heapq.heappop(heap)
            if self._live(*entry):
                nxt = max(nxt, entry[0])
                taken.append(entry)
        for entry in taken:  # released by the next cycle's `_end_until`
            heapq.heappush(heap, entry)
        while self.timers and self.timers[0] <= limit:
            nxt = max(nxt, heapq.heappop(self.timers))
        return self._on_tick(nxt) if self.tick_s > 0 else nxt

    def _on_tick(self, t: float) -> float:
        """The first tick at or after `t` (ticks counted from now)."""
        return self.now + math.ceil((t - self.now) / self.tick_s - 1e-9) * self.tick_s


def _seconds(seconds: float | None) -> float | None:
    """A duration the simulation can use: finite and not negative (else unknown)."""
    return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None
