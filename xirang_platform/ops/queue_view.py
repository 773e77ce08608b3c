"""The queue view (`xirang queue`, DESIGN.md section 10): every waiting run with its place in its tier,
its hold reason, since when it waits and when it may start.

Position: the run's place among its tier's waiting runs in the cycle's own order (`order.queue_order`
over the balances now), 1 for the next one considered.

Estimated start, from the running work's expected ends: a live allocation's run is expected to end
its historical duration (the median of its job's last successful runs) after it started; an
allocation without that history has no expected end. A run held for capacity (or waiting for the
tick, or for a starving gang) starts once the idle GPUs plus those freed by expected ends, earliest
first, cover its ask and the asks of every run the cycle considers before it; a run held for quota
once its tenant's (and project's) expected releases bring it under the cap with its ask. When the
known ends do not get there, the estimate is `unknown`: never a made-up figure. GPUs are counted,
not placed: fragmentation can make the real start later.

Every reader gets its figures here: the CLI and the `gpu_pool` asset through `read_queue`, the
scheduling tick's tags on each held run (`sensors/queue_tags.py`) through `queue_rows` on its own
state, all of them from `estimate_starts`, the estimate's one source. In the UI a row reads as
`position_text` (`#2 in online-training`) and `estimate_text` (`~14:05 UTC`: an absolute time that
changes only when the estimate does, so the tags are not rewritten every tick).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from xirang_platform.ops.waiting import WaitingRun, waiting_runs
from xirang_platform.platform import tag_parsing
from xirang_platform.platform.pool_state import cap_ratio_now
from xirang_platform.scheduling.model import Allocation, Request
from xirang_platform.scheduling.order import queue_order
from xirang_platform.scheduling.quota import AccountKey, Balance, QuotaBook, cap

UNKNOWN = "unknown"
HISTORY_RUNS = 20  # how many of a job's last successful runs its duration is the median of
CAPACITY_KINDS = ("capacity", "queued", "reserved", "reconcile")


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
    book: QuotaBook,
    balances: Mapping[AccountKey, Balance],
    allocations: Sequence[Allocation],
    ends: Mapping[str, float | None],
    pool_milli: int,
    ratio: float,
    now: float,
) -> list[QueueRow]:
    """The rows of the waiting runs whose tags parse, in the cycle's order. `ends`: per live
    allocation id, its expected end (None: unknown)."""
    order = list(queue_order([requests[w.run_id] for w in waiting if w.run_id in requests], book, balances))
    by_id = {w.run_id: w for w in waiting}
    idle = pool_milli - sum(a.milli for a in allocations)
    running = [(a, ends.get(a.id)) for a in allocations]
    starts = estimate_starts([(r, by_id[r.id].hold_kind) for r in order], running, idle, book, balances, ratio, now)
    rows: list[QueueRow] = []
    seen: dict[str, int] = {}
    for r, start in zip(order, starts, strict=True):
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
                start,
            )
        )
    return rows


def estimate_starts(
    waiting: Sequence[tuple[Request, str]],
    running: Sequence[tuple[Allocation, float | None]],
    idle_milli: int,
    book: QuotaBook,
    balances: Mapping[AccountKey, Balance],
    ratio: float,
    now: float,
) -> list[float | None]:
    """The estimated start of each waiting request (None: unknown), the estimator's pure core, used
    by the live view and the replay bench alike. `waiting`: the requests in the cycle's order, each
    with its hold kind (`waiting.hold_kind`); `running`: the live allocations, each with its expected
    end (None: unknown); `idle_milli`: the pool's unallocated milli; `ratio`: the cap ratio now."""
    known = sorted(((t, a) for a, t in running if t is not None), key=lambda pair: (pair[0], pair[1].id))
    starts: list[float | None] = []
    ahead = 0
    freed = _Freed(idle_milli, known)
    for r, kind in waiting:
        ahead += r.total_milli
        if kind == "quota":
            starts.append(_under_cap(r, book, balances, known, ratio, now))
        elif kind in CAPACITY_KINDS:
            starts.append(freed.covering(ahead, now))
        else:
            starts.append(None)
    return starts


class _Freed:
    """The milli free as the known ends pass, earliest first: idle plus what those ends release.
    `covering` is asked for growing needs (the asks ahead add up), so one pass serves a whole queue."""

    def __init__(self, idle: int, known: Sequence[tuple[float, Allocation]]) -> None:
        self.free, self.known, self.i = idle, known, 0

    def covering(self, need: int, now: float) -> float | None:
        """When the free milli first cover `need` (now if they already do; None if the known ends never do)."""
        while self.free < need and self.i < len(self.known):
            self.free += self.known[self.i][1].milli
            self.i += 1
        if self.free < need:
            return None
        return now if self.i == 0 else max(now, self.known[self.i - 1][0])


def _under_cap(
    r: Request,
    book: QuotaBook,
    balances: Mapping[AccountKey, Balance],
    known: Sequence[tuple[float, Allocation]],
    ratio: float,
    now: float,
) -> float | None:
    """When the known ends of its own accounts' work bring every capped account under its cap with `r`."""
    keys = [k for k in book.keys_for(r.tenant, r.project) if k in balances]
    over = {k: balances[k].in_quota + r.total_milli - cap(balances[k].quota, ratio) for k in keys}
    if all(v <= 0 for v in over.values()):
        return now
    for t, a in known:
        if a.borrowed:
            continue
        for k in keys:
            if k in book.keys_for(a.request.tenant, a.request.project):
                over[k] -= a.milli
        if all(v <= 0 for v in over.values()):
            return max(now, t)
    return None


def expected_ends(instance: DagsterInstance, allocations: Sequence[Allocation]) -> dict[str, float | None]:
    """Per live allocation, its run's start plus its job's historical duration (None without history)."""
    if not allocations:
        return {}
    records = {
        r.dagster_run.run_id: r for r in instance.get_run_records(RunsFilter(run_ids=[a.id for a in allocations]))
    }
    medians: dict[str, float | None] = {}
    out: dict[str, float | None] = {}
    for a in allocations:
        record = records.get(a.id)
        if record is None:
            out[a.id] = None
            continue
        job = record.dagster_run.job_name
        if job not in medians:
            medians[job] = _median_duration(instance, job)
        started = record.start_time or a.start
        out[a.id] = None if medians[job] is None else started + float(medians[job] or 0.0)
    return out


def _median_duration(instance: DagsterInstance, job: str) -> float | None:
    done = instance.get_run_records(RunsFilter(job_name=job, statuses=[DagsterRunStatus.SUCCESS]), limit=HISTORY_RUNS)
    durations = [r.end_time - r.start_time for r in done if r.start_time and r.end_time]
    return statistics.median(durations) if durations else None


def read_queue(
    instance: DagsterInstance, ledger: Any, platform: Any, now: float, tenant: str | None = None
) -> list[QueueRow]:
    """The queue view of `instance` and `ledger` under `platform` (the pool, the tenants' projects, the
    overcommit policy); `tenant` keeps that tenant's runs only (positions stay the whole tier's)."""
    waiting = waiting_runs(instance)
    requests = {}
    for w in waiting:
        projects = platform.projects_of(w.tenant) if w.tenant in platform.book.tenants else None
        parsed = tag_parsing.parse(w.tags, w.tenant or None, run_id=w.run_id, submit_time=w.since, projects=projects)
        if isinstance(parsed, Request):
            requests[w.run_id] = parsed
    book, balances = ledger.snapshot()
    allocations = ledger.allocations()
    pool_milli = platform.pool.gpu_milli
    ratio = cap_ratio_now(platform.overcommit, sum(a.milli for a in allocations), pool_milli)
    rows = queue_rows(
        waiting, requests, book, balances, allocations, expected_ends(instance, allocations), pool_milli, ratio, now
    )
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
