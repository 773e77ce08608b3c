"""The tick's side of preemption notices (`xirang_platform/control/notice.py`): notice the victims, hold
their preemptors' units, kill a victim whose grace ended, launch a preemptor whose wait is over.

1. **notice** (step 5 of the tick): each victim is tagged `xirang/preempted-by` (its resumption is
   submitted as before) and, when its preemptor's tier gives a grace, `xirang/notice`; its log gets
   the notice; it is terminated through Dagster at once (`run_coordinator.cancel_run`: locally the run
   process gets Dagster's interrupt, on Kubernetes the Job is deleted and the pod gets SIGTERM), which
   a training loop inside `GpuPoolResource.on_preemption` takes as the notice to save and stop.
2. **hold**: a preemptor with victims still running keeps its gate closed, its units reserved for it
   in the ledger, and a `xirang/after-notice` tag naming the victims and the end of their grace.
3. **grace** (every tick, before reconcile): a victim still running past its deadline is killed
   (SIGKILL to its run process on this host; on Kubernetes its pods are deleted with no further
   grace, since their `terminationGracePeriodSeconds` is the longest grace of any tier), and its log
   says so.
4. **launch**: a preemptor whose victims all stopped (their runs ended, or their processes are gone),
   or whose grace ended, has its gate opened with the ledger's placement (reconcile's `after_notice`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from dagster import DagsterInstance, DagsterRun, RunsFilter

from xirang_platform.control import resize
from xirang_platform.control import run_tags as rt
from xirang_platform.control.notice import Notice, PreemptionGrace, Wait, read_notice, read_wait
from xirang_platform.control.reconcile import AFTER_NOTICE_OVER, AFTER_NOTICE_WAITING, FINISHED, IN_PROGRESS
from xirang_platform.dagster_defs import run_workers
from xirang_platform.launch.launcher import Launcher
from xirang_platform.scheduling.model import Resize, Tier

_logger = logging.getLogger("xirang.tick")


def notify(instance: DagsterInstance, run: DagsterRun, notice: Notice | None, why: str) -> None:
    """Tell `run` it is preempted and terminate it through Dagster: with a `notice` its log shows the
    notice and the grace (it is killed when the grace ends), without one it stops at once."""
    tags = {rt.PREEMPTED_BY: why, rt.RESUME: rt.RESUME_PENDING}
    if notice is not None:
        tags[rt.NOTICE] = notice.tag()
    instance.add_run_tags(run.run_id, tags)
    said = notice.message() if notice is not None else f"{why}: terminating"
    instance.report_engine_event(f"{said}; the platform requeues its remaining work", run)
    instance.run_coordinator.cancel_run(run.run_id)


def notify_resized(
    instance: DagsterInstance, resizes: Sequence[Resize], grace: PreemptionGrace, tiers: Mapping[str, Tier], now: float
) -> dict[str, dict[str, float]]:
    """Give every resized run its resize notice (`control/resize.py`: the tags, the grace) and terminate
    it through Dagster, so it saves a checkpoint and ends; its resumption takes over the new size.
    Returns shrink preemptor -> {resized run still running in its grace: the grace's end}, the runs
    whose units it waits for like a preemptor's victims."""
    held_for: dict[str, dict[str, float]] = {}
    for r in resizes:
        run = instance.get_run_by_id(r.request_id)
        if run is None:
            continue
        notice = resize.notice_of(r, resize.grace_for(r, grace, tiers), now)
        instance.add_run_tags(run.run_id, resize.resize_tags(run.tags, r, notice))
        instance.report_engine_event(resize.notice_message(r, notice), run)
        if ended(run):
            continue  # it ended before the notice: its resumption comes as it would have
        instance.run_coordinator.cancel_run(run.run_id)
        if r.by is not None and notice.grace_s > 0:
            after = instance.get_run_by_id(run.run_id)
            if after is not None and not ended(after):
                held_for.setdefault(r.by, {})[run.run_id] = notice.deadline
    return held_for


def in_progress(run: DagsterRun) -> bool:
    """Whether `run` has a process that may still use its units."""
    return run.status.value in IN_PROGRESS


def ended(run: DagsterRun) -> bool:
    """Whether `run` ended (succeeded, failed or was cancelled)."""
    return run.status.value in FINISHED


def hold_text(wait: Wait, now: float) -> str:
    """The preemptor's hold reason while it waits."""
    victims = ", ".join(wait.victims)
    return (
        f"reserved: its units are held for it while preempted run(s) {victims} save a checkpoint and stop "
        f"(grace ends in {max(0.0, wait.deadline - now):.0f} s)"
    )


def enforce_grace(
    instance: DagsterInstance, runs: Mapping[str, DagsterRun], now: float, launcher: Launcher
) -> list[str]:
    """Kill every victim still running past the end of its grace (`Launcher.kill`): SIGKILL to its
    process on this host, or, on Kubernetes, its pods deleted with no further grace (their
    `terminationGracePeriodSeconds` is the longest grace of any tier). The run ids killed."""
    killed = []
    for rid, run in sorted(runs.items()):
        notice = read_notice(run.tags)
        if notice is None or not in_progress(run) or now < notice.deadline:
            continue
        if run_workers.is_local(run):
            worker = run_workers.find_worker(instance, rid)
            if worker is None or not run_workers.alive(worker):
                continue
            how = launcher.kill(rid, worker.pid)
        else:
            how = launcher.kill(rid, None)
        if how is None:
            continue
        instance.report_engine_event(
            f"preemption grace of {notice.grace_s:g} s ended and the run had not stopped: killed ({how}); its "
            "resumption redoes the work since its last checkpoint",
            run,
        )
        _logger.warning("killed run %s at the end of its %g s grace", rid, notice.grace_s)
        killed.append(rid)
    return killed


def stopped(instance: DagsterInstance, run_ids: Sequence[str]) -> set[str]:
    """Of `run_ids`, the runs that no longer use their units: ended, gone, or with a dead process here."""
    runs = {r.run_id: r for r in instance.get_runs(RunsFilter(run_ids=list(run_ids)))} if run_ids else {}
    out = set()
    for rid in run_ids:
        run = runs.get(rid)
        if run is None or run.is_finished or not in_progress(run) or _worker_gone(instance, run):
            out.add(rid)
    return out


def _worker_gone(instance: DagsterInstance, run: DagsterRun) -> bool:
    """Whether `run`'s process on this host logged its start and is gone (unknown elsewhere: False)."""
    if not run_workers.is_local(run):
        return False
    worker = run_workers.find_worker(instance, run.run_id)
    return worker is not None and not run_workers.alive(worker)


def waits(instance: DagsterInstance, gated: Sequence[DagsterRun], now: float) -> dict[str, str]:
    """Gated preemptors' wait states: run id -> `AFTER_NOTICE_WAITING` or `AFTER_NOTICE_OVER`."""
    out = {}
    for run in gated:
        wait = read_wait(run.tags)
        if wait is None:
            continue
        over = wait.over(stopped(instance, wait.victims), now)
        out[run.run_id] = AFTER_NOTICE_OVER if over else AFTER_NOTICE_WAITING
    return out
