"""The queue view (`xirang queue`, DESIGN.md section 10): every waiting run with its place in its tier,
its hold reason, since when it waits and when it may start.

Position: the run's place among its tier's waiting runs in the cycle's own order (`order.queue_order`
over the balances now), 1 for the next one considered.

Estimated start, by forward simulation (`simulate/eta.py`): the waiting runs are replayed through the
scheduler's own `cycle` in simulated time from the snapshot of now, and a run's estimate is the instant
a simulated cycle admits it. Running work ends at its expected end: its start plus its
`xirang/expected-duration` tag, else plus the median of its job's last successful runs, else unknown;
a waiting run, once admitted, runs for the same figure of its own (`forecast`). Where only an unknown
end could start a run, its estimate is `unknown`: never a made-up figure.

Every reader gets its figures here: the CLI and the `gpu_pool` asset through `read_queue`, the
scheduling tick's tags on each held run (`sensors/queue_tags.py`) through `queue_rows` on its own
state, all of them from `simulate.eta.estimate_starts`, the estimate's one source. In the UI a row reads as
`position_text` (`#2 in online-training`) and `estimate_text` (`~14:05 UTC`: an absolute time that
changes only when the estimate does, so the tags are not rewritten every tick).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from xirang_platform.control import tag_parsing
from xirang_platform.operations.waiting import WaitingRun, waiting_runs
from xirang_platform.scheduling.config import SchedulerConfig
from xirang_platform.scheduling.cycle_memo import CycleMemo
from xirang_platform.scheduling.model import Allocation, Request
from xirang_platform.scheduling.order import queue_order
from xirang_platform.scheduling.quota import balances_from
from xirang_platform.scheduling.snapshot import Snapshot
from xirang_platform.simulate.eta import Forecast, estimate_starts

UNKNOWN = "unknown"
HISTORY_RUNS = 20  # how many of a job's last successful runs its duration is the median of


@dataclass(frozen=True)
class QueueRow:
    """One waiting run as the queue view shows it."""

    run_id: str
    tenant: str
    project: str
    tier: str
    gpus: float
    position: int  # in its tier, 1 = next
    hold_reason: str
    waiting_since: float
    estimated_start: float | None  # Unix seconds; None when unknown

    def as_dict(self, now: float) -> dict[str, Any]:
        """The row for JSON: times as ISO 8601 UTC, the wait in seconds, `unknown` for no estimate."""
        return {
            "run_id": self.run_id,
            "tenant": self.tenant,
            "project": self.project,
            "tier": self.tier,
            "gpus": self.gpus,
            "position": self.position,
            "hold_reason": self.hold_reason,
            "waiting_since": _iso(self.waiting_since),
            "waited_s": round(max(0.0, now - self.waiting_since), 3),
            "estimated_start": UNKNOWN if self.estimated_start is None else _iso(self.estimated_start),
        }


def queue_rows(
    waiting: Sequence[WaitingRun],
    requests: Mapping[str, Request],
    snapshot: Snapshot,
    config: SchedulerConfig,
    forecast: Forecast,
    now: float,
    memo: CycleMemo | None = None,
    out_of_time: Callable[[], bool] | None = None,
    estimate: bool = True,
) -> list[QueueRow]:
    """The rows of the waiting runs whose tags parse, in the cycle's order, each with its simulated
    start (`simulate.eta.estimate_starts` from `snapshot` under `config`); a run already admitted and
    waiting for its victims to stop starts now. `memo`: the tick's last cycle memo, if any;
    `out_of_time`: the tick's wall-clock guard (`estimate_starts`); `estimate=False`: positions only
    (every row's `estimated_start` None), without the forward simulation."""
    balances = snapshot.balances
    if balances is None:
        balances = balances_from(snapshot.book, snapshot.allocations.values())
    order = list(queue_order([requests[w.run_id] for w in waiting if w.run_id in requests], snapshot.book, balances))
    # A run admitted and waiting for its victims to stop holds its units already: it starts now.
    queued = [r for r in order if r.id not in snapshot.allocations]
    starts: dict[str, float | None] = {r.id: None for r in queued}
    if estimate:
        starts = estimate_starts(snapshot, queued, now, config, forecast, memo=memo, out_of_time=out_of_time).starts
    by_id = {w.run_id: w for w in waiting}
    rows: list[QueueRow] = []
    seen: dict[str, int] = {}
    for r in order:
        w = by_id[r.id]
        seen[r.tier.value] = seen.get(r.tier.value, 0) + 1
        rows.append(
            QueueRow(
                r.id,
                r.tenant,
                r.project,
                r.tier.value,
                r.total_milli / 1000,
                seen[r.tier.value],
                w.hold_reason,
                w.since,
                starts.get(r.id, now),
            )
        )
    return rows


def forecast(instance: DagsterInstance, allocations: Sequence[Allocation], waiting: Sequence[str]) -> Forecast:
    """What the estimate knows of time: per live allocation its expected end (its run's start plus its
    expected duration), per waiting run id its expected duration. A run's expected duration is its
    `xirang/expected-duration` tag, else the median of its job's last successful runs, else unknown."""
    ids = [a.id for a in allocations] + list(waiting)
    if not ids:
        return Forecast()
    records = {r.dagster_run.run_id: r for r in instance.get_run_records(RunsFilter(run_ids=ids))}
    medians: dict[str, float | None] = {}

    def duration(run_id: str) -> float | None:
        record = records.get(run_id)
        if record is None:
            return None
        declared = tag_parsing.expected_duration(record.dagster_run.tags)
        if declared is not None:
            return declared
        job = record.dagster_run.job_name
        if job not in medians:
            medians[job] = _median_duration(instance, job)
        return medians[job]

    ends: dict[str, float | None] = {}
    for a in allocations:
        took = duration(a.id)
        record = records.get(a.id)
        started = (record.start_time if record is not None else None) or a.start
        ends[a.id] = None if took is None else started + took
    return Forecast(ends, {rid: duration(rid) for rid in waiting})


def _median_duration(instance: DagsterInstance, job: str) -> float | None:
    done = instance.get_run_records(RunsFilter(job_name=job, statuses=[DagsterRunStatus.SUCCESS]), limit=HISTORY_RUNS)
    durations = [r.end_time - r.start_time for r in done if r.start_time and r.end_time]
    return statistics.median(durations) if durations else None


def read_queue(
    instance: DagsterInstance, ledger: Any, platform: Any, now: float, tenant: str | None = None
) -> list[QueueRow]:
    """The queue view of `instance` and `ledger` under `platform` (the pool, the tenants' projects, the
    scheduler config); `tenant` keeps that tenant's runs only (positions and
    estimates stay the whole queue's)."""
    waiting = waiting_runs(instance)
    requests = {}
    for w in waiting:
        projects = platform.projects_of(w.tenant) if w.tenant in platform.book.tenants else None
        parsed = tag_parsing.parse(w.tags, w.tenant or None, run_id=w.run_id, submit_time=w.since, projects=projects)
        if isinstance(parsed, Request):
            requests[w.run_id] = parsed
    book, balances = ledger.snapshot()
    allocations = ledger.allocations()
    snapshot = replace(Snapshot.build(platform.pool, allocations, book), balances=balances)
    known = forecast(instance, allocations, sorted(requests))
    rows = queue_rows(waiting, requests, snapshot, platform.scheduler, known, now)
    return [r for r in rows if tenant is None or r.tenant == tenant]


def queue_table(rows: Sequence[QueueRow], now: float) -> str:
    """The rows as a Markdown table (the CLI prints it)."""
    lines = [
        "| run | tenant | project | tier | GPUs | position | waiting since | estimated start | hold reason |",
        "|---|---|---|---|---:|---:|---|---|---|",
    ]
    for r in rows:
        d = r.as_dict(now)
        lines.append(
            f"| {d['run_id']} | {d['tenant']} | {d['project']} | {d['tier']} | {d['gpus']:g} | {d['position']} | "
            f"{d['waiting_since']} | {d['estimated_start']} | {d['hold_reason']} |"
        )
    return "\n".join(lines)


def queue_markdown(rows: Sequence[QueueRow], now: float | None = None) -> str:
    """The queue view for the `gpu_pool` observation: the table, or a line saying nothing waits."""
    if not rows:
        return "no run is waiting"
    return queue_table(rows, time.time() if now is None else now)


def position_text(row: QueueRow) -> str:
    """The row's place for the UI: `#2 in online-training`."""
    return f"#{row.position} in {row.tier}"


def estimate_text(start: float | None, now: float) -> str:
    """An estimated start for the UI: `~14:05 UTC` (the minute it falls in, rounded up), with the
    date when it is not today (`~Dec 07 14:05 UTC`), `~now` when it is not later than `now`,
    `unknown` without an estimate."""
    if start is None:
        return UNKNOWN
    if start <= now:
        return "~now"
    at = datetime.fromtimestamp(math.ceil(start / 60) * 60, UTC)
    day = "" if at.date() == datetime.fromtimestamp(now, UTC).date() else at.strftime("%b %d ")
    return f"~{day}{at:%H:%M} UTC"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")
