"""The scheduling tick's queue tags: what a waiting run shows in Dagster's UI (DESIGN.md section 10).

Dagster's page of a queued run shows no events; the runs list shows a run's tags, and both offer the
queue-criteria dialog (`dagster_defs/queue_criteria.py`). So every tick gives each run whose gate
stays closed (held by the cycle, or admitted and waiting for its victims to stop):

- `xirang/gate`: the hold's kind (`capacity`, `quota`, `reserved`, ...), one of the closed values;
- `xirang/hold-reason`: the reason in full;
- `xirang/position`: its place in its tier (`#2 in online-training`);
- `xirang/estimated-start`: when it may start (`~14:05 UTC`, `~now`, `unknown`);

the last two from the queue view (`operations/queue_view.queue_rows` on the state the tick's plan leaves: the
queue replayed through the same cycle from the tick's own memo, the running work ending at its expected
ends), the figures `xirang queue` and the `gpu_pool` asset show. Only the tags whose value changed are
written, in the tick's one transaction of run tags; the estimate is an absolute time, which changes only
when the estimate does. The values on the first runs of each tier are recorded for the dialog
(`queue_criteria.record_queue_values`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from dagster import DagsterInstance, DagsterRun

from xirang_platform.control import run_tags as rt
from xirang_platform.control.platform_config import PlatformConfig
from xirang_platform.control.tick_plan import TickPlan
from xirang_platform.dagster_defs.queue_criteria import EXPLAINED_PER_TIER, record_queue_values
from xirang_platform.operations.queue_view import estimate_text, forecast, position_text, queue_rows
from xirang_platform.operations.waiting import waiting_run
from xirang_platform.scheduling.snapshot import Snapshot


def queue_tags(
    instance: DagsterInstance,
    platform: PlatformConfig,
    plan: TickPlan,
    closed: Mapping[str, str],
    runs: Mapping[str, DagsterRun],
    now: float,
    out_of_time: Callable[[], bool] | None = None,
    estimate: bool = True,
) -> dict[str, dict[str, str]]:
    """Run id -> the queue tags whose value changed, for each run of `closed` (run id -> its hold text:
    every run whose gate stays closed once `plan` is carried out; `runs` holds those runs as the tick
    read them). Records the values the queue-criteria dialog lists. `out_of_time`: the estimate's
    wall-clock guard; `estimate=False`: the estimated starts are left as they are (`estimate_due`)."""
    if not closed:  # nothing waits: no expected ends to read, nothing to explain
        record_queue_values(instance, {})
        return {}
    allocations = plan.allocations_after()
    requests = {a.id: a.request for a in allocations} | {r.id: r for r in plan.requests}
    waiting = [
        waiting_run(rid, {**runs[rid].tags, rt.HOLD_REASON: text}, now)
        for rid, text in sorted(closed.items())
        if rid in requests
    ]
    before = plan.snapshot
    after = replace(
        Snapshot.build(before.pool, allocations, before.book),
        balances=plan.balances_after(),
        lasting_idle=before.lasting_idle,
        idle_ahead=before.idle_ahead,
    )
    rows = queue_rows(
        waiting,
        requests,
        after,
        platform.scheduler,
        forecast(instance, allocations, [w.run_id for w in waiting]),
        now,
        memo=plan.result.memo,
        out_of_time=out_of_time,
        estimate=estimate,
    )
    wanted = {rid: {rt.GATE: rt.closed_gate(text), rt.HOLD_REASON: text} for rid, text in closed.items()}
    for row in rows:
        wanted[row.run_id][rt.POSITION] = position_text(row)
        if estimate:
            wanted[row.run_id][rt.ESTIMATED_START] = estimate_text(row.estimated_start, now)
        elif rt.ESTIMATED_START in runs[row.run_id].tags:  # the last estimate stands until the next one
            wanted[row.run_id][rt.ESTIMATED_START] = runs[row.run_id].tags[rt.ESTIMATED_START]
    record_queue_values(instance, {r.run_id: wanted[r.run_id] for r in rows if r.position <= EXPLAINED_PER_TIER})
    changed = {rid: {k: v for k, v in tags.items() if runs[rid].tags.get(k) != v} for rid, tags in wanted.items()}
    return {rid: tags for rid, tags in sorted(changed.items()) if tags}


ESTIMATE_SHARE = 0.1  # of the tick's time, at most, the queue estimate takes over many ticks


def estimate_due(last_started: float, last_took_s: float, now: float) -> bool:
    """Whether the tick estimates starts again at `now` (monotonic seconds), the last estimate having
    started at `last_started` and taken `last_took_s`: at most `ESTIMATE_SHARE` of the time goes to it.
    A small queue's estimate (milliseconds) is made every tick; at 4,000 nodes and 5,000 waiting runs
    (6-12 s, `bench/queue_estimate.py`) about once a minute or two, the held runs keeping their last
    estimated start meanwhile, so the tick keeps its interval instead of running back to back."""
    return now >= last_started + last_took_s / ESTIMATE_SHARE
