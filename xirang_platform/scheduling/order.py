"""The order a cycle considers pending requests in (DESIGN.md section 5, step 1).

1. tier: P0, then P1, then P2;
2. inside a tier, previously preempted requests first (priority resume), oldest submit first;
3. then, turn by turn, the tenant furthest below its quota share (held / quota, read live, so a
   tenant that just got an admission steps back);
4. inside a tenant: submit time, then id (the final tie-breaker that makes the order total).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator, Mapping, Sequence

from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.quota import AccountKey, Balance, QuotaBook
from xirang_platform.scheduling.tiers import TIERS_IN_ORDER


def tenant_share(book: QuotaBook, balances: Mapping[AccountKey, Balance], tenant: str) -> float:
    """What a tenant holds (in-quota and borrowed) over its quota; unknown or zero quota ranks last."""
    b = balances.get(AccountKey(tenant))
    if b is None or b.quota <= 0:
        return float("inf")
    return (b.in_quota + b.borrowed) / b.quota


def _by_submit(r: Request) -> tuple[float, str]:
    return (r.submit_time, r.id)


def queue_order(
    pending: Sequence[Request], book: QuotaBook, balances: Mapping[AccountKey, Balance]
) -> Iterator[Request]:
    """Yield pending requests in cycle order. `balances` is read at each step, so the caller may
    update it between yields (fair share follows admissions)."""
    for rules in TIERS_IN_ORDER:
        tier = [r for r in pending if r.tier.rules is rules]
        yield from sorted((r for r in tier if r.preempted), key=_by_submit)
        queues: dict[str, deque[Request]] = {}
        for r in sorted((r for r in tier if not r.preempted), key=_by_submit):
            queues.setdefault(r.tenant, deque()).append(r)
        heap = [(tenant_share(book, balances, t), _by_submit(q[0]), t) for t, q in queues.items()]
        heapq.heapify(heap)
        while heap:
            _, _, tenant = heapq.heappop(heap)
            q = queues[tenant]
            yield q.popleft()
            if q:
                heapq.heappush(heap, (tenant_share(book, balances, tenant), _by_submit(q[0]), tenant))
