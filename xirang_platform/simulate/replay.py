"""Replay: an event-driven loop on simulated time that drives the scheduler's own `cycle`.

Events are submissions (from load sources) and finishes. After the events of one instant the loop
runs a cycle on `Snapshot(pool, state, allocations, book)` and applies its decisions to one
incremental `ClusterState`: returns, then preempts (victims free their units first), then admits.
A hold with reason `never-fits`, `exceeds-cap` (a P0 larger than its tenant's cap at the highest
ratio) or `unknown-account` can never change in a replay (quotas are fixed), so the request is
rejected (dropped, with a `reject` event). Any other hold waits.

Timing (`ReplayOptions.interval_s`): 0 (the default) runs a cycle at every instant where a job
arrived or finished; a positive interval runs cycles only on multiples of it (events between two
ticks wait for the next tick, like a periodic scheduler). Nothing changes between events except
time itself, which matters twice: an allocation becomes preemptible when it outlives the minimum
runtime, and a gang that waited past the starvation bound gets units held back. The loop keeps a
timer for each and runs one more cycle when one fires while requests wait. A cycle that preempted
is followed at once by one more cycle at the same instant (once), so a victim resumes on idle units
as soon as a live tick would let it.

Preemption loses work: with `checkpoint_interval_s=None` a victim restarts from scratch (its whole
run so far is lost); with a checkpoint interval it resumes from its last checkpoint, losing only
the time since. The lost GPU-seconds are written on the `preempt` event. With a preemption notice
(`preemption_notice_s` > 0, `simulate/notice.py`) a victim gets a `notice` and stops after its grace
(or once it saved a checkpoint), when it is preempted; its preemptor's units are reserved for it at
once (a `reserve`) and it starts (its `admit`) when its victims have stopped.

Load sources (`LoadSource`) are the seam for other drivers: the trace is one; the inference
autoscaler (`simulate/inference_replay.py`) is another: it submits replica requests over time and, through
an optional `stop(now, waiting)` method, stops the replicas a scale-down releases.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from xirang_platform.pool.model import MILLI_PER_GPU, Pool
from xirang_platform.scheduling.apply import apply_cycle
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.cycle_memo import CycleMemo
from xirang_platform.scheduling.elastic import LastingFree
from xirang_platform.scheduling.lending import idle_views
from xirang_platform.scheduling.model import Allocation, HoldReason, Preempt, PreemptReason, Request, Resize, ResizeKind
from xirang_platform.scheduling.preemption.cost import work_lost
from xirang_platform.scheduling.quota import IdleHistory, QuotaBook, balances_from, is_reclaimable
from xirang_platform.scheduling.result import CycleResult
from xirang_platform.scheduling.snapshot import SchedulerConfig, Snapshot
from xirang_platform.scheduling.state import ClusterState
from xirang_platform.simulate.elastic import SCALING_EXPONENT, speed
from xirang_platform.simulate.events import EventLog
from xirang_platform.simulate.notice import Drain, NoticePolicy, overfull_admits
from xirang_platform.simulate.traces import TraceJob

DROPPED = (HoldReason.NEVER_FITS, HoldReason.EXCEEDS_CAP, HoldReason.UNKNOWN_ACCOUNT)


# Called after each cycle is applied: (now, the cycle's result, the requests still waiting, the live
# allocations). The queue-estimate bench reads the replay's state through it.
Observer = Callable[[float, CycleResult, Mapping[str, Request], Mapping[str, Allocation]], None]


class LoadSource(Protocol):
    """Something that submits jobs over simulated time."""

    def next_time(self) -> float | None:
        """When the next job arrives (None when the source is exhausted)."""
        ...

    def take(self, now: float) -> list[TraceJob]:
        """The jobs arriving at or before `now`, in submit order."""
        ...


def _stops_nothing(now: float, waiting: Iterable[str]) -> list[str]:
    return []


class TraceSource:
    """A fixed list of trace jobs, released at their submit times."""

    def __init__(self, jobs: Iterable[TraceJob]) -> None:
        self.jobs = sorted(jobs, key=lambda j: (j.request.submit_time, j.request.id))
        self.i = 0

    def next_time(self) -> float | None:
        return self.jobs[self.i].request.submit_time if self.i < len(self.jobs) else None

    def take(self, now: float) -> list[TraceJob]:
        out = []
        while self.i < len(self.jobs) and self.jobs[self.i].request.submit_time <= now:
            out.append(self.jobs[self.i])
            self.i += 1
        return out


@dataclass(frozen=True)
class ReplayOptions:
    """How the loop runs: see the module docstring for `interval_s` and `checkpoint_interval_s`;
    `notice` is the preemption notice (`simulate/notice.py`; none by default); `resize_cost_s` and
    `scaling_exponent` are the elastic replay's (`simulate/elastic.py`).
    `check_state` verifies the capacity arrays after every cycle (tests)."""

    interval_s: float = 0.0
    checkpoint_interval_s: float | None = None
    check_state: bool = False
    notice: NoticePolicy = NoticePolicy()
    resize_cost_s: float = 0.0  # seconds an elastic resize stops its job (`simulate/elastic.py`)
    scaling_exponent: float = SCALING_EXPONENT  # throughput grows as GPUs ** this (`simulate/elastic.py`)

    def __post_init__(self) -> None:
        if self.interval_s < 0:
            raise ValueError(f"interval must be >= 0 seconds, got {self.interval_s}")
        if self.checkpoint_interval_s is not None and self.checkpoint_interval_s <= 0:
            raise ValueError(f"checkpoint interval must be > 0 seconds, got {self.checkpoint_interval_s}")
        if not 0 <= self.resize_cost_s < math.inf:
            raise ValueError(f"resize cost must be >= 0 seconds, got {self.resize_cost_s}")


@dataclass
class ReplayResult:
    """The event log of a replay, how many cycles ran, and what was still waiting at the end."""

    log: EventLog
    cycles: int
    waiting: list[Request] = field(default_factory=list)

    @property
    def events(self) -> list[dict]:
        """The events, in time order."""
        return self.log.events


def replay(
    pool: Pool,
    book: QuotaBook,
    sources: Sequence[LoadSource] | Iterable[TraceJob],
    config: SchedulerConfig | None = None,
    options: ReplayOptions | None = None,
    observe: Observer | None = None,
) -> ReplayResult:
    """Replay the jobs of `sources` (or a plain list of trace jobs) through `cycle` on `pool`;
    `observe` sees the state after every cycle."""
    if not isinstance(sources, Sequence) or not all(hasattr(s, "take") for s in sources):
        sources = [TraceSource(sources)]  # type: ignore[arg-type]
    options = options or ReplayOptions()
    config = replay_config(config, options)
    run = _Replay(pool, book, list(sources), config, options)
    run.observe = observe
    return run.run()


def replay_config(config: SchedulerConfig | None, options: ReplayOptions) -> SchedulerConfig:
    """The scheduler config a replay under `options` runs with: `config` (default: DESIGN.md's), with
    the replay's checkpoint interval where it names none (victims are chosen by the work they lose)."""
    config = config or SchedulerConfig()
    if config.checkpoint_interval_s is None and options.checkpoint_interval_s is not None:
        config = replace(config, checkpoint_interval_s=options.checkpoint_interval_s)
    return config


class _Replay:
    def __init__(
        self, pool: Pool, book: QuotaBook, sources: list[LoadSource], config: SchedulerConfig, options: ReplayOptions
    ) -> None:
        self.pool, self.book, self.sources, self.config, self.options = pool, book, sources, config, options
        self.state = ClusterState(pool)
        self.allocations: dict[str, Allocation] = {}
        self.pending: dict[str, Request] = {}
        self.remaining: dict[str, float] = {}
        self.generation: dict[str, int] = {}
        self.finishes: list[tuple[float, str, int]] = []  # (time, job, generation) heap
        self.timers: list[float] = []  # heap of instants when time alone may change a decision
        self.due: float | None = None  # when the next cycle must run
        self.followed_up: float | None = None  # the instant whose preemptions got a follow-up cycle
        self.log = EventLog()
        self.cycles = 0
        self.idle = IdleHistory(book)  # what the snapshot's `lasting_idle` is read from
        self.memo: CycleMemo | None = None  # the last cycle's, handed to the next (as the live tick does)
        self.observe: Observer | None = None
        self.notice = options.notice
        self.drains: list[tuple[float, int, Drain]] = []  # (stop time, sequence, drain) heap
        self.draining: dict[str, Drain] = {}  # victim on notice -> its drain
        self.reserved_in: dict[str, Drain] = {}  # preemptor waiting on its victims -> their drain
        # Elastic jobs: the GPUs their trace ran them on, and per running one its progress rate
        # (trace-seconds per second) and since when it progresses (after a resize's restart).
        self.trace_gpus: dict[str, int] = {}
        self.rate: dict[str, float] = {}
        self.progress_from: dict[str, float] = {}
        grow_span = config.elastic_grow_idle_s
        self.free = LastingFree(grow_span) if grow_span is not None else None

    def run(self) -> ReplayResult:
        while True:
            t_event = self._next_event_time()
            if t_event is None and self.due is None:
                break
            if t_event is not None and (self.due is None or t_event <= self.due):
                self._events_at(t_event)
            else:
                now = self.due
                assert now is not None
                self.due = None
                self._cycle(now)
        return ReplayResult(self.log, self.cycles, list(self.pending.values()))

    # -- events ----------------------------------------------------------------------------------

    def _next_event_time(self) -> float | None:
        times = [t for t in (s.next_time() for s in self.sources) if t is not None]
        if self.finishes:
            times.append(self.finishes[0][0])
        if self.drains:
            times.append(self.drains[0][0])
        return min(times) if times else None

    def _events_at(self, now: float) -> None:
        """Finishes, then submissions, at `now`; then a cycle is due if anything happened."""
        changed = False
        while self.finishes and self.finishes[0][0] <= now:
            _, done, gen = heapq.heappop(self.finishes)
            if self.generation.get(done) == gen and done in self.draining:
                drain = self.draining.pop(done)
                drain.finished.add(done)  # its run ended within its grace
                self.log.finish(now, done)
                if all(v.id in drain.finished for _, v in drain.victims):
                    self._stop_drain(drain, now)  # its preemptors need not wait out the grace
                changed = True
                continue
            if self.generation.get(done) != gen or done not in self.allocations:
                continue  # the allocation this finish belonged to was preempted
            a = self.allocations.pop(done)
            self.state.release(a.placement)
            self.log.finish(now, done)
            changed = True
        while self.drains and self.drains[0][0] <= now:
            drain = heapq.heappop(self.drains)[2]
            if not drain.stopped:
                self._stop_drain(drain, drain.stops_at)
                changed = True
        for source in self.sources:
            # An elastic source (the inference autoscaler) also stops jobs it no longer needs.
            for stopped in getattr(source, "stop", _stops_nothing)(now, self.pending.keys()):
                changed |= self._stop(now, stopped)
            for job in source.take(now):
                r = job.request
                if r.id in self.remaining:
                    raise ValueError(f"job {r.id} is submitted twice; give each job a unique id")
                self.pending[r.id] = r
                self.remaining[r.id] = job.duration_s
                if r.elastic is not None:
                    self.trace_gpus[r.id] = job.trace_gpus or r.gpus
                self.log.submit(now, r, job.duration_s)
                if r.gpus > 1:
                    heapq.heappush(self.timers, r.submit_time + self.config.starvation_wait_s)
                changed = True
        if changed:
            self._cycle_due(now)

    def _stop(self, now: float, job: str) -> bool:
        """Stop `job` for its source: a waiting one leaves the queue (`reject`, reason `scaled-down`), a
        running one releases its units (`finish`). False when it is neither (it already ended)."""
        if job in self.pending:
            del self.pending[job]
            self.log.reject(now, job, "scaled-down", "its source no longer needs it")
            return True
        a = self.allocations.pop(job, None)
        if a is None:
            return False
        self.state.release(a.placement)
        self._unreserve(job)
        self.generation[job] = self.generation.get(job, 0) + 1  # its scheduled finish (if any) no longer applies
        self.log.finish(now, job)
        return True

    def _cycle_due(self, t: float) -> None:
        if self.options.interval_s > 0:
            step = self.options.interval_s
            t = math.ceil(t / step - 1e-9) * step
        self.due = t if self.due is None else min(self.due, t)

    # -- cycles ----------------------------------------------------------------------------------

    def _cycle(self, now: float) -> None:
        balances = self._record_idle(now)
        self._record_free(now)
        if not self.pending and not any(a.borrowed for a in self.allocations.values()) and not self._may_grow(now):
            self._wake(now)  # an elastic job may grow once the units it could take have stayed free
            return
        self.idle.forget(now - self.config.history_s())
        lasting, ahead = idle_views(self.idle, self.config, self.allocations.values(), now)
        lasting_free = self.free.lasting(now) if self.free is not None and self.trace_gpus else None
        snapshot = Snapshot(self.pool, self.state, self.allocations, self.book, balances, lasting, ahead, lasting_free)
        result = cycle(snapshot, list(self.pending.values()), now, self.config, self.memo)
        self.memo = result.memo
        self.cycles += 1
        self._apply(now, result)
        self._record_idle(now)
        self._record_free(now)
        if self.observe is not None:
            self.observe(now, result, self.pending, self.allocations)
        if self.options.check_state:
            problems = self.state.check()
            if problems:
                raise AssertionError(f"cycle at t={now} broke capacity: {problems[:3]}")
        if result.preempts and self.followed_up != now:
            self.followed_up = now
            self._cycle_due(now)  # victims may resume at once on units the cycle left idle
        self._wake(now)

    def _apply(self, now: float, result: CycleResult) -> None:
        """Apply the cycle (the simulator launches at once: admissions are confirmed), then log it
        and keep the loop's own books from what was done."""
        for ad in result.admits:
            if ad.request_id not in self.pending:
                raise RuntimeError(f"cycle at t={now} admitted {ad.request_id}, which is not waiting: a scheduler bug")
        applied = apply_cycle(result, self.state, self.allocations, confirm=True)
        for a in applied.returned:
            if a.id not in self.reserved_in:  # a reserved one's admit, when it starts, says it is in quota
                self.log.returned(now, a.id, a.milli)
        if self.notice.on and applied.preempted:
            admitted = self._give_notice(now, applied.preempted, list(applied.admitted))
        else:
            for p, victim in applied.preempted:
                self._preempt(now, victim, p.by, p.reason.value)
            admitted = list(applied.admitted)
        for r, new in applied.resized:  # shrinks first: the admissions they made room for follow
            if r.kind is ResizeKind.SHRINK:
                self._resized(now, r, new)
        for a in admitted:
            del self.pending[a.id]
            self._start(now, a)
        for r, new in applied.resized:
            if r.kind is ResizeKind.GROW:
                self._resized(now, r, new)
        for h in result.holds:
            if h.reason in DROPPED and h.request_id in self.pending:
                del self.pending[h.request_id]
                self.log.reject(now, h.request_id, h.reason.value, h.message)

    def _start(self, now: float, a: Allocation) -> None:
        """Log `a` started at `now`; its finish, and the timers of its minimum runtimes, follow."""
        self.log.admit(now, a)
        self._progress(now, a, now)
        if self.config.preemption:
            for min_runtime in self.config.min_runtimes():
                if min_runtime > 0:
                    heapq.heappush(self.timers, now + min_runtime)

    def _progress(self, now: float, a: Allocation, since: float) -> None:
        """`a` progresses from `since` at its size's rate; its finish follows (a new generation)."""
        rid = a.id
        rate = 1.0
        if rid in self.trace_gpus:
            rate = speed(a.request.gpus, self.trace_gpus[rid], self.options.scaling_exponent)
            self.rate[rid], self.progress_from[rid] = rate, since
        gen = self.generation.get(rid, 0) + 1
        self.generation[rid] = gen
        heapq.heappush(self.finishes, (since + self.remaining[rid] / rate, rid, gen))

    def _resized(self, now: float, r: Resize, new: Allocation) -> None:
        """An elastic job restarts at its new size: the work it did is kept (it checkpoints on its
        notice), and it makes no progress for the resize cost, holding its new units."""
        rid = new.id
        self.remaining[rid] -= max(0.0, now - self.progress_from[rid]) * self.rate[rid]
        cost = self.options.resize_cost_s
        self.log.resize(now, r, new, cost * new.milli / MILLI_PER_GPU)
        self._progress(now, new, now + cost)

    def _give_notice(
        self, now: float, preempted: Sequence[tuple[Preempt, Allocation]], admitted: list[Allocation]
    ) -> list[Allocation]:
        """The cycle's preemptions under a notice: each running victim gets one and keeps its units
        (a `Drain`) until it stops; each preemptor's allocation is reserved until then. A victim that
        had not started yet (a reservation) stops at once. Returns the admissions that start now:
        the others, less those that took units a victim still uses (they wait again)."""
        running = []
        for p, victim in preempted:
            if victim.id in self.reserved_in:
                self._unreserve(victim.id)
                self._preempt(now, victim, p.by, p.reason.value)  # it never ran: nothing lost
            else:
                running.append((p, victim))
        by = {p.by for p, _ in running}
        drain = Drain(now, now + self.notice.stop_delay_s, running, {a.id: a.placement for a in admitted if a.id in by})
        drain.rehold(self.state)
        while (late := overfull_admits(self.state, admitted)) is not None:
            admitted.remove(late)
            del self.allocations[late.id]
            self.state.release(late.placement)
            if drain.reserved.pop(late.id, None) is not None:
                drain.rehold(self.state)
        if not running:
            return admitted
        for p, victim in running:
            self.draining[victim.id] = drain
            self.log.notice(now, victim.id, p.by, p.reason.value, drain.stops_at, self.notice.saves)
            finish = victim.start + self.remaining[victim.id]
            if self.notice.saves or finish > drain.stops_at:
                self.generation[victim.id] += 1  # it stops before its run ends
        for rid in drain.reserved:
            reserved = self.allocations[rid] = replace(self.allocations[rid], start=drain.stops_at, confirmed=False)
            self.reserved_in[rid] = drain
            del self.pending[rid]
            self.log.reserve(now, reserved, drain.stops_at)
        heapq.heappush(self.drains, (drain.stops_at, self.cycles, drain))
        return [a for a in admitted if a.id not in drain.reserved]

    def _unreserve(self, job: str) -> None:
        """`job`'s reservation ends before it started (preempted or stopped): its drain holds the units
        its victims still use again."""
        drain = self.reserved_in.pop(job, None)
        if drain is not None:
            del drain.reserved[job]
            drain.rehold(self.state)

    def _stop_drain(self, drain: Drain, now: float) -> None:
        """A drain's victims stop (preempted, requeued) and the preemptors still reserved start."""
        drain.stopped = True
        self.state.release(drain.hold)
        for p, victim in drain.victims:
            if victim.id not in drain.finished:
                del self.draining[victim.id]
                self._preempt(now, victim, p.by, p.reason.value, noticed_at=drain.noticed_at)
        for rid in drain.reserved:
            del self.reserved_in[rid]
            started = self.allocations[rid] = replace(self.allocations[rid], confirmed=True)
            self._start(now, started)

    def _preempt(self, now: float, a: Allocation, by: str, reason: str, noticed_at: float | None = None) -> None:
        """Book a victim the applier took off the pool: work lost since its last checkpoint, requeued.
        A victim that saved on its notice (at `noticed_at`) made no progress after it and lost none."""
        job = a.id
        step = self.options.checkpoint_interval_s
        upto = now
        if noticed_at is not None and self.notice.saves:
            a, upto = replace(a, checkpointed_at=noticed_at), noticed_at
        ran = max(0.0, upto - a.start)
        # The seconds `work_lost` does not count: the later checkpoint, periodic or reported.
        saved = math.floor(ran / step) * step if step else 0.0
        if a.checkpointed_at is not None:
            saved = max(saved, min(ran, a.checkpointed_at - a.start))
        if job in self.rate:  # an elastic job: progress began after its restart, at its size's rate
            saved = max(0.0, saved - (self.progress_from[job] - a.start)) * self.rate[job]
        self.remaining[job] -= saved
        if noticed_at is None:  # its scheduled finish, if any, no longer applies (a notice bumped it already)
            self.generation[job] = self.generation.get(job, 0) + 1
        lost = work_lost(a, upto, step)
        self.log.preempt(now, job, by, reason, lost)
        requeued = self.pending[job] = a.request.requeued(PreemptReason(reason), now)
        if requeued.reclaims and self.config.preemption:
            # A reclaimed request may borrow again when its back-off ends: a live tick would see that.
            heapq.heappush(self.timers, now + self.config.borrow_backoff_s(requeued.reclaims))

    def _record_idle(self, now: float) -> dict:
        """The balances now, noted in the idle history; idle quota that grew has lasted `lend_after_s`
        later, when a reclaimed request may borrow it: a live tick would see that, so a cycle runs then."""
        balances = balances_from(self.book, self.allocations.values())
        if self.idle.record(now, balances) and self.config.preemption:
            heapq.heappush(self.timers, now + self.config.lend_after_s)
        return balances

    def _record_free(self, now: float) -> None:
        """The pool's free milli now, for elastic growth: once free milli grew, it has lasted
        `elastic_grow_idle_s` later, when a live tick would grow into it, so a cycle runs then."""
        if self.free is None or not self.trace_gpus:
            return
        free = self.state.capacity_milli - self.state.allocated_milli
        if free > self.free.lasting(now) and free >= MILLI_PER_GPU:
            heapq.heappush(self.timers, now + self.free.span_s)
        self.free.record(now, free)

    def _may_grow(self, now: float) -> bool:
        """Whether a running elastic job could grow now (into units free long enough)."""
        if self.free is None or self.free.lasting(now) < MILLI_PER_GPU:
            return False
        return any(
            a.request.elastic is not None and a.request.gpus < a.request.elastic.max for a in self.allocations.values()
        )

    def _wake(self, now: float) -> None:
        """While requests wait (or an elastic job may grow), run one more cycle when the next timer fires."""
        while self.timers and self.timers[0] <= now:
            heapq.heappop(self.timers)
        if self.timers and ((self.pending and self._time_may_help()) or self._may_grow(self.timers[0])):
            self._cycle_due(self.timers[0])

    def _time_may_help(self) -> bool:
        return any(r.gpus > 1 or r.reclaims for r in self.pending.values()) or (
            self.config.preemption and any(is_reclaimable(a) for a in self.allocations.values())
        )
