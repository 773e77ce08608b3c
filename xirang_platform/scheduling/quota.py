"""Quota rules as pure functions over account balances (DESIGN.md section 6).

The SQL ledger and the scheduler core (and so the simulator) apply exactly these rules: the core on
the balances in its snapshot, the ledger on the balances it has locked in a transaction.

Lending that lasts: a request whose borrowed run was reclaimed borrows again, before its back-off ends,
only out of capacity that has been idle for a while (`lasting_lendable`): the owners' idle quota at its
lowest over the last `SchedulerConfig.lend_after_s`, less what is already lent. `IdleHistory` keeps
what that needs.

Lending forecast: any borrow takes free units only as far as they are not idle quota its owner is
forecast to take back before a borrower's first checkpoint (`forecast_idle`, `lendable_ahead`;
`SchedulerConfig.lend_forecast_s`), from the same history.

Two levels: a tenant account and, inside it, project accounts. A request is charged to its project
and to its tenant. In-quota work is admitted while `used + reserved` stays within the cap
(`quota x ratio`) at both levels; past the cap a P1/P2 request may borrow idle units.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

import numpy as np

from xirang_platform.scheduling.model import Allocation, Request


@dataclass(frozen=True)
class OvercommitPolicy:
    """The cap ratio: `max_ratio` while cluster allocation is below `low`, falling linearly to 1.0
    at `high` and staying there above it."""

    max_ratio: float = 1.2
    low: float = 0.70
    high: float = 0.90

    def __post_init__(self) -> None:
        if self.max_ratio < 1.0:
            raise ValueError(f"overcommit max_ratio must be >= 1.0, got {self.max_ratio}")
        if not 0.0 <= self.low < self.high <= 1.0:
            raise ValueError(f"overcommit thresholds need 0 <= low < high <= 1, got {self.low}, {self.high}")

    def ratio(self, allocated_fraction: float) -> float:
        """The cap ratio when `allocated_fraction` of the cluster's GPU milli is allocated."""
        if allocated_fraction <= self.low:
            return self.max_ratio
        if allocated_fraction >= self.high:
            return 1.0
        span = (allocated_fraction - self.low) / (self.high - self.low)
        return self.max_ratio - (self.max_ratio - 1.0) * span


def cap(quota: int, ratio: float) -> int:
    """The most in-quota milli an account may hold: `quota x ratio`, rounded down."""
    # The small epsilon keeps 1000 * 1.2 from becoming 1199 through float error.
    return math.floor(quota * ratio + 1e-9)


@dataclass(frozen=True)
class AccountKey:
    """A tenant account (`project` is None) or a project account."""

    tenant: str
    project: str | None = None

    def __str__(self) -> str:
        return self.tenant if self.project is None else f"{self.tenant}/{self.project}"


@dataclass(frozen=True, slots=True)
class Balance:
    """One account's balances in milli-GPU. `used` and `reserved` count in-quota work only;
    `borrowed` counts work admitted past the cap on idle units."""

    quota: int
    used: int = 0
    reserved: int = 0
    borrowed: int = 0

    @property
    def in_quota(self) -> int:
        """In-quota milli held: used plus reserved."""
        return self.used + self.reserved

    def headroom(self, ratio: float) -> int:
        """How much more in-quota milli fits under the cap (never negative)."""
        return max(0, cap(self.quota, ratio) - self.in_quota)


@dataclass(frozen=True)
class QuotaBook:
    """Quotas of every tenant and project. A project's quota of None means the project has no
    limit of its own inside its tenant's."""

    tenants: Mapping[str, int]
    projects: Mapping[tuple[str, str], int | None]
    # `keys_for` per (tenant, project), made once: balances are then found by the very key objects
    # they are stored under (a dict lookup without a dataclass `__eq__`), every request of a cycle.
    _keys: dict[tuple[str, str], tuple[AccountKey, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _tenant_keys: dict[str, AccountKey] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def single_tenant(cls, quota_milli: int, tenant: str = "default", project: str = "default") -> QuotaBook:
        """One tenant with one project owning `quota_milli` (the simulator's default)."""
        return cls({tenant: quota_milli}, {(tenant, project): None})

    def keys_for(self, tenant: str, project: str) -> tuple[AccountKey, ...]:
        """The accounts a request of `tenant/project` is charged to, tenant first."""
        found = self._keys.get((tenant, project))
        if found is None:
            keys = [self.tenant_key(tenant)]
            if self.projects.get((tenant, project)) is not None:
                keys.append(AccountKey(tenant, project))
            found = self._keys[(tenant, project)] = tuple(keys)
        return found

    def tenant_key(self, tenant: str) -> AccountKey:
        """The account key of `tenant` (one object per tenant and book)."""
        found = self._tenant_keys.get(tenant)
        if found is None:
            found = self._tenant_keys[tenant] = AccountKey(tenant)
        return found

    def knows(self, tenant: str, project: str) -> bool:
        """Whether `tenant/project` exists in the book."""
        return tenant in self.tenants and (tenant, project) in self.projects

    def quota_of(self, key: AccountKey) -> int:
        """The quota of an account (0 for a project without a limit of its own)."""
        if key.project is None:
            return self.tenants[key.tenant]
        return self.projects.get((key.tenant, key.project)) or 0


Balances = dict[AccountKey, Balance]


def balances_from(book: QuotaBook, allocations: Iterable[Allocation]) -> Balances:
    """Every account's balance, computed from the allocations that hold capacity."""
    quotas: dict[AccountKey, int] = {book.tenant_key(t): q for t, q in book.tenants.items()}
    for (t, p), q in book.projects.items():
        if q is not None:
            quotas[book.keys_for(t, p)[-1]] = q
    # [used, reserved, borrowed] per account, summed as plain ints (this runs once per cycle).
    sums = {key: [0, 0, 0] for key in quotas}
    keys_of: dict[tuple[str, str], tuple[AccountKey, ...]] = {}
    for a in allocations:
        who = (a.request.tenant, a.request.project)
        keys = keys_of.get(who)
        if keys is None:
            keys = keys_of[who] = tuple(k for k in book.keys_for(*who) if k in sums)
        bucket = 2 if a.borrowed else (0 if a.confirmed else 1)
        for key in keys:
            sums[key][bucket] += a.milli
    return {key: Balance(quotas[key], *sums[key]) for key in quotas}


def charge(b: Balance, milli: int, *, borrowed: bool, confirmed: bool) -> Balance:
    """`b` with `milli` more held (negative `milli` releases)."""
    if borrowed:
        return Balance(b.quota, b.used, b.reserved, b.borrowed + milli)
    if confirmed:
        return Balance(b.quota, b.used + milli, b.reserved, b.borrowed)
    return Balance(b.quota, b.used, b.reserved + milli, b.borrowed)


def charge_allocation(book: QuotaBook, balances: Balances, a: Allocation, milli: int | None = None) -> None:
    """Charge `a` (or `milli` of it; negative releases) to every account it belongs to, in place."""
    amount = a.milli if milli is None else milli
    for key in book.keys_for(a.request.tenant, a.request.project):
        b = balances.get(key)
        if b is not None:
            balances[key] = charge(b, amount, borrowed=a.borrowed, confirmed=a.confirmed)


class Verdict(StrEnum):
    """The quota check's answer for one request."""

    IN_QUOTA = "in-quota"
    BORROW = "borrow"  # past the cap, may run on idle units as borrowed
    OVER_QUOTA = "over-quota"  # past the cap and may not borrow
    UNKNOWN_ACCOUNT = "unknown-account"


@dataclass(frozen=True)
class QuotaCheck:
    """A verdict, with the account that decided it and a message for people."""

    verdict: Verdict
    account: AccountKey | None = None
    over_by: int = 0
    message: str = ""


def check(
    book: QuotaBook, balances: Mapping[AccountKey, Balance], request: Request, ratio: float, amount: int | None = None
) -> QuotaCheck:
    """Whether `request` fits its caps at `ratio`, may borrow, or must wait. `amount` is the milli it
    will hold if not its own total (a placement rounds fractions up to the node's compute unit)."""
    if not book.knows(request.tenant, request.project):
        return QuotaCheck(
            Verdict.UNKNOWN_ACCOUNT,
            message=f"no account {request.tenant}/{request.project}: add it with "
            f"`xirang quota project add {request.tenant} {request.project}`",
        )
    amount = request.total_milli if amount is None else amount
    for key in book.keys_for(request.tenant, request.project):
        b = balances[key]
        over = b.in_quota + amount - cap(b.quota, ratio)
        if over > 0:
            if request.tier.may_borrow:
                return QuotaCheck(
                    Verdict.BORROW, key, over, f"{key} is {over} milli past its cap; borrowing idle units"
                )
            return QuotaCheck(
                Verdict.OVER_QUOTA,
                key,
                over,
                f"{key} would be {over} milli past its cap of {cap(b.quota, ratio)} "
                f"(quota {b.quota} x ratio {ratio:.3f}); {request.tier.value} may not borrow",
            )
    return QuotaCheck(Verdict.IN_QUOTA)


def headroom(book: QuotaBook, balances: Mapping[AccountKey, Balance], tenant: str, project: str, ratio: float) -> int:
    """How much more in-quota milli `tenant/project` may hold at `ratio`: the least room under the
    caps of the accounts it is charged to (negative when already past one)."""
    least: int | None = None
    for key in book.keys_for(tenant, project):
        b = balances.get(key)
        if b is not None:
            room = cap(b.quota, ratio) - b.in_quota
            if least is None or room < least:
                least = room
    return 0 if least is None else least


def cap_never_fits(book: QuotaBook, request: Request, policy: OvercommitPolicy) -> QuotaCheck | None:
    """For a request that may not borrow: the account whose cap at the highest ratio is smaller than
    the request alone (it can never be admitted), or None."""
    if request.tier.may_borrow or not book.knows(request.tenant, request.project):
        return None
    for key in book.keys_for(request.tenant, request.project):
        most = cap(book.quota_of(key), policy.max_ratio)
        if request.total_milli > most:
            return QuotaCheck(
                Verdict.OVER_QUOTA,
                key,
                request.total_milli - most,
                f"{request.id} asks {request.total_milli} milli-GPU but {key} may never hold more than {most} "
                f"in quota (quota {book.quota_of(key)} x ratio {policy.max_ratio}); {request.tier.value} may not "
                "borrow: ask for less, or raise the quota",
            )
    return None


def returnable(
    book: QuotaBook, balances: Mapping[AccountKey, Balance], borrowed: Iterable[Allocation], ratio: float
) -> list[Allocation]:
    """The borrowed allocations that turn in-quota now, oldest first, each only if its accounts
    have room under the cap for it after the ones before it."""
    room = dict(balances)
    out: list[Allocation] = []
    for a in sorted(borrowed, key=lambda a: (a.start, a.id)):
        keys = book.keys_for(a.request.tenant, a.request.project)
        if all(room[k].in_quota + a.milli <= cap(room[k].quota, ratio) for k in keys if k in room):
            for k in keys:
                if k in room:
                    b = room[k]
                    room[k] = replace(b, borrowed=b.borrowed - a.milli, used=b.used + a.milli)
            out.append(a)
    return out


def under_cap(book: QuotaBook, balances: Mapping[AccountKey, Balance], tenant: str, project: str, ratio: float) -> bool:
    """Whether `tenant/project` holds less in-quota work than its caps allow (it may reclaim)."""
    return all(
        balances[k].in_quota < cap(balances[k].quota, ratio) for k in book.keys_for(tenant, project) if k in balances
    )


def project_quota_excess(book: QuotaBook, tenant: str, policy: OvercommitPolicy) -> int:
    """By how much the project quotas of `tenant` exceed `tenant quota x max ratio` (0 if they fit)."""
    total = sum(q or 0 for (t, _), q in book.projects.items() if t == tenant)
    return max(0, total - cap(book.tenants[tenant], policy.max_ratio))


def is_reclaimable(a: Allocation) -> bool:
    """Whether an allocation may be preempted at all: P2 always, P1 only when borrowed, P0 never."""
    return a.request.tier.rules.preemptible_when(a.borrowed)


def lasting_lendable(
    book: QuotaBook,
    balances: Mapping[AccountKey, Balance],
    lasting_idle: Mapping[AccountKey, int],
    pool_milli: int,
    tenant: str,
) -> int:
    """The milli `tenant` may borrow out of capacity whose idleness has lasted: the other tenants' lasting
    idle quota (`IdleHistory.lasting_idle`) plus the pool's milli no tenant owns, less every borrowed milli."""
    unowned = max(0, pool_milli - sum(book.tenants.values()))
    lent = sum(b.borrowed for k, b in balances.items() if k.project is None)
    others = sum(v for k, v in lasting_idle.items() if k.project is None and k.tenant != tenant)
    return unowned + others - lent


@dataclass
class IdleHistory:
    """Each tenant's in-quota milli over time, kept by a caller with a clock (the simulator), so a
    snapshot can carry how much of each quota has stayed idle (`lasting_idle`)."""

    book: QuotaBook
    # per tenant account: (since, in-quota milli) steps in time order; the first one is in effect at the
    # oldest instant still asked about
    steps: dict[AccountKey, deque[tuple[float, int]]] = field(default_factory=dict)

    def record(self, now: float, balances: Mapping[AccountKey, Balance]) -> bool:
        """Note the in-quota milli of every tenant at `now`; True when some tenant's idle quota grew
        (its lasting idle may then grow with time alone, `lend_after_s` later)."""
        grew = False
        for tenant in sorted(self.book.tenants):
            key = AccountKey(tenant)
            held = balances[key].in_quota if key in balances else 0
            steps = self.steps.setdefault(key, deque())
            if steps and steps[-1][1] == held:
                continue
            grew |= bool(steps) and held < steps[-1][1]
            if steps and steps[-1][0] == now:
                steps.pop()
            steps.append((now, held))
        return grew

    def lasting_idle(self, now: float, span_s: float) -> dict[AccountKey, int]:
        """Per tenant, the least idle quota (quota minus in-quota milli, at least 0) it had over
        [now - span_s, now]; a tenant never recorded counts as holding nothing."""
        return {
            key: max(0, quota - max((held for _, held in steps), default=0))
            for key, quota, steps in self._spans(now - span_s)
        }

    def idle_ahead(
        self, now: float, span_s: float, horizon_s: float, tenants: Iterable[str] | None = None
    ) -> dict[AccountKey, int]:
        """Per tenant (of `tenants`, default all), how much of its idle quota now its history over
        [now - span_s, now] forecasts to stay idle at least `horizon_s` longer (`forecast_idle`)."""
        chosen = None if tenants is None else set(tenants)
        return {
            key: forecast_idle(steps, quota, now, horizon_s) for key, quota, steps in self._spans(now - span_s, chosen)
        }

    def forget(self, before: float) -> None:
        """Drop the steps superseded before `before` (no span asked about reaches back that far)."""
        for steps in self.steps.values():
            while len(steps) > 1 and steps[1][0] <= before:
                steps.popleft()

    def _spans(
        self, start: float, tenants: set[str] | None = None
    ) -> Iterator[tuple[AccountKey, int, list[tuple[float, int]]]]:
        """Per tenant (of `tenants`, default all) in name order: its key, its quota, and the steps in
        effect over [start, ...), the first one from `start` on (nothing held before a tenant's first record)."""
        for tenant, quota in sorted(self.book.tenants.items()):
            if tenants is not None and tenant not in tenants:
                continue
            key = AccountKey(tenant)
            steps = self.steps.get(key, deque())
            first = 0
            while first + 1 < len(steps) and steps[first + 1][0] <= start:
                first += 1  # superseded before the span began
            spans = [steps[k] for k in range(first, len(steps))]
            if not spans or spans[0][0] > start:
                spans.insert(0, (start, 0))
            else:
                spans[0] = (start, spans[0][1])
            yield key, quota, spans


def lendable_ahead(
    balances: Mapping[AccountKey, Balance], ahead: Mapping[AccountKey, int] | None, free: int, tenant: str
) -> int:
    """The milli `tenant` may borrow out of `free` units: all of them but the other tenants' idle quota
    that `ahead` (`IdleHistory.idle_ahead`) does not forecast to stay idle, which its owners take back
    before a borrower's first checkpoint. A tenant missing from `ahead` (or `ahead` None) has no forecast:
    its idle quota is lent as it comes. A lender's own admissions take first the idle quota it takes
    back soonest, so what it holds now counts against what comes back soon."""
    soon = 0
    for key, staying in (ahead or {}).items():
        b = balances.get(key)
        if key.project is None and key.tenant != tenant and b is not None:
            soon += max(0, b.quota - b.in_quota - staying)
    return free - soon


def staying_idle(lasting: Mapping[AccountKey, int], ahead: Mapping[AccountKey, int] | None) -> dict[AccountKey, int]:
    """Per tenant, the idle quota that has lasted (`lasting`) or, where larger, that is forecast to stay
    idle (`ahead`): what a reclaimed request may borrow before its back-off ends."""
    return {key: max(idle, (ahead or {}).get(key, 0)) for key, idle in lasting.items()}


def forecast_text(horizon_s: float | None, lendable: int) -> str:
    """Why a borrow out of idle quota forecast to be taken back soon waits (`IdleHistory.idle_ahead`)."""
    interval = "a checkpoint interval" if horizon_s is None else f"a checkpoint interval ({horizon_s:g} s)"
    return (
        f"its owners are forecast to take the idle units back within {interval}, before a borrower's "
        f"first checkpoint ({max(0, lendable)} milli lendable that long now)"
    )


def forecast_idle(steps: Sequence[tuple[float, int]], quota: int, now: float, horizon_s: float) -> int:
    """How much of the idle quota at `now` (`quota` less the last step's in-quota milli) is forecast to
    stay idle at least `horizon_s` longer, from `steps`: (since, in-quota milli) in time order, the last
    one in effect at `now`.

    Level by level (a level of the quota is idle while the holding stays at or under it): the current
    idle episode of a level is forecast to last as long as its last completed one, one that both began
    and ended within the steps; a level without one (idle all along, or idle for the first time), or
    whose current episode has already outlasted the last one, is forecast to stay idle. A lender whose
    load swings back every hour is thus lent, at the bottom of a swing, only the levels that stayed
    idle at least `horizon_s` the last time."""
    times = np.fromiter((t for t, _ in steps), dtype=float, count=len(steps))
    held = np.minimum(np.fromiter((h for _, h in steps), dtype=np.int64, count=len(steps)), quota)
    if len(held) == 0 or held[-1] >= quota:
        return 0 if len(held) else quota
    levels = np.unique(held[held >= held[-1]])
    levels = levels[levels < quota]
    widths = np.diff(np.append(levels, quota))
    idle = held[None, :] <= levels[:, None]
    index = np.arange(len(held))
    last_busy = np.where(~idle, index, -1).max(axis=1)  # the current episode starts after it
    before = np.where(idle & (index < last_busy[:, None]), index, -1).max(axis=1)  # the last one's last step
    opened = np.where(~idle & (index < before[:, None]), index, -1).max(axis=1)  # the last one starts after it
    known = (last_busy >= 0) & (before >= 0) & (opened >= 0)
    began = times[last_busy + 1]
    lasted = times[before + 1] - times[opened + 1]
    outlasted = now - began > lasted  # the forecast was wrong this time: no evidence left
    stays = ~known | outlasted | (began + lasted - now >= horizon_s)
    return int(widths[stays].sum())
