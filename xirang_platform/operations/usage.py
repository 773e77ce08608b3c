"""GPU usage and chargeback per tenant, project and UTC day, rebuilt from the ledger's entries
(DESIGN.md section 10), so it equals the ledger's history to the GPU-second.

Replaying the entries in order gives, between two instants at which entries were written, which
allocation held how much and how (in quota or borrowed), and each tenant's quota. Over each span:

- **in quota**: milli held in quota (reserved or used), per the allocation's tenant and project;
- **borrowed**: milli held past the cap. It is charged to the lenders whose quota was idle then
  (quota less in-quota milli, at least 0), in proportion to that idle quota, divided by the larger of
  the other tenants' idle quota and all the borrowed milli of the moment, so no lender is credited
  more than it had idle; what no tenant's idle quota covers came from the pool itself (`pool`);
- **lent**: the same milli credited to the lender, on its tenant row (project `""`);
- **preempted**: the GPU-hours a preempted allocation had held, on the day of its preemption;
- **lost**: of those, the part since its last checkpoint (`checkpoint_interval_s`; without one the
  whole run), the simulator's rule;
- **resizes**: how often an elastic run of the project was restarted at a new size that day (its
  `resize` entries: the old size stops counting and the new one counts from then, in quota or borrowed).

A span crossing midnight is split at it. Live allocations are counted up to `until`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from xirang_platform.ledger.rebuild import EntryView
from xirang_platform.ledger.tables import Bucket, EntryKind

POOL = "pool"  # the lender of borrowed milli no tenant's idle quota covers


@dataclass
class UsageRow:
    """One tenant's (project's) usage on one day, in GPU-seconds."""

    day: date
    tenant: str
    project: str  # "" for the tenant's own row (what it lent)
    in_quota_s: float = 0.0
    borrowed_s: float = 0.0
    borrowed_from_s: dict[str, float] = field(default_factory=dict)
    lent_s: float = 0.0
    preempted_s: float = 0.0
    lost_s: float = 0.0
    resizes: int = 0

    def as_dict(self) -> dict[str, object]:
        """The row in GPU-hours, for JSON and the asset's table."""
        hours = 3600.0
        return {
            "day": self.day.isoformat(),
            "tenant": self.tenant,
            "project": self.project,
            "in_quota_gpu_h": round(self.in_quota_s / hours, 6),
            "borrowed_gpu_h": round(self.borrowed_s / hours, 6),
            "borrowed_from_gpu_h": {k: round(v / hours, 6) for k, v in sorted(self.borrowed_from_s.items())},
            "lent_gpu_h": round(self.lent_s / hours, 6),
            "preempted_gpu_h": round(self.preempted_s / hours, 6),
            "lost_gpu_h": round(self.lost_s / hours, 6),
            "resizes": self.resizes,
        }


@dataclass
class _Held:
    tenant: str
    project: str
    milli: int
    borrowed: bool
    since: float


def usage(
    entries: Iterable[EntryView],
    first: date,
    last: date,
    until: float,
    checkpoint_interval_s: float | None = None,
) -> list[UsageRow]:
    """The usage rows of the days `first`..`last` (inclusive, UTC), sorted by day, tenant, project;
    rows with nothing in them are left out. `entries` in the order written; `until` ends live holdings."""
    if last < first:
        raise ValueError(f"the last day {last} is before the first {first}: give --from on or before --to")
    start, end = _midnight(first), min(until, _midnight(last + timedelta(days=1)))
    entries = list(entries)
    # An allocation's project is the account of its project entries (written beside its tenant's).
    projects = {
        e.allocation_id: e.account.split("/", 1)[1] for e in entries if "/" in e.account and e.allocation_id is not None
    }
    rows: dict[tuple[date, str, str], UsageRow] = {}
    quota: dict[str, int] = {}
    held: dict[int, _Held] = {}
    now: float | None = None
    for e in entries:
        if now is not None and e.at > now:
            _accrue(rows, held, quota, max(now, start), min(e.at, end))
        now = e.at if now is None else max(now, e.at)
        if "/" not in e.account:
            _apply(e, held, quota, projects, rows, start, end, checkpoint_interval_s)
    if now is not None:
        _accrue(rows, held, quota, max(now, start), end)
    return [rows[k] for k in sorted(rows) if _nonzero(rows[k])]


def _apply(
    e: EntryView,
    held: dict[int, _Held],
    quota: dict[str, int],
    projects: dict[int, str],
    rows: dict[tuple[date, str, str], UsageRow],
    start: float,
    end: float,
    step: float | None,
) -> None:
    """One tenant-account entry's change to the holdings (its project entry was or will be read)."""
    tenant = e.account
    if e.kind == EntryKind.QUOTA:
        quota[tenant] = quota.get(tenant, 0) + e.amount
        return
    if e.allocation_id is None:
        return
    a = e.allocation_id
    if e.kind in (EntryKind.RESERVE, EntryKind.BORROW) and e.amount > 0:
        held[a] = _Held(tenant, projects.get(a, ""), e.amount, e.kind == EntryKind.BORROW, e.at)
    elif e.kind == EntryKind.RETURN and e.bucket == Bucket.BORROWED and a in held:
        held[a].borrowed = False
    elif e.kind in (EntryKind.RELEASE, EntryKind.PREEMPT) and a in held:
        h = held.pop(a)
        if e.kind == EntryKind.PREEMPT and start <= e.at < end:
            ran = e.at - h.since
            saved = math.floor(ran / step) * step if step else 0.0
            row = _row(rows, e.at, h.tenant, h.project)
            row.preempted_s += ran * h.milli / 1000
            row.lost_s += (ran - saved) * h.milli / 1000
    elif e.kind == EntryKind.RESIZE and e.amount < 0:
        held.pop(a, None)  # the old size, given back
    elif e.kind == EntryKind.RESIZE:
        held[a] = _Held(tenant, projects.get(a, ""), e.amount, e.bucket == Bucket.BORROWED, e.at)
        if start <= e.at < end:
            _row(rows, e.at, tenant, projects.get(a, "")).resizes += 1


def _accrue(
    rows: dict[tuple[date, str, str], UsageRow],
    held: dict[int, _Held],
    quota: dict[str, int],
    t0: float,
    t1: float,
) -> None:
    """Add the holdings over [t0, t1), split at midnights."""
    while t0 < t1:
        cut = min(t1, _midnight(_day(t0) + timedelta(days=1)))
        _accrue_span(rows, held, quota, t0, cut - t0)
        t0 = cut


def _accrue_span(
    rows: dict[tuple[date, str, str], UsageRow], held: dict[int, _Held], quota: dict[str, int], t0: float, span: float
) -> None:
    in_quota: dict[str, int] = {}
    for h in held.values():
        if not h.borrowed:
            in_quota[h.tenant] = in_quota.get(h.tenant, 0) + h.milli
    idle = {t: max(0, q - in_quota.get(t, 0)) for t, q in quota.items()}
    borrowed_total = sum(h.milli for h in held.values() if h.borrowed)
    for h in sorted(held.values(), key=lambda h: (h.tenant, h.project, h.since)):
        row = _row(rows, t0, h.tenant, h.project)
        milli_s = h.milli * span / 1000
        if not h.borrowed:
            row.in_quota_s += milli_s
            continue
        row.borrowed_s += milli_s
        lenders = {t: v for t, v in idle.items() if t != h.tenant and v > 0}
        covered = max(sum(lenders.values()), borrowed_total)
        from_pool = milli_s
        for lender, v in sorted(lenders.items()):
            part = milli_s * v / covered
            row.borrowed_from_s[lender] = row.borrowed_from_s.get(lender, 0.0) + part
            _row(rows, t0, lender, "").lent_s += part
            from_pool -= part
        if from_pool > 1e-9:
            row.borrowed_from_s[POOL] = row.borrowed_from_s.get(POOL, 0.0) + from_pool


def _row(rows: dict[tuple[date, str, str], UsageRow], t: float, tenant: str, project: str) -> UsageRow:
    key = (_day(t), tenant, project)
    if key not in rows:
        rows[key] = UsageRow(*key)
    return rows[key]


def _nonzero(r: UsageRow) -> bool:
    return any((r.in_quota_s, r.borrowed_s, r.lent_s, r.preempted_s, r.lost_s, r.resizes))


def _day(t: float) -> date:
    return datetime.fromtimestamp(t, UTC).date()


def _midnight(d: date) -> float:
    return datetime(d.year, d.month, d.day, tzinfo=UTC).timestamp()


def totals(rows: Sequence[UsageRow]) -> dict[str, float]:
    """GPU-hours summed over `rows`: in quota, borrowed, lent, preempted, lost; and the resizes."""
    return {
        "in_quota_gpu_h": sum(r.in_quota_s for r in rows) / 3600,
        "borrowed_gpu_h": sum(r.borrowed_s for r in rows) / 3600,
        "lent_gpu_h": sum(r.lent_s for r in rows) / 3600,
        "preempted_gpu_h": sum(r.preempted_s for r in rows) / 3600,
        "lost_gpu_h": sum(r.lost_s for r in rows) / 3600,
        "resizes": float(sum(r.resizes for r in rows)),
    }


def usage_table(docs: list[dict[str, Any]]) -> str:
    """The usage rows as a Markdown table (GPU-hours), for the terminal and the asset's metadata."""
    lines = [
        "| day | tenant | project | in quota | borrowed | borrowed from | lent | preempted | lost | resizes |",
        "|---|---|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for d in docs:
        lenders = ", ".join(f"{k} {v:g}" for k, v in d["borrowed_from_gpu_h"].items()) or "-"
        lines.append(
            f"| {d['day']} | {d['tenant']} | {d['project'] or '(tenant)'} | {d['in_quota_gpu_h']:g} | "
            f"{d['borrowed_gpu_h']:g} | {lenders} | {d['lent_gpu_h']:g} | {d['preempted_gpu_h']:g} | "
            f"{d['lost_gpu_h']:g} | {d.get('resizes', 0)} |"
        )
    return "\n".join(lines)
