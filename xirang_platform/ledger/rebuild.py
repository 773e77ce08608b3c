"""Balances from entries: replay the append-only log, compare it with the stored balances, and
check the cap at every admission it records (DESIGN.md section 6, invariants 2 and 4); with the
pool, `Ledger.rebuild` also reports live allocations past a GPU's or node's capacity (invariant 1)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from xirang_platform.ledger.balances import AccountView
from xirang_platform.ledger.tables import Bucket, EntryKind
from xirang_platform.scheduling.quota import AccountKey, cap

BALANCE_FIELDS = ("quota", "used", "reserved", "borrowed")


@dataclass(frozen=True)
class EntryView:
    """One entry as read back: `bucket` of `account` += `amount`."""

    id: int
    op: str
    at: float
    kind: str
    account: str
    bucket: str
    amount: int
    allocation_id: int | None
    request_id: str | None
    cause: str
    details: dict[str, Any]

    @classmethod
    def from_row(cls, row: Any) -> EntryView:
        """An entry from an `entries` row."""
        return cls(
            row.id,
            row.op,
            row.at,
            row.kind,
            row.account,
            row.bucket,
            row.amount,
            row.allocation_id,
            row.request_id,
            row.cause,
            json.loads(row.details),
        )


def replay(entries: Iterable[EntryView]) -> Iterator[tuple[EntryView, str, AccountView]]:
    """Apply entries in order, yielding each with the account's state right after it."""
    state: dict[str, AccountView] = {}
    for e in entries:
        acc = state.get(e.account) or AccountView(AccountKey(*e.account.split("/", 1)))
        acc = acc.bump(e.bucket, e.amount)
        if e.bucket == Bucket.QUOTA:
            # The sum of the deltas is the quota; the last entry says whether the account has one at all.
            acc = replace(acc, limited=e.details.get("quota") is not None)
        state[e.account] = acc
        yield e, e.account, acc


def balances_from_entries(entries: Iterable[EntryView]) -> dict[str, AccountView]:
    """Every account's balances as the sum of its entries."""
    out: dict[str, AccountView] = {}
    for _, key, acc in replay(entries):
        out[key] = acc
    return out


@dataclass(frozen=True)
class Difference:
    """A stored balance that is not the sum of its entries."""

    account: str
    field: str
    stored: int | None
    from_entries: int | None


@dataclass(frozen=True)
class RebuildReport:
    """What `rebuild` found: the recomputed balances and every difference from the stored ones."""

    balances: dict[str, tuple[int | None, int, int, int]]
    differences: list[Difference] = field(default_factory=list)
    over_capacity: list[str] = field(default_factory=list)  # GPUs and nodes the live allocations overfill

    @property
    def ok(self) -> bool:
        """True when every stored balance equals the sum of its entries and no GPU or node is
        over capacity (checked when `rebuild` was given the pool)."""
        return not self.differences and not self.over_capacity


def compare(stored: dict[str, tuple[int | None, int, int, int]], entries: Iterable[EntryView]) -> RebuildReport:
    """Recompute balances from `entries` and report where `stored` differs, by account and field."""
    rebuilt = {k: v.as_tuple() for k, v in balances_from_entries(entries).items()}
    diffs = []
    for key in sorted(set(stored) | set(rebuilt)):
        have = stored.get(key, (None, 0, 0, 0))
        want = rebuilt.get(key, (None, 0, 0, 0))
        for name, h, w in zip(BALANCE_FIELDS, have, want, strict=True):
            if h != w:
                diffs.append(Difference(key, name, h, w))
    return RebuildReport(rebuilt, diffs)


@dataclass(frozen=True)
class CapViolation:
    """An admission after which an account held more in-quota milli than its cap."""

    entry_id: int
    account: str
    in_quota: int
    cap: int


# Entries that may put an account's in-quota milli up: a reservation, a return, a resize's new size.
ADMISSIONS = (EntryKind.RESERVE.value, EntryKind.RETURN.value, EntryKind.RESIZE.value)


def cap_violations(entries: Iterable[EntryView], ratio: float | None = None) -> list[CapViolation]:
    """Admissions (in-quota `reserve`, `return` into used/reserved, a `resize`'s new in-quota size)
    that left a limited account past its cap. The cap uses the ratio the entry recorded, or `ratio`
    for every state when given (then every intermediate state is checked, not only admissions)."""
    out = []
    for e, key, acc in replay(entries):
        if acc.quota is None:
            continue
        if ratio is not None:
            limit = cap(acc.quota, ratio)
        elif e.kind in ADMISSIONS and e.amount > 0 and e.bucket != Bucket.BORROWED:
            limit = cap(acc.quota, float(e.details["ratio"]))
        else:
            continue
        if acc.in_quota > limit:
            out.append(CapViolation(e.id, key, acc.in_quota, limit))
    return out
