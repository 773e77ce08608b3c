"""Counts of the ledger's history for the exporter (DESIGN.md section 10), read from the entries.

Each admission, preemption, return and release writes one entry per charged account (its tenant's and
its project's); these queries count the tenant account's entry, so each event counts once, and read
the tenant, project and tier from the allocation it names. The counts only grow (entries are
append-only), so they are Prometheus counters that survive an exporter's restart.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import Connection, and_, func, select

from xirang_platform.ledger.tables import ALLOCATIONS, ENTRIES, AllocState, Bucket, EntryKind

# The `release` cause the tick's reconcile writes when it gives back units a run no longer holds.
RECONCILE_CAUSE = "reconcile"


class Event(StrEnum):
    """What a counted entry records."""

    ADMISSION = "admission"  # a reserve (in quota) or borrow (past the cap) entry
    PREEMPTION = "preemption"
    RETURN = "return"  # a borrowed allocation turned in-quota
    RESIZE = "resize"  # an elastic run restarted at a new size (detail: grow or shrink)
    REPAIR = "repair"  # units released by the tick's reconcile


@dataclass(frozen=True, order=True)
class EventCount:
    """How many `event`s the ledger recorded for one tenant, project and tier (and `detail`: for an
    admission `borrowed` or `in-quota`, for a preemption its reason, for a resize `grow` or `shrink`,
    else empty)."""

    event: Event
    tenant: str
    project: str
    tier: str
    detail: str
    count: int


def event_counts(conn: Connection) -> list[EventCount]:
    """Every event count, in (event, tenant, project, tier, detail) order."""
    a, e = ALLOCATIONS, ENTRIES
    detail = {
        Event.ADMISSION: e.c.kind,
        Event.PREEMPTION: e.c.cause,
        Event.RETURN: e.c.bucket,
        Event.RESIZE: e.c.cause,
        Event.REPAIR: e.c.cause,
    }
    where = {
        Event.ADMISSION: e.c.kind.in_([EntryKind.RESERVE.value, EntryKind.BORROW.value]),
        Event.PREEMPTION: e.c.kind == EntryKind.PREEMPT.value,
        # A return writes two entries per account (out of borrowed, into used or reserved): count one.
        Event.RETURN: and_(e.c.kind == EntryKind.RETURN.value, e.c.bucket == Bucket.BORROWED.value),
        # A resize writes two entries per account (the old size out, the new one in): count the new one.
        Event.RESIZE: and_(e.c.kind == EntryKind.RESIZE.value, e.c.amount > 0),
        Event.REPAIR: and_(e.c.kind == EntryKind.RELEASE.value, e.c.cause == RECONCILE_CAUSE),
    }
    out: list[EventCount] = []
    for event in Event:
        query = (
            select(a.c.tenant, a.c.project, a.c.tier, detail[event], func.count())
            .select_from(e.join(a, a.c.id == e.c.allocation_id))
            .where(where[event], e.c.account == a.c.tenant)
            .group_by(a.c.tenant, a.c.project, a.c.tier, detail[event])
        )
        for tenant, project, tier, what, count in conn.execute(query):
            out.append(EventCount(event, tenant, project, tier, _detail(event, what), count))
    return sorted(out)


def _detail(event: Event, value: str) -> str:
    if event is Event.ADMISSION:
        return "borrowed" if value == EntryKind.BORROW.value else "in-quota"
    if event in (Event.PREEMPTION, Event.RESIZE):
        return value
    return ""


@dataclass(frozen=True, order=True)
class AllocatedMilli:
    """The milli the live allocations of one tenant, project and tier hold, in-quota or `borrowed`."""

    tenant: str
    project: str
    tier: str
    borrowed: bool
    milli: int


def allocated_milli(conn: Connection) -> list[AllocatedMilli]:
    """The live allocations' milli summed per tenant, project, tier and borrowed, in that order."""
    a = ALLOCATIONS
    query = (
        select(a.c.tenant, a.c.project, a.c.tier, a.c.borrowed, func.sum(a.c.milli))
        .where(a.c.state != AllocState.RELEASED.value)
        .group_by(a.c.tenant, a.c.project, a.c.tier, a.c.borrowed)
    )
    return sorted(AllocatedMilli(t, p, tier, bool(b), int(m)) for t, p, tier, b, m in conn.execute(query))
