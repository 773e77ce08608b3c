"""How the scheduling tick reads Dagster's runs: the runs reconcile compares with the ledger, its view
of each (status, gate, age, whether its worker lives), Dagster's run-monitoring bounds, and ending a
run whose worker is gone."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from xirang_platform.control import run_tags as rt
from xirang_platform.control.reconcile import CANCELING, IN_PROGRESS, Bounds, RunView
from xirang_platform.control.resize import awaits_resumption
from xirang_platform.dagster_defs import run_workers
from xirang_platform.scheduling.model import Allocation


def watched_runs(
    instance: DagsterInstance, gated: Sequence[DagsterRun], allocations: Sequence[Allocation]
) -> dict[str, DagsterRun]:
    """The runs reconcile compares with the ledger: gated ones, open-gate ones, and those holding allocations."""
    runs = {r.run_id: r for r in gated}
    active = [DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
    for r in instance.get_runs(RunsFilter(statuses=active, tags={rt.GATE: rt.GATE_OPEN})):
        runs[r.run_id] = r
    missing = [a.id for a in allocations if a.id not in runs]
    if missing:
        for r in instance.get_runs(RunsFilter(run_ids=missing)):
            runs[r.run_id] = r
    return runs


def run_view(run: DagsterRun, age_s: float = 0.0, worker: bool | None = None) -> RunView:
    """Reconcile's view of one run, `age_s` seconds in its status, its worker alive or not (None: unknown)."""
    return RunView(
        run.run_id,
        run.status.value,
        run.tags.get(rt.GATE, ""),
        rt.asks_for_gpus(run.tags),
        age_s,
        worker,
        awaits_resumption=awaits_resumption(run.status.value, run.tags),
    )


_WORKERS: dict[str, run_workers.Worker] = {}  # run id -> its worker process, once it logged one


def run_views(instance: DagsterInstance, watched: Mapping[str, DagsterRun]) -> dict[str, RunView]:
    """Reconcile's view of each watched run; for a run in progress, how long its status has not
    changed and whether its worker lives (known for workers on this host, `run_workers.py`)."""
    now = time.time()  # against Dagster's own timestamps, whatever clock the tick was given
    busy = sorted(rid for rid, r in watched.items() if r.status.value in IN_PROGRESS)
    records = {r.dagster_run.run_id: r for r in instance.get_run_records(RunsFilter(run_ids=busy))} if busy else {}
    for rid in set(_WORKERS) - set(busy):
        del _WORKERS[rid]
    views = {}
    for rid, run in watched.items():
        record = records.get(rid)
        if record is None:
            views[rid] = run_view(run)
            continue
        worker = None
        if run_workers.is_local(record.dagster_run):
            if rid not in _WORKERS and (found := run_workers.find_worker(instance, rid)) is not None:
                _WORKERS[rid] = found
            worker = run_workers.alive(_WORKERS[rid]) if rid in _WORKERS else None
        views[rid] = run_view(record.dagster_run, max(0.0, now - record.update_timestamp.timestamp()), worker)
    return views


def monitoring_bounds(instance: DagsterInstance) -> Bounds:
    """Dagster's run monitoring timeouts, which reconcile shares."""
    return Bounds(
        float(instance.run_monitoring_start_timeout_seconds), float(instance.run_monitoring_cancel_timeout_seconds)
    )


def end_run(instance: DagsterInstance, run_id: str, why: str) -> None:
    """End a run in progress whose worker is gone: cancelled when it was cancelling, else failed.
    Read again first: a worker that exited after the tick's read wrote its final status before."""
    run = instance.get_run_by_id(run_id)
    if run is None or run.is_finished:
        return
    message = f"the platform ended this run: {why}"
    if run.status.value == CANCELING:
        instance.report_run_canceled(run, message)
    else:
        instance.report_run_failed(run, message)
