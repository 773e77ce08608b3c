"""The order a cycle considers pending requests in (DESIGN.md section 5, step 1).

1. tier: P0, then P1, then P2;
2. inside a tier, requests the last cycle's budget deferred first (they keep their place, DESIGN.md
   5.6), then previously preempted requests (priority resume), oldest submit first;
3. then, turn by turn, the tenant furthest below its quota share (held / quota, read live, so a
   tenant that just got an admission steps back);
4. inside a tenant: submit time, then id (the final tie-breaker that makes the order total).

The queues of step 2 and 4 (`Queues`) are kept sorted from one cycle to the next: the live tick
re-runs the cycle over a mostly unchanged queue, so only arrivals and departures are sorted in.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right, insort
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter, is_not

from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.quota import AccountKey, Balance, QuotaBook
from xirang_platform.scheduling.tiers import TIERS_IN_ORDER

RESUMED = ""  # the queue key of a tier's previously preempted requests (no tenant is named "")
DEFERRED = "\0"  # the queue key of a tier's requests the last cycle's budget did not reach


def tenant_share(book: QuotaBook, balances: Mapping[AccountKey, Balance], tenant: str) -> float:
    """What a tenant holds (in-quota and borrowed) over its quota; unknown or zero quota ranks last."""
    return _share(balances.get(book.tenant_key(tenant)))


def _share(b: Balance | None) -> float:
    """`tenant_share` of the tenant whose balance is `b`."""
    if b is None or b.quota <= 0:
        return float("inf")
    return (b.in_quota + b.borrowed) / b.quota


_ID = attrgetter("id")
_SUBMIT_TIME = attrgetter("submit_time")


def _by_submit(r: Request) -> tuple[float, str]:
    return (r.submit_time, r.id)


@dataclass(frozen=True)
class Queues:
    """Pending requests per (tier rank, tenant), each in submit order; a tier's resumed requests under
    the tenant `RESUMED`, its deferred ones under `DEFERRED`. `members` maps each request id to the request queued."""

    lists: Mapping[tuple[int, str], tuple[Request, ...]]
    members: Mapping[str, Request]

    @classmethod
    def of(cls, pending: Sequence[Request], before: Queues | None = None) -> Queues:
        """The queues of `pending`, re-using `before` (an earlier cycle's): only the requests that
        arrived or left since are sorted in or taken out. Equal to `Queues.of(pending)` either way."""
        ids = list(map(_ID, pending))
        members = dict(zip(ids, pending, strict=True))
        if len(members) != len(pending):
            twice = sorted({r.id for r in pending if members[r.id] is not r} or {r.id for r in pending})[0]
            raise ValueError(f"request {twice} is pending twice; give each pending request a unique id")
        if before is None:
            lists: dict[tuple[int, str], list[Request]] = {}
            # Sorted by id, then (stable) by submit time: the order of `_by_submit`, without a key
            # tuple per request (ids are unique, checked above).
            for r in sorted(sorted(pending, key=_ID), key=_SUBMIT_TIME):
                key = _queue_key(r)
                queue = lists.get(key)
                if queue is None:
                    queue = lists[key] = []
                queue.append(r)
            return cls({k: tuple(v) for k, v in lists.items()}, members)
        old = before.members
        # The requests that are not the very object queued before under their id (C-level loops:
        # this runs over every pending request each tick).
        arrived = list(compress(pending, map(is_not, map(old.get, ids), pending)))
        left = (old.keys() - members.keys()) | {r.id for r in arrived if r.id in old}
        if not arrived and not left:
            return cls(before.lists, members)
        changed: dict[tuple[int, str], list[Request]] = {}
        for rid in left:
            key = _queue_key(old[rid])
            if key not in changed:
                changed[key] = [r for r in before.lists[key] if r.id not in left]
        for r in arrived:
            key = _queue_key(r)
            if key not in changed:
                changed[key] = list(before.lists.get(key, ()))
            insort(changed[key], r, key=_by_submit)
        merged = dict(before.lists)
        for key, queue in changed.items():
            if queue:
                merged[key] = tuple(queue)
            else:
                merged.pop(key, None)
        return cls(merged, members)

    def oldest_first(self, now: float, waited: float, keep: Callable[[Request], bool]) -> list[Request]:
        """The requests `keep` accepts that have waited `waited` seconds or more at `now`, highest tier
        first, then oldest, then id."""
        since = now - waited
        out: list[Request] = []
        for rules in TIERS_IN_ORDER:
            tier: list[Request] = []
            for (rank, _), queue in sorted(self.lists.items()):
                if rank == rules.rank:
                    tier.extend(filter(keep, queue[: bisect_right(queue, since, key=_SUBMIT_TIME)]))
            out.extend(sorted(tier, key=_by_submit))
        return out


def _queue_key(r: Request) -> tuple[int, str]:
    return (r.tier.rank, DEFERRED if r.deferred else RESUMED if r.preempted else r.tenant)


def queue_order(
    pending: Sequence[Request], book: QuotaBook, balances: Mapping[AccountKey, Balance], queues: Queues | None = None
) -> Iterator[Request]:
    """Yield pending requests in cycle order. `balances` is read at each step, so the caller may
    update it between yields (fair share follows admissions). `queues`: `Queues.of(pending)`, when
    the caller keeps it."""
    lists = (queues or Queues.of(pending)).lists
    if len(lists) == 1:  # one queue (one tier, one tenant or the resumed): nothing to interleave
        yield from next(iter(lists.values()))
        return
    for rules in TIERS_IN_ORDER:
        rank = rules.rank
        yield from lists.get((rank, DEFERRED), ())
        yield from lists.get((rank, RESUMED), ())
        tenants = sorted(t for r, t in lists if r == rank and t not in (RESUMED, DEFERRED))
        accounts = {t: book.tenant_key(t) for t in tenants}
        read = {t: balances.get(accounts[t]) for t in tenants}  # the balance each share was read from
        # (share, submit time, id, tenant): the tenant's turn, its next request, then the tenant.
        heap = [(_share(read[t]), *_by_submit(lists[(rank, t)][0]), t) for t in tenants]
        heapq.heapify(heap)
        position = dict.fromkeys(tenants, 0)
        turn = heapq.heappop(heap) if heap else None
        while turn is not None:
            share, tenant = turn[0], turn[3]
            queue, k = lists[(rank, tenant)], position[tenant]
            # The tenant keeps its turn while its next request still sorts before the next tenant's
            # head: the same order as pushing it back and popping again, without the heap work.
            account, size, balance = accounts[tenant], len(queue), read[tenant]
            while True:
                yield queue[k]
                k += 1
                if k == size:
                    turn = heapq.heappop(heap) if heap else None
                    break
                now = balances.get(account)
                if now is not balance:  # its share moved (an admission, a preemption of its work)
                    balance = read[tenant] = now
                    share = _share(now)
                if heap and share >= heap[0][0]:
                    r = queue[k]
                    key = (share, r.submit_time, r.id, tenant)
                    if heap[0] < key:
                        position[tenant] = k
                        turn = heapq.heappushpop(heap, key)  # the next tenant's turn
                        break
