"""Each tenant's in-quota milli over a recent span, rebuilt from the entries: the live platform's
`quota.IdleHistory`, out of which a reclaimed borrower may borrow idle quota that has lasted
(`SchedulerConfig.lend_after_s`).

The simulator records the history as its cycles run; the live tick is stateless between runs and may
restart, so it rebuilds the same history from the ledger every tick. A tenant's in-quota milli at
`since` is its balance now less what its `used` and `reserved` entries changed after `since`; then the
history steps once per instant entries were written at, to the state after all of that instant's
entries (one transaction writes its entries at one instant, so a state inside a transaction never
shows, as `IdleHistory.record` keeps only the last state it saw at an instant). Entries written after
the caller's `now` (a writer whose clock runs ahead) count too: idle quota is only ever understated.

The pool's free milli over a recent span is rebuilt the same way, from the allocation rows' reserve
and release times (`lasting_free`): the least of it over the span is what elastic runs may grow into
(`Snapshot.lasting_free`, DESIGN.md section 11).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, Float, Integer, cast, literal, null, select, union_all

from xirang_platform.ledger.tables import ACCOUNTS, ALLOCATIONS, ENTRIES, Bucket
from xirang_platform.scheduling.elastic import LastingFree
from xirang_platform.scheduling.quota import AccountKey, IdleHistory, QuotaBook

IN_QUOTA_BUCKETS = (Bucket.USED.value, Bucket.RESERVED.value)


def read_in_quota_changes(conn: Connection, since: float) -> list[Any]:
    """In one statement (so one consistent view on either database): every tenant account's in-quota
    milli now (rows with `at` NULL), and every change to it written after `since` (`at`, `id`, `amount`)."""
    tenants = ACCOUNTS.c.project.is_(None)
    now = select(
        ACCOUNTS.c.key.label("account"),
        cast(null(), Float).label("at"),
        cast(null(), Integer).label("id"),
        (ACCOUNTS.c.used + ACCOUNTS.c.reserved).label("amount"),
    ).where(tenants)
    changes = (
        select(ENTRIES.c.account, ENTRIES.c.at, ENTRIES.c.id, ENTRIES.c.amount)
        .join(ACCOUNTS, ACCOUNTS.c.key == ENTRIES.c.account)
        .where(tenants, ENTRIES.c.at > literal(since, Float), ENTRIES.c.bucket.in_(IN_QUOTA_BUCKETS))
    )
    return list(conn.execute(union_all(now, changes)).all())


def idle_history_from(book: QuotaBook, rows: Iterable[Any], since: float) -> IdleHistory:
    """The `IdleHistory` of `book`'s tenants from `since` on, out of `read_in_quota_changes` rows."""
    held: dict[str, int] = {}
    changes: dict[str, list[tuple[float, int, int]]] = {}
    for r in rows:
        if r.at is None:
            held[r.account] = r.amount
        else:
            changes.setdefault(r.account, []).append((r.at, r.id, r.amount))
    history = IdleHistory(book)
    for tenant in sorted(book.tenants):
        ordered = sorted(changes.get(tenant, []))
        level = held.get(tenant, 0) - sum(amount for _, _, amount in ordered)
        steps: deque[tuple[float, int]] = deque([(since, level)])
        for at, _, amount in ordered:
            level += amount
            if steps[-1][0] == at:
                steps.pop()  # an instant's last state stands for it
            if steps[-1][1] != level:
                steps.append((at, level))
        history.steps[AccountKey(tenant)] = steps
    return history


def read_holdings(conn: Connection, since: float) -> list[Any]:
    """Every allocation row live at some instant after `since`: its milli, reserve and release times."""
    a = ALLOCATIONS
    query = select(a.c.milli, a.c.reserved_at, a.c.released_at).where(
        (a.c.released_at.is_(None)) | (a.c.released_at > literal(since, Float))
    )
    return list(conn.execute(query).all())


def lasting_free(rows: Iterable[Any], capacity_milli: int, since: float, now: float) -> int:
    """The least free milli of the pool over `[since, now]`, out of `read_holdings(conn, since)` rows."""
    changes: dict[float, int] = {}
    held = 0
    for r in rows:
        if r.reserved_at <= since:
            held += r.milli
        else:
            changes[r.reserved_at] = changes.get(r.reserved_at, 0) + r.milli
        if r.released_at is not None:
            changes[r.released_at] = changes.get(r.released_at, 0) - r.milli
    free = LastingFree(now - since)
    free.record(since, capacity_milli - held)
    for at in sorted(t for t in changes if t <= now):
        held += changes[at]
        free.record(at, capacity_milli - held)
    return max(0, free.lasting(now))
