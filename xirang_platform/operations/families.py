"""The exporter's metric families (DESIGN.md section 10), built from what was read, with no I/O.

GPU figures are in GPUs (milli / 1000). An account family has `tenant` and `project` labels; a
tenant's own account has `project=""`, so `{project=""}` selects tenants and `{project!=""}` projects
(summing both would count a tenant's work twice). Counters come from the ledger's entries, so they
survive restarts of the exporter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from xirang_platform.control.pool_state import cap_ratio_now
from xirang_platform.ledger.counters import Event
from xirang_platform.ledger.read_only import LedgerFigures
from xirang_platform.operations.tick_record import StepHistogram
from xirang_platform.operations.waiting import WaitingRun
from xirang_platform.pool.model import MILLI_PER_GPU, Pool
from xirang_platform.scheduling.quota import OvercommitPolicy, cap

ACCOUNT = ["tenant", "project"]
WORK = ["tenant", "project", "tier"]


@dataclass(frozen=True)
class Readings:
    """Everything one scrape read."""

    pool: Pool
    policy: OvercommitPolicy
    ledger: LedgerFigures
    waiting: Sequence[WaitingRun]
    ticks: Mapping[str, StepHistogram]
    now: float
    config_problem: str | None = None  # why the platform config file is not in force (None: it is)


def families(r: Readings) -> list[Metric]:
    """Every family of one scrape, in a fixed order, each metric's labels sorted."""
    return [*_pool(r), *_accounts(r), *_queue(r), *_counters(r), _ticks(r), *_config(r), _up(1)]


def unavailable() -> list[Metric]:
    """What a scrape that could not read the ledger or the instance serves: `xirang_up 0`."""
    return [_up(0)]


def _up(value: int) -> Metric:
    up = GaugeMetricFamily("xirang_up", "1 when the exporter read the ledger and the Dagster instance, else 0")
    up.add_metric([], value)
    return up


def _config(r: Readings) -> Iterable[Metric]:
    ok = GaugeMetricFamily(
        "xirang_config_ok",
        "1 when the platform config file is in force, 0 when an edit of it is refused and the platform runs on "
        "its last good config (xirang_config_problem says why; `xirang check-config` too)",
    )
    ok.add_metric([], 0 if r.config_problem else 1)
    problem = GaugeMetricFamily(
        "xirang_config_problem", "1, labelled with why the platform config file is not in force", labels=["problem"]
    )
    if r.config_problem:
        problem.add_metric([r.config_problem], 1)
    return [ok, problem]


def _pool(r: Readings) -> Iterable[Metric]:
    pool = GaugeMetricFamily("xirang_pool_gpus", "GPUs in the pool, by model", labels=["gpu_model"])
    by_model: dict[str, int] = {}
    for node in r.pool.nodes:
        if node.gpus:
            by_model[node.model_name] = by_model.get(node.model_name, 0) + node.gpus
    for model, n in sorted(by_model.items()):
        pool.add_metric([model], n)
    allocated = GaugeMetricFamily(
        "xirang_allocated_gpus", "GPUs the live allocations hold (in quota and borrowed)", labels=WORK
    )
    per_work: dict[tuple[str, str, str], int] = {}
    for h in r.ledger.held:
        key = (h.tenant, h.project, h.tier)
        per_work[key] = per_work.get(key, 0) + h.milli
    for key, milli in sorted(per_work.items()):
        allocated.add_metric(list(key), _gpus(milli))
    held = sum(per_work.values())
    idle = GaugeMetricFamily("xirang_idle_gpus", "GPUs of the pool no allocation holds")
    idle.add_metric([], _gpus(max(0, r.pool.gpu_milli - held)))
    return [pool, allocated, idle]


def _accounts(r: Readings) -> Iterable[Metric]:
    ratio = cap_ratio_now(r.policy, sum(h.milli for h in r.ledger.held), r.pool.gpu_milli)
    quota = GaugeMetricFamily("xirang_quota_gpus", "Each limited account's quota", labels=ACCOUNT)
    capped = GaugeMetricFamily(
        "xirang_cap_gpus",
        f"Each limited account's cap: quota x the ratio at the pool's allocation now ({ratio:.3f})",
        labels=ACCOUNT,
    )
    ceiling = GaugeMetricFamily(
        "xirang_cap_ceiling_gpus",
        f"Each limited account's highest cap: quota x {r.policy.max_ratio:g}, its cap while the pool is at most "
        f"{r.policy.low:.0%} allocated",
        labels=ACCOUNT,
    )
    used = GaugeMetricFamily("xirang_used_gpus", "In-quota GPUs of confirmed launches, per account", labels=ACCOUNT)
    reserved = GaugeMetricFamily(
        "xirang_reserved_gpus", "In-quota GPUs admitted, launch not yet confirmed, per account", labels=ACCOUNT
    )
    borrowed = GaugeMetricFamily(
        "xirang_borrowed_gpus", "GPUs held past the cap on idle units, per account", labels=ACCOUNT
    )
    for v in r.ledger.accounts:
        labels = [v.key.tenant, v.key.project or ""]
        if v.quota is not None:
            quota.add_metric(labels, _gpus(v.quota))
            capped.add_metric(labels, _gpus(cap(v.quota, ratio)))
            ceiling.add_metric(labels, _gpus(cap(v.quota, r.policy.max_ratio)))
        used.add_metric(labels, _gpus(v.used))
        reserved.add_metric(labels, _gpus(v.reserved))
        borrowed.add_metric(labels, _gpus(v.balance.borrowed))
    return [quota, capped, ceiling, used, reserved, borrowed]


def _queue(r: Readings) -> Iterable[Metric]:
    pending = GaugeMetricFamily(
        "xirang_pending_runs", "Runs waiting behind the closed gate, by hold kind", labels=[*WORK, "reason"]
    )
    oldest = GaugeMetricFamily(
        "xirang_oldest_pending_seconds", "How long the oldest waiting run has waited", labels=WORK
    )
    counts: dict[tuple[str, ...], int] = {}
    first: dict[tuple[str, ...], float] = {}
    for w in r.waiting:
        counts[(w.tenant, w.project, w.tier, w.hold_kind)] = (
            counts.get((w.tenant, w.project, w.tier, w.hold_kind), 0) + 1
        )
        key = (w.tenant, w.project, w.tier)
        first[key] = min(first.get(key, w.since), w.since)
    for key4, n in sorted(counts.items()):
        pending.add_metric(list(key4), n)
    for key3, since in sorted(first.items()):
        oldest.add_metric(list(key3), max(0.0, r.now - since))
    return [pending, oldest]


_COUNTERS = {
    Event.ADMISSION: ("xirang_admissions", "Admissions the ledger recorded (kind: in-quota or borrowed)", "kind"),
    Event.PREEMPTION: ("xirang_preemptions", "Preemptions the ledger recorded, by reason", "reason"),
    Event.RETURN: ("xirang_returns", "Borrowed allocations turned in-quota", None),
    Event.RESIZE: ("xirang_resizes", "Elastic runs restarted at a new size, by direction (grow, shrink)", "kind"),
    Event.REPAIR: (
        "xirang_reconcile_repairs",
        "Allocations the tick's reconcile released",
        None,
    ),
}


def _counters(r: Readings) -> Iterable[Metric]:
    out = []
    for event, (name, text, detail) in _COUNTERS.items():
        family = CounterMetricFamily(name, text, labels=[*WORK, detail] if detail else WORK)
        for c in r.ledger.events:
            if c.event is event:
                labels = [c.tenant, c.project, c.tier] + ([c.detail] if detail else [])
                family.add_metric(labels, c.count)
        out.append(family)
    return out


def _ticks(r: Readings) -> Metric:
    family = HistogramMetricFamily(
        "xirang_tick_duration_seconds", "The scheduling tick's step durations", labels=["step"]
    )
    for step, h in sorted(r.ticks.items()):
        family.add_metric([step], h.cumulative(), sum_value=h.sum_s)
    return family


def _gpus(milli: int) -> float:
    return milli / MILLI_PER_GPU
