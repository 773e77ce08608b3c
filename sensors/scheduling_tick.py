"""The scheduling tick: a Dagster sensor that runs the scheduler's `cycle` over the gated runs.

This module reads and writes Dagster's runs; what the tick decides is worked out over plain data in
the platform layer (`xirang_platform/control/`: `reconcile.py`, `tick_plan.py`, `tick_ledger.py`).

Every `tick.interval_s` seconds (5 by default; Dagster's sensor loop runs every 5 s, `cadence.py`),
holding the ledger's tick lease (`ledger/lease.py`: a second tick, or a crashed one's successor
while the dead holder's session lingers, skips and writes nothing; a dry run, the UI's "Test
sensor", neither reads nor writes, `dagster_compat.is_daemon_tick`):

1. **read**: the ledger's live allocations and quota book, the runs behind the closed gate, and the
   runs reconcile looks at (those the ledger holds allocations for, those whose gate is open); an
   asset a preemptible run materialized counts as its checkpoint (`checkpoints.py`);
2. **reconcile** (`reconcile_runs`, planned by `control/reconcile.py`): repair what a crash or a
   missed sensor left inconsistent, commit the reservations of runs that started; with the `k8s`
   launcher, pin the gated gang and service pods to their nodes (`K8sSubmitter.pin_gated_pods`);
3. **plan** (`control/tick_plan.py`, pure): snapshot = pool + ledger allocations + gated runs;
   `cycle`;
4. **ledger** (`control/tick_ledger.py`): the cycle's returns, preemptions and reservations (with
   their placements) in one transaction (`Ledger.apply_cycle`, which checks each placement against
   the pool's capacity); a ledger that changed since the snapshot refuses it whole (and so does any
   other failure of the write: nothing is written, the next tick decides again); a request the
   ledger refuses on its own account is left out and the cycle decided again without it: its run
   fails with the reason (`BadRequest`) or waits with it (`OverCapacity`), so one bad request never
   fails the tick;
5. **runs** (`act_on_plan`): victims are tagged `xirang/preempted-by`, given their
   notice and grace (`notices.py`: the grace of the preemptor's tier) and terminated through Dagster
   (their resumption is submitted by `resume.py` in their own code location), and with the `k8s`
   launcher their Kubernetes objects are deleted (`K8sSubmitter.stop`); a resized elastic run gets the
   same notice and ends, and its resumption takes over the new size the ledger holds for it
   (`control/resize.py`; a shrink's preemptor waits for it like for a victim); runs that can never run fail
   with the reason. A preemptor whose victims still run keeps its units reserved behind its closed
   gate until they stop or their grace ends (reconcile then opens it; a victim still running then is
   killed);
6. **queue** (`queue_tags.py`): every run whose gate stays closed gets its gate named after its hold's
   kind, its hold reason, its position in its tier and its estimated start (the queue view's), the
   tags Dagster's UI shows of a queued run; only the values that changed are written;
7. **gates**: one transaction (`dagster_compat.write_run_tags`) writes every admitted run's placement
   (`xirang/allocation` and, for the local launcher, `xirang/env` with `CUDA_VISIBLE_DEVICES`; for
   Kubernetes, the `dagster-k8s/config` tag, after `K8sSubmitter.launch` created the run's DRA claim
   template or its gang's Service and Indexed Job) with its open gate, so Dagster's queue daemon
   launches them together in `dagster/priority` order, and step 6's queue tags;
8. **hold events**: an engine event for each held run whose reason changed in substance
   (`tick_plan.hold_cause`: not for a balance that moved).

The tick calls the launcher through one interface (`Launcher`, `xirang_platform/launch/launcher.py`),
picked once per tick from the platform config's `launcher` (`platform_launcher`): `LocalLauncher`
(the `xirang/env` tag, SIGKILL at grace end, nothing to create, delete or pin) or `K8sCluster`.

A run whose launch the cluster refuses (RBAC, a ResourceQuota, a missing PriorityClass, an object
the API server rejects, an unreachable API) fails with the cluster's message, its reservation is
released and what was created for it deleted: its gate never opens. It does not wait in the queue,
because each tick would admit it again, preempt for it again and be refused again.

Each step's duration and counts are logged as one line. The ledger is written before the gate
opens: a crash between the two leaves a reservation whose gate is closed, which the next tick's
reconcile finishes (never a launched run without a reservation).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from functools import partial

from dagster import (
    DagsterInstance,
    DagsterRun,
    DefaultSensorStatus,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from resources.gpu_pool import GpuPoolResource
from sensors import notices
from sensors.cadence import minimum_interval
from sensors.checkpoints import with_checkpoints
from sensors.queue_tags import estimate_due, queue_tags
from sensors.run_views import end_run, monitoring_bounds, run_views, watched_runs
from xirang_platform.control import run_tags as rt
from xirang_platform.control.notice import Notice, PreemptionGrace, Wait
from xirang_platform.control.platform_config import PlatformConfig
from xirang_platform.control.reconcile import Repairs, plan_repairs
from xirang_platform.control.tick_ledger import reserve, write_ledger
from xirang_platform.control.tick_plan import GatedRun, TickPlan, hold_cause, plan_tick
from xirang_platform.dagster_compat import held_filter, is_daemon_tick, write_run_tags
from xirang_platform.dagster_defs.coordinator import run_location
from xirang_platform.dagster_defs.queue_criteria import QUEUE_TAGS
from xirang_platform.launch.k8s_cluster import K8sUnavailable
from xirang_platform.launch.launcher import Launcher, platform_launcher
from xirang_platform.ledger.counters import RECONCILE_CAUSE
from xirang_platform.ledger.errors import LedgerError
from xirang_platform.ledger.ledger import Ledger
from xirang_platform.operations.tick_record import record_steps
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.cycle_memo import CycleMemo
from xirang_platform.scheduling.model import Allocation
from xirang_platform.scheduling.quota import QuotaBook

TICK_SENSOR_NAME = "xirang_scheduling_tick"
BACK_IN_QUEUE = "reconcile: back in the queue"
DRY_RUN = (
    "dry run: the scheduling tick writes only in the sensor daemon's ticks, so this evaluation (the UI's "
    "'Test sensor', or a direct call) read and wrote nothing; the tick history shows what the ticks did"
)
_logger = logging.getLogger("xirang.tick")


@dataclass
class TickReport:
    """What one tick did: milliseconds per step and counts, plus the repairs it logged."""

    steps_ms: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    repairs: list[str] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    resized: list[str] = field(default_factory=list)  # elastic runs restarting at a new size (`resize.py`)
    failed: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # admitted preemptors held while their victims stop
    killed: list[str] = field(default_factory=list)  # victims killed at the end of their grace
    memo: CycleMemo | None = None  # the cycle's memo, for the next tick
    estimate_s: float | None = None  # wall seconds the queue estimate took (None: not made this tick)
    skipped: str = ""  # why this tick did nothing (dry run, lease held elsewhere); '' when it ran
    config_problem: str = ""  # the platform config's edit that is not applied, and what runs instead

    def summary(self) -> str:
        """One line: the config problem first, if any, then counts and step durations."""
        counts = ", ".join(f"{k} {v}" for k, v in self.counts.items())
        steps = ", ".join(f"{k} {v:.1f} ms" for k, v in self.steps_ms.items())
        return f"{self.config_problem + ' | ' if self.config_problem else ''}tick: {counts}; {steps}"


def _past(deadline: float) -> bool:
    """Whether the monotonic clock is past `deadline`."""
    return time.monotonic() > deadline


class _Steps:
    """Times the tick's named steps into a report."""

    def __init__(self, report: TickReport) -> None:
        self.report = report
        self.t = time.perf_counter()

    def done(self, name: str) -> None:
        now = time.perf_counter()
        self.report.steps_ms[name] = round((now - self.t) * 1000, 2)
        self.t = now


def run_tick(
    instance: DagsterInstance,
    gpu_pool: GpuPoolResource,
    now: float | None = None,
    memo: CycleMemo | None = None,
    *,
    dry_run: bool = False,
    estimate: bool = True,
) -> TickReport:
    """One scheduling tick against `instance` (a `DagsterInstance`) and the resource's ledger and pool;
    `memo`: the previous tick's `TickReport.memo`; `estimate`: whether the held runs' estimated starts
    are made again (`queue_tags.estimate_due`). It runs only holding the ledger's tick lease
    (`Ledger.tick_lease`); without it, or in a `dry_run`, it reads and writes nothing and says why
    in `TickReport.skipped`."""
    now = time.time() if now is None else now
    reading = gpu_pool.platform_reading()
    report = TickReport(config_problem=reading.line())
    platform = reading.config
    ledger = gpu_pool.ledger()
    # on Kubernetes every run pod gets the longest grace a preemptor may give it
    launcher = platform_launcher(platform.launcher).with_grace(platform.grace.longest())
    if dry_run:
        report.skipped = f"{report.config_problem} | {DRY_RUN}" if report.config_problem else DRY_RUN
        return report
    with ledger.tick_lease() as busy:
        if busy:
            report.skipped = f"tick skipped: {busy}"
            _logger.info(report.skipped)
            return report
        return _tick(instance, ledger, platform, launcher, now, memo, report, estimate)


@dataclass(frozen=True)
class TickRead:
    """What the tick's first step read: the runs behind the closed gate (by run id), the ledger's
    allocations (with the checkpoints their runs materialized) and quota book, and the runs reconcile
    compares with the ledger (`run_views.watched_runs`)."""

    gated: list[DagsterRun]
    allocations: list[Allocation]
    book: QuotaBook
    watched: dict[str, DagsterRun]


def _tick(
    instance: DagsterInstance,
    ledger: Ledger,
    platform: PlatformConfig,
    launcher: Launcher,
    now: float,
    memo: CycleMemo | None,
    report: TickReport,
    estimate: bool = True,
) -> TickReport:
    """The tick's steps, holding the lease, in the order of the module's docstring."""
    steps = _Steps(report)
    read = read_world(instance, ledger)
    steps.done("read")
    allocations, repairs = reconcile_runs(instance, ledger, launcher, platform.pool, read, now, report)
    steps.done("reconcile")

    # the gated runs the ledger holds nothing for go to the cycle
    held_ids = {a.id for a in allocations}
    waiting = [GatedRun(r.run_id, dict(r.tags), run_location(r)) for r in read.gated if r.run_id not in held_ids]
    idle = ledger.idle_history(now - platform.scheduler.history_s(), read.book)  # after reconcile's releases
    grow_s = platform.scheduler.elastic_grow_idle_s
    free = ledger.lasting_free(now, grow_s, platform.pool.gpu_milli) if grow_s is not None else None

    deadline = time.monotonic() + platform.tick_cycle_budget_s  # the cycle's wall-clock guard

    def plan_without(refused: Set[str], last: CycleMemo | None) -> TickPlan:
        rest = [r for r in waiting if r.run_id not in refused]
        out_of_time = partial(_past, deadline)
        return plan_tick(platform.pool, read.book, allocations, rest, now, platform, last, idle, out_of_time, free)

    plan = plan_without(set(), memo)
    steps.done("plan")
    # the last plan's memo is checked against the next tick's snapshot, so kept even when nothing was written
    plan, report.memo, _ = reserve(plan, partial(write_ledger, ledger), plan_without)
    steps.done("ledger")
    runs = {r.run_id: r for r in read.gated}
    acted = act_on_plan(instance, ledger, launcher, platform, plan, runs, now, report)
    steps.done("runs")
    # every run whose gate stays closed: held now, waiting for its victims, or since an earlier tick
    reopened = {*repairs.open_gate, *repairs.after_notice}
    earlier = {rid: r.tags.get(rt.HOLD_REASON, "") for rid, r in runs.items() if rid in held_ids - reopened}
    # The estimate gets a wall-clock guard of its own, as the cycle does: it never makes the tick outlast its sensor.
    started = time.monotonic()
    estimate_guard = partial(_past, started + platform.tick_cycle_budget_s)
    closed = {**earlier, **acted.holds, **acted.waits}
    queue = queue_tags(instance, platform, plan, closed, runs, now, estimate_guard, estimate)
    report.estimate_s = time.monotonic() - started if estimate else None
    steps.done("queue")
    open_gates(instance, {rid: {**queue.get(rid, {}), **acted.tags.get(rid, {})} for rid in {*queue, *acted.tags}})
    steps.done("gates")
    changed = report_hold_changes(instance, runs, acted.holds)
    steps.done("hold events")

    report.counts = {
        "gated": len(read.gated),
        "allocations": len(allocations),
        "admitted": len(report.admitted),
        "preempted": len(report.preempted),
        "resized": len(report.resized),
        "waiting for victims": len(report.waiting),
        "killed at grace end": len(report.killed),
        "held": len(acted.holds),
        "queue tags written": len(queue),
        "hold reasons changed": changed,
        "failed": len(report.failed),
        "returned": len(plan.result.returns),
        "repairs": repairs.count,
        "committed": len(repairs.commit),
    }
    _logger.info(json.dumps({"tick": report.counts, "steps_ms": report.steps_ms}, sort_keys=True))
    record_steps(instance, report.steps_ms)  # for the exporter's xirang_tick_duration_seconds
    return report


def read_world(instance: DagsterInstance, ledger: Ledger) -> TickRead:
    """Step 1: the gated runs, the ledger's allocations and quota book, the watched runs."""
    gated = sorted(instance.get_runs(held_filter()), key=lambda r: r.run_id)
    allocations = with_checkpoints(instance, ledger, ledger.allocations())
    return TickRead(gated, allocations, ledger.quota_book(), watched_runs(instance, gated, allocations))


def reconcile_runs(
    instance: DagsterInstance,
    ledger: Ledger,
    launcher: Launcher,
    pool: Pool,
    read: TickRead,
    now: float,
    report: TickReport,
) -> tuple[list[Allocation], Repairs]:
    """Step 2: kill the victims past their grace and read the preemptors' waits, then carry out
    reconcile's repairs (`plan_repairs`) and pin the gated pods. Returns the allocations the ledger
    still holds, and the repairs."""
    report.killed = notices.enforce_grace(instance, read.watched, now, launcher)
    views = run_views(instance, read.watched)
    for rid, state in notices.waits(instance, read.gated, now).items():
        views[rid] = replace(views[rid], after_notice=state)
    repairs = plan_repairs(read.allocations, views, monitoring_bounds(instance))
    released = {**repairs.release_ended, **dict.fromkeys(repairs.release, RECONCILE_CAUSE)}
    _release(ledger, released, _allocated_fraction(pool, read.allocations))
    for rid, why in sorted(repairs.end.items()):
        end_run(instance, rid, why)
    for a in read.allocations:
        if a.id in released:
            launcher.stop(a, pool)
    if repairs.commit:
        ledger.commit_many(repairs.commit)
    allocations = [a for a in read.allocations if a.id not in released]
    by_id = {a.id: a for a in allocations}
    reopened = [(read.watched[rid], by_id[rid]) for rid in [*repairs.open_gate, *repairs.after_notice]]
    accepted, refused = launch(instance, ledger, launcher, reopened, pool)
    allocations = [a for a in allocations if a.id not in refused]
    back = {rt.GATE: rt.closed_gate(BACK_IN_QUEUE), rt.HOLD_REASON: BACK_IN_QUEUE}
    closed = {rid: back for rid in repairs.close_gate}
    if accepted or closed:
        open_gates(instance, {**gate_tags(accepted, launcher, pool), **closed})
    for rid in repairs.stop:
        _stop(instance, read.watched[rid], "reconcile: it ran with no allocation in the ledger")
    report.repairs = repairs.lines()
    for rid, cause in sorted(repairs.release_ended.items()):
        _logger.info("released the allocation of run %s: it ended (%s)", rid, cause)
    pinned = launcher.pin_gated_pods()
    if isinstance(pinned, str):
        report.repairs.append(f"pinning gated pods: {pinned}")
    elif pinned:
        _logger.info("pinned gated pods: %s", ", ".join(f"{p} on {n}" for p, n in sorted(pinned.items())))
    for line in report.repairs:
        _logger.warning("tick repair: %s", line)
    report.failed += sorted(refused)
    return allocations, repairs


@dataclass(frozen=True)
class Acted:
    """What `act_on_plan` did to the runs: the hold text of each run the cycle held and of each
    preemptor waiting for its victims, and the tags that admit runs (placements, open gates) or
    mark the waits, for the tick's one write."""

    holds: dict[str, str]
    waits: dict[str, str]
    tags: dict[str, dict[str, str]]


def act_on_plan(
    instance: DagsterInstance,
    ledger: Ledger,
    launcher: Launcher,
    platform: PlatformConfig,
    plan: TickPlan,
    runs: Mapping[str, DagsterRun],
    now: float,
    report: TickReport,
) -> Acted:
    """Step 5, once the ledger holds the plan: the victims get their notice and are stopped, the
    admitted runs launch (a preemptor whose victims use their grace waits behind its gate) and the
    runs that can never run fail. The tags it leads to are returned, for step 7 to write."""
    pool = platform.pool
    held_for = notice_victims(instance, plan, platform.grace, now)
    for p in plan.result.preempts:
        launcher.stop(p.victim, pool)
        report.preempted.append(p.victim.id)
    tiers = {r.id: r.tier for r in plan.requests}
    for by, runs_held in notices.notify_resized(instance, plan.result.resizes, platform.grace, tiers, now).items():
        held_for.setdefault(by, {}).update(runs_held)
    for r in plan.result.resizes:
        launcher.stop(r.old, pool)  # its objects go with it; its resumption's are created at its launch
        report.resized.append(r.request_id)
    waits = {rid: Wait(tuple(sorted(v)), max(v.values())) for rid, v in held_for.items()}
    admits = [(runs[ad.request_id], ad.allocation) for ad in plan.result.admits if ad.request_id not in waits]
    accepted, refused = launch(instance, ledger, launcher, admits, pool)
    waiting = {rid: notices.hold_text(w, now) for rid, w in waits.items()}
    for rid, text in sorted(waiting.items()):
        instance.report_engine_event(f"admitted, {text}", runs[rid])
    report.waiting = sorted(waits)
    report.admitted = [run.run_id for run, _ in accepted] + report.waiting
    report.failed += sorted(refused)
    for rid, why in plan.failures.items():
        _fail(instance, runs[rid], why)
        report.failed.append(rid)
    held = {rid: {rt.AFTER_NOTICE: w.tag()} for rid, w in waits.items()}
    return Acted(dict(plan.hold_texts), waiting, {**held, **gate_tags(accepted, launcher, pool)})


# -- ledger writes ----------------------------------------------------------------------------------------


def _release(ledger: Ledger, causes: Mapping[str, str], fraction: float) -> None:
    """Release each run's allocation with its cause."""
    for rid, cause in sorted(causes.items()):
        try:
            ledger.release(rid, cause, fraction)
        except LedgerError as e:  # released meanwhile by a release sensor: nothing left to do
            _logger.info("release of %s skipped: %s", rid, e)


def _allocated_fraction(pool: Pool, allocations: Iterable[Allocation]) -> float:
    capacity = pool.gpu_milli
    return min(1.0, sum(a.milli for a in allocations) / capacity) if capacity else 0.0


# -- run writes -------------------------------------------------------------------------------------------


def launch(
    instance: DagsterInstance,
    ledger: Ledger,
    launcher: Launcher,
    admits: Sequence[tuple[DagsterRun, Allocation]],
    pool: Pool,
) -> tuple[list[tuple[DagsterRun, Allocation]], dict[str, str]]:
    """Have the launcher create what each admitted allocation needs (`Launcher.launch`: on
    Kubernetes its objects; nothing locally). A refused run's reservation is released and the run
    fails with the launcher's message, its gate closed. Returns the admissions the launcher
    accepted and the refused run ids with its message."""
    refused: dict[str, str] = {}
    for run, allocation in admits:
        message = launcher.launch(allocation, pool)
        if message is not None:
            refused[run.run_id] = message
    if refused:
        held = ledger.allocations()
        _release(ledger, dict.fromkeys(refused, "launch-refused"), _allocated_fraction(pool, held))
        for run, _ in admits:
            if run.run_id in refused:
                _fail(instance, run, f"the cluster refused its launch: {refused[run.run_id]}")
    return [(run, a) for run, a in admits if run.run_id not in refused], refused


def gate_tags(
    admits: Sequence[tuple[DagsterRun, Allocation]], launcher: Launcher, pool: Pool
) -> dict[str, dict[str, str]]:
    """Run id -> the tags that admit it: its placement (`Launcher.launch_tags`) and the open gate, the
    queue tags it carries blanked in the same write (the queue-criteria dialog lists no blank value,
    so they can never hold it: `queue_criteria.py`; one it never carried is not added blank)."""
    return {
        run.run_id: {
            **launcher.launch_tags(a, pool),
            rt.GATE: rt.GATE_OPEN,
            **{key: "" for key in QUEUE_TAGS if run.tags.get(key)},
        }
        for run, a in admits
    }


def open_gates(instance: DagsterInstance, tags_by_run: Mapping[str, Mapping[str, str]]) -> None:
    """Write a tick's run tags (placements and open gates, hold reasons, closed gates) in one transaction.
    An admitted run's placement is its `xirang/allocation` tag (the UI shows it on the run) and the
    platform's assets record it with the run's wait as metadata (`assets/admission.py`): the tick
    writes no engine event per admission."""
    write_run_tags(instance, tags_by_run)


def _stop(instance: DagsterInstance, run: DagsterRun, why: str) -> None:
    """Mark a run preempted (so its resumption is submitted) and terminate it at once."""
    notices.notify(instance, run, None, why)


def notice_victims(
    instance: DagsterInstance, plan: TickPlan, grace: PreemptionGrace, now: float
) -> dict[str, dict[str, float]]:
    """Notice every victim of the plan (`notices.notify`) with the grace of its preemptor's tier and
    terminate it; returns preemptor -> {victim still running in its grace: the grace's end}."""
    tiers = {r.id: r.tier for r in plan.requests}
    held_for: dict[str, dict[str, float]] = {}
    for p in plan.result.preempts:
        # Read afresh: a victim the tick saw queued with its gate open may have been launched since.
        victim = instance.get_run_by_id(p.victim.id)
        if victim is None:
            continue
        if reclaimed := rt.reclaim_tags(p.requeued()):  # for its resumption's borrow back-off
            instance.add_run_tags(victim.run_id, reclaimed)
        grace_s = grace.for_tier(tiers[p.by]) if p.by in tiers else 0.0
        # Every victim not yet ended gets the notice, a queued one too: if the queue launched it while
        # this tick ran, its process reads the notice at its first check and stops with nothing lost.
        notice = Notice(p.by, p.reason.value, grace_s, now) if grace_s > 0 and not notices.ended(victim) else None
        notices.notify(instance, victim, notice, f"preempted by run {p.by} ({p.reason.value})")
        if notice is None:
            continue
        after = instance.get_run_by_id(victim.run_id)
        if after is not None and not notices.ended(after):  # one cancelled from the queue is gone: no wait
            held_for.setdefault(p.by, {})[victim.run_id] = notice.deadline
    return held_for


def _fail(instance: DagsterInstance, run: DagsterRun, why: str) -> None:
    message = f"run not admitted: {why}"
    instance.add_run_tags(run.run_id, {rt.HOLD_REASON: message[:1000]})
    instance.report_engine_event(message, run)
    instance.report_run_failed(run, message)


def report_hold_changes(instance: DagsterInstance, runs: Mapping[str, DagsterRun], texts: Mapping[str, str]) -> int:
    """An engine event `held: <reason>` for each held run whose reason changed since its last event
    (its numbers aside: `hold_cause`), so the run's log says why it waits without one event per run
    per tick; the tag (written with the gates) always shows the current text. Returns how many."""
    changed = 0
    for rid, text in sorted(texts.items()):
        if hold_cause(runs[rid].tags.get(rt.HOLD_REASON, "")) == hold_cause(text):
            continue
        instance.report_engine_event(f"held: {text}", runs[rid])
        changed += 1
    return changed


# -- the sensor -------------------------------------------------------------------------------------------


def build_scheduling_tick(interval_s: int = 5) -> SensorDefinition:
    """The tick sensor (`xirang_scheduling_tick`), running by default, needing the `gpu_pool` resource."""
    last: list[CycleMemo | None] = [None]  # the previous tick's cycle memo, handed to the next one
    estimated: list[float] = [0.0, 0.0]  # the last queue estimate's start (monotonic) and wall seconds

    @sensor(
        name=TICK_SENSOR_NAME,
        minimum_interval_seconds=minimum_interval(interval_s),
        default_status=DefaultSensorStatus.RUNNING,
        description="The platform's scheduling tick: runs the scheduler's cycle over the gated runs, "
        "reserves in the ledger, writes placements and opens gates (DESIGN.md section 7).",
    )
    def xirang_scheduling_tick(context: SensorEvaluationContext, gpu_pool: GpuPoolResource) -> SkipReason:
        try:
            due = estimate_due(estimated[0], estimated[1], time.monotonic())
            started = time.monotonic()
            report = run_tick(
                context.instance, gpu_pool, memo=last[0], dry_run=not is_daemon_tick(context), estimate=due
            )
        except K8sUnavailable as exc:  # raised before anything is read or written: the next tick tries again
            context.log.error(f"tick skipped: {exc}")
            return SkipReason(f"tick skipped: {exc}")
        if report.config_problem:  # the tick runs on the last good config: said where the operator looks
            context.log.error(report.config_problem)
        if report.skipped:
            context.log.info(report.skipped)
            return SkipReason(report.skipped)
        last[0] = report.memo
        if report.estimate_s is not None:
            estimated[:] = [started, report.estimate_s]
        for line in report.repairs:
            context.log.warning(line)
        context.log.info(report.summary())
        # The tick requests no runs itself; the skip reason shows its counts in the tick history.
        return SkipReason(report.summary())

    return xirang_scheduling_tick
