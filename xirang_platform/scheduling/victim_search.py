"""The cheapest victim set inside one scope: an exact branch and bound (DESIGN.md section 5.2).

A scope is a node, a (domain, model) group or the whole pool. Its candidates are the victims holding
units there (they free room) and, when the request's cap binds, its own tenant's in-quota work
anywhere (it relieves the cap). Validity is monotone: freeing more never removes room, and never
lowers the headroom (relief only adds, and a lower allocation only raises the cap ratio). So the
search walks sets in the order of their victims' positions in the single-victim order (`parts`,
then id), adding victims only, and prunes a branch when

- its cost, or a lower bound on the cost of any valid set it can still reach, is no better than the
  best set found (the walk meets sets in lexicographic order of positions, the contract's tie-break,
  so a later set of equal cost loses the tie);
- even with every victim still to come freed, the request would not fit or not fit its cap.

The bounds: a set that does not fit physically still needs one more local victim, at least the next
one; a set short of cap room by `d` milli still needs `d` milli of its own tenant's in-quota work,
which loses at least `d` times the least work lost per milli among those still to come.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xirang_platform.scheduling.model import Allocation, Placement
from xirang_platform.scheduling.state import ClusterState
from xirang_platform.scheduling.victim_sets import (
    INFINITE,
    NEVER,
    Gang,
    KnownRelief,
    Need,
    Parts,
    ReliefKinds,
    minus,
    plus,
    rests,
    within,
)

_STALE = -1  # a trial's need not computed for its present state (needs are never negative)


@dataclass(frozen=True)
class Found:
    """The cheapest set of one scope (positions ascending) and its cost; `cut`: whether the outer
    bound (a plan of another scope) pruned anything, so a miss here is not the scope's own answer."""

    chosen: tuple[int, ...] | None
    parts: Parts | None
    cut: bool


class ScopeSearch:
    """One scope's branch and bound; `run` returns the cheapest valid set (`Found`)."""

    def __init__(
        self,
        view: ClusterState,
        victims: Sequence[Allocation],
        parts: Sequence[Parts],
        local: list[int],
        relief: list[int],
        need: Need,
        room: KnownRelief,
        need_range: tuple[int, int],
        outer: Parts | None,
        gang: Gang | None,
        milli: Sequence[int],
        costs: np.ndarray,
    ) -> None:
        """`victims`/`parts`: every victim in the victim order and its cost alone (`costs`: the
        same, one row of four parts each); `local`: the positions holding units in the scope (live,
        ascending); `relief`: those of the request's tenant's own in-quota work elsewhere that may
        join as relief only (`ReliefKinds`; ascending); `outer`: the best plan of the scopes tried;
        `gang`: for a gang, its GPUs, the scope's eligible nodes and the GPUs each local victim
        holds there (the bound counts whole GPUs); `milli`: each victim's GPU milli."""
        self.victims, self.parts, self.local, self.relief = victims, parts, local, relief
        self.need, self.room, self.outer = need, room, outer
        self.milli, self.costs = milli, costs
        self.need_min, self.need_max = need_range
        self.width = room.accounts
        self.trial_set = view.copy()  # the chosen set's locals released
        self.trial_all = view.copy()  # ... and every local still to come
        self.trial_all.release_all([victims[k].placement for k in local])
        self.need_set: int | None = _STALE
        self.need_all: int | None = _STALE
        n = len(local)
        self.local_milli, self.local_own = [0] * (n + 1), [0] * (n + 1)
        self.relief_of: dict[int, tuple[int, ...]] = {}
        self.own: list[bool] = np.any(room.relief_at(local), axis=1).tolist()
        for j in range(n - 1, -1, -1):
            held = milli[local[j]]
            self.local_milli[j] = self.local_milli[j + 1] + held
            self.local_own[j] = self.local_own[j + 1] + (held if self.own[j] else 0)
        self.relief_milli = [0] * (len(relief) + 1)
        for j in range(len(relief) - 1, -1, -1):
            self.relief_milli[j] = self.relief_milli[j + 1] + milli[relief[j]]
        short = self.need_max - room.after(0, [0] * room.accounts)
        self.short = short
        self.freed_most = self.local_milli[0] + self.relief_milli[0]
        self.covers: dict[tuple[int, ...], Parts | None] = {}
        self.gpus, self.eligible = (gang[0], gang[1]) if gang is not None else (0, np.ones(len(view.names), dtype=bool))
        self.gpus_of: list[int] = gang[2].tolist() if gang is not None else [0] * n
        self.gpus_by_victim = dict(zip(local, self.gpus_of, strict=True))
        self._pool: list[int] | None = None  # `cover_pool`, listed on first need
        self._rates: tuple[dict[int, list[float]], ...] | None = None  # `rates`, likewise
        self.table = self._knapsack(short)
        self.cost: Parts = (0, 0, 0, 0)
        self.freed = 0
        self.relieved = [0] * self.width
        self.chosen: list[int] = []
        self.best: tuple[Parts, tuple[int, ...]] | None = None
        self.cut = False
        self.limit: Parts | None = None  # the cost of a valid set known before the walk

    @property
    def cover_pool(self) -> list[int]:
        """What could relieve the cap, interchangeable ones cut as in `ReliefKinds` (`_cover` reads
        it; a search bounded by its knapsack table never does)."""
        if self._pool is None:
            capable = sorted([k for k, o in zip(self.local, self.own, strict=True) if o] + self.relief)
            kinds = ReliefKinds(capable, self.victims, self.milli, self.room)
            self._pool = kinds.candidates(self.short)
        return self._pool

    @property
    def rates(self) -> tuple[dict[int, list[float]], ...]:
        """From each position on, per cost part (0: in-quota lost, 2: lost): the least cost per GPU
        held of a local victim, and per milli of own in-quota work (local, and relief elsewhere);
        `_relaxed` reads them."""
        if self._rates is None:
            local, relief, parts, milli = self.local, self.relief, self.parts, self.milli
            per_gpu = {
                x: _suffix_min([parts[k][x] / g if g else math.inf for k, g in zip(local, self.gpus_of, strict=True)])
                for x in (0, 2)
            }
            own_rate = {
                x: _suffix_min(
                    [
                        parts[k][x] / milli[k] if o and milli[k] else math.inf
                        for k, o in zip(local, self.own, strict=True)
                    ]
                )
                for x in (0, 2)
            }
            relief_rate = {
                x: _suffix_min([parts[k][x] / milli[k] if milli[k] else math.inf for k in relief]) for x in (0, 2)
            }
            self._rates = (per_gpu, own_rate, relief_rate)
        return self._rates

    def run(self) -> Found:
        """The cheapest valid set of the scope, if any (none when the request fits without one)."""
        if self._valid() or not self._feasible(0, 0):
            return Found(None, None, self.cut)
        self.limit = self._incumbent()
        if self._below(self._bound(0, 0)):
            self._visit(0, 0)
        if self.best is None:
            return Found(None, None, self.cut)
        return Found(self.best[1], self.best[0], self.cut)

    def placement_state(self, base: ClusterState, chosen: Sequence[int]) -> ClusterState:
        """`base` with every chosen victim released (relief elsewhere moves only the totals)."""
        trial = base.copy()
        trial.release_all([self.victims[k].placement for k in chosen])
        return trial

    # -- the walk --------------------------------------------------------------------------------

    def _visit(self, a: int, b: int) -> None:
        """Try every next victim after local position `a` and relief position `b`, cheapest first."""
        local, relief, victims = self.local, self.relief, self.victims
        nl, nr = len(local), len(relief)
        applied: list[Placement] = []
        # Whole GPUs the chosen set still misses: the same for every next victim tried here.
        missing = self.gpus - int(self.trial_set.whole_free[self.eligible].sum()) if self.gpus else 0
        while True:
            la = local[a] if a < nl else math.inf
            rb = relief[b] if b < nr else math.inf
            if la == rb:  # both lists done
                break
            is_local = la < rb
            k = int(la if is_local else rb)
            cost = plus(self.cost, self.parts[k])
            if not self._below(cost):
                break  # every later victim alone costs no less
            na, nb = (a + 1, b) if is_local else (a, b + 1)
            if (is_local or self._short_of_room()) and self._below(self._bound_with(k, cost, missing, na, nb)):
                self._include(k, is_local)
                if self._valid():
                    self.best = (cost, tuple(self.chosen))
                elif self._below(self._bound(na, nb)) and self._feasible(na, nb):
                    self._visit(na, nb)
                self._exclude(k, is_local)
            if is_local:
                placement = victims[k].placement
                self.trial_all.apply(placement)
                applied.append(placement)
                self.need_all = _STALE
            a, b = na, nb
            if not self._feasible(a, b):
                break
        if applied:
            self.trial_all.release_all(applied)
            self.need_all = _STALE

    def _bound_with(self, k: int, cost: Parts, missing: int, a: int, b: int) -> Parts:
        """A lower bound on the cost of any valid set that holds the chosen one and victim `k`
        (whose sum is `cost`), read off the knapsack table before `k` is released: it frees at most
        the GPUs it holds (`missing`: those the chosen set misses). `cost` itself where there is
        no table; never more than `_bound` after `k` would give, or `cost` when that set is valid."""
        if self.table is None:
            return cost
        unit, most_gpus, most_short, table = self.table
        gpus = missing - self.gpus_by_victim.get(k, 0)
        freed, _ = self._still_to_come(a, b)
        relieved = [x + y for x, y in zip(self.relieved, self._relief(k), strict=True)]
        room = self.room.after(self.freed + self.milli[k] + freed, relieved)
        short = self.need_min - room if self.need_min else 0
        if short <= 0 and gpus <= 0:
            return cost
        g, r = min(max(gpus, 0), most_gpus), min(-(-max(short, 0) // unit), most_short)
        least = table[a + b, :, g, r]
        if least[3] >= INFINITE:
            return NEVER
        return plus(cost, (int(least[0]), int(least[1]), int(least[2]), int(least[3])))

    def _include(self, k: int, is_local: bool) -> None:
        self.cost = plus(self.cost, self.parts[k])
        self.freed += self.milli[k]
        self.relieved = [x + y for x, y in zip(self.relieved, self._relief(k), strict=True)]
        self.chosen.append(k)
        if is_local:
            self.trial_set.release(self.victims[k].placement)
            self.need_set = _STALE

    def _exclude(self, k: int, is_local: bool) -> None:
        self.cost = minus(self.cost, self.parts[k])
        self.freed -= self.milli[k]
        self.relieved = [x - y for x, y in zip(self.relieved, self._relief(k), strict=True)]
        self.chosen.pop()
        if is_local:
            self.trial_set.apply(self.victims[k].placement)
            self.need_set = _STALE

    def _relief(self, k: int) -> tuple[int, ...]:
        found = self.relief_of.get(k)
        if found is None:
            found = self.relief_of[k] = self.room.relief(self.victims[k])
        return found

    def _below(self, cost: Parts) -> bool:
        """Whether a set of `cost` may still win: cheaper than this scope's best, no dearer than the
        other scopes' (a tie there is settled between the scopes)."""
        if self.best is not None and cost >= self.best[0]:
            return False
        if self.limit is not None and cost > self.limit:
            return False  # a set no dearer is known to be valid: the walk will meet it
        if self.outer is not None and cost > self.outer:
            self.cut = True
            return False
        return True

    def _short_of_room(self) -> bool:
        """Whether relief could still matter: the chosen set leaves less room than any placement needs."""
        return bool(self.relief) and not within(self.need_max, self.room.after(self.freed, self.relieved))

    def _valid(self) -> bool:
        need = self._need_set()
        return need is not None and within(need, self.room.after(self.freed, self.relieved))

    def _need_set(self) -> int | None:
        if self.need_set == _STALE:
            self.need_set = self.need(self.trial_set)
        return self.need_set

    def _still_to_come(self, a: int, b: int) -> tuple[int, int]:
        """Upper bounds on the milli the victims still to come free, and relieve (any account)."""
        relief_milli = self.relief_milli[b]
        return self.local_milli[a] + relief_milli, self.local_own[a] + relief_milli

    def _feasible(self, a: int, b: int) -> bool:
        """Whether the chosen set with every victim still to come would be valid."""
        if self.need_all == _STALE:
            self.need_all = self.need(self.trial_all)
        if self.need_all is None:
            return False
        freed, relieved = self._still_to_come(a, b)
        room = self.room.after(self.freed + freed, [r + relieved for r in self.relieved])
        return within(self.need_all, room)

    def _bound(self, a: int, b: int) -> Parts:
        """A lower bound on the cost of any valid set that holds the chosen one: one more local
        victim if it does not fit yet; and the knapsack table's (`_knapsack`) where there is one, else
        the cover of the cap (`_cover`) and, on in-quota work lost and on all work lost, the bound
        of the linear relaxation (`_relaxed`)."""
        bound = self.cost
        if self._need_set() is None and a < len(self.local):
            bound = plus(self.cost, self.parts[self.local[a]])
        freed, _ = self._still_to_come(a, b)
        short = self.need_min - self.room.after(self.freed + freed, self.relieved) if self.need_min else 0
        gpus = self.gpus - int(self.trial_set.whole_free[self.eligible].sum()) if self.gpus else 0
        if short <= 0 and gpus <= 0:
            return bound
        if self.table is not None:  # the exact knapsack over what is to come: tighter than the rest
            unit, most_gpus, most_short, table = self.table
            g, r = min(max(gpus, 0), most_gpus), min(-(-max(short, 0) // unit), most_short)
            least = table[a + b, :, g, r]
            if least[3] >= INFINITE:
                return NEVER
            return max(bound, plus(self.cost, (int(least[0]), int(least[1]), int(least[2]), int(least[3]))))
        if short > 0:
            cover = self._cover(tuple(self.relieved))
            if cover is None:
                return NEVER
            bound = max(bound, plus(self.cost, cover))
        in_quota, lost = (self._relaxed(x, a, b, max(gpus, 0), max(short, 0)) for x in (0, 2))
        return max(bound, plus(self.cost, (in_quota, int(short > 0), lost, 1)))

    def _incumbent(self) -> Parts | None:
        """The cost of a valid set, found before the walk so that it prunes from the start (None:
        none found): the set the knapsack table (`_knapsack`) reads as cheapest in in-quota work
        lost for the whole GPUs missing and the cap relief missing before any victim goes, with
        victims added in victim order while it is not yet valid."""
        if self.table is None:
            return None
        unit, most_gpus, most_short, table = self.table
        merged, gpus_of, give = self.items
        g = min(max(self.gpus - int(self.trial_set.whole_free[self.eligible].sum()), 0), most_gpus) if self.gpus else 0
        r = most_short
        if table[0, 0, g, r] >= INFINITE:
            return None
        chosen: list[int] = []
        for j, k in enumerate(merged):
            if not g and not r:
                break
            if table[j, 0, g, r] != table[j + 1, 0, g, r]:  # the cheapest needs victim k
                chosen.append(k)
                g, r = max(g - gpus_of[j], 0), max(r - give[j] // unit, 0)
        members = set(chosen)
        trial = self.trial_set.copy()
        local = set(self.local)
        trial.release_all([self.victims[k].placement for k in chosen if k in local])
        freed = sum(self.milli[k] for k in chosen)
        relieved = [sum(self._relief(k)[x] for k in chosen) for x in range(self.width)]
        rest = iter([k for k in merged if k not in members])
        while True:
            need = self.need(trial)
            if need is not None and within(need, self.room.after(freed, relieved)):
                break
            more = next(rest, None)
            if more is None:
                return None
            chosen.append(more)
            if more in local:
                trial.release(self.victims[more].placement)
            freed += self.milli[more]
            relieved = [x + y for x, y in zip(relieved, self._relief(more), strict=True)]
        cost: Parts = (0, 0, 0, 0)
        for k in chosen:
            cost = plus(cost, self.parts[k])
        return cost

    def _knapsack(self, short: int) -> tuple[int, int, int, np.ndarray] | None:
        """For a request charged to one account whose cap binds: per position of the walk (the
        victims still to come: locals and relief merged in victim order), per whole GPUs still to
        free and cap relief still needed (in units of the relief amounts' gcd, capped at the most
        a set could need), the least cost of each part over the victims to come that provide
        both (the exact 0/1 knapsack, each part on its own, so together a lower bound); the
        table's index, (unit, GPU cap, relief cap, table). None: no table (it would not bound)."""
        if self.width != 1 or short <= 0:
            return None
        merged = sorted(self.local + self.relief)
        gpus_of = dict(zip(self.local, self.gpus_of, strict=True))
        give: list[int] = self.room.relief_at(merged)[:, 0].tolist()
        unit = math.gcd(*[x for x in give if x]) if any(give) else 0
        if not unit:
            return None
        most_short = -(-short // unit)
        most_gpus = max(self.gpus, 0)
        self.items = (merged, [min(gpus_of.get(k, 0), most_gpus) for k in merged], give)
        width = most_short + 1
        costs = self.costs[merged].reshape(len(merged), 4, 1)
        table = np.full((len(merged) + 1, 4, (most_gpus + 1) * width), INFINITE, dtype=np.int64)
        table[len(merged), :, 0] = 0
        for j in range(len(merged) - 1, -1, -1):
            item_gpus, item_relief = min(gpus_of.get(merged[j], 0), most_gpus), min(give[j] // unit, most_short)
            source = rests(most_gpus, most_short, item_gpus, item_relief, 1)[1]  # where each entry's rest is
            after = table[j + 1]
            np.minimum(after, after[:, source] + costs[j], out=table[j])
        return unit, most_gpus, most_short, table.reshape(len(merged) + 1, 4, most_gpus + 1, width)

    def _relaxed(self, x: int, a: int, b: int, gpus: int, short: int) -> int:
        """A lower bound on part `x` of the cost the victims still to come add to a valid set: they
        must free `gpus` more whole GPUs (at most those each holds) and relieve `short` more milli
        (at most its own milli, own in-quota work only). Weak duality with one price per GPU (the
        least cost per GPU of a local victim) and one per milli of relief (the least per milli):
        each victim pays the excess of its prices over its cost back."""
        local, parts = self.local, self.parts
        gpu_rates, own_rates, relief_rates = self.rates
        per_gpu = gpu_rates[x][a] if gpus else 0.0
        per_milli = min(own_rates[x][a], relief_rates[x][b]) if short else 0.0
        if not math.isfinite(per_gpu) or not math.isfinite(per_milli):
            return 0  # nothing left to free it: the feasibility check prunes the branch
        both = per_gpu * gpus + per_milli * short
        if per_gpu and per_milli:
            for j in range(a, len(local)):
                k = local[j]
                if self.own[j]:
                    both -= max(0.0, per_gpu * self.gpus_of[j] + per_milli * self.milli[k] - parts[k][x])
        bound = max(both, per_gpu * gpus, per_milli * short)  # each price alone is a bound too
        return max(0, math.floor(bound * (1 - 1e-9)) - 1)

    def _cover(self, relieved: tuple[int, ...]) -> Parts | None:
        """The least cost of relief (from `cover_pool`) that a set relieving `relieved` still needs
        for the scope's least need, with every victim of the scope freed (the highest cap ratio);
        None: no relief is enough. Every valid set holds such relief, so it bounds the search."""
        if relieved in self.covers:
            return self.covers[relieved]
        pool, room, need, freed = self.cover_pool, self.room, self.need_min, self.freed_most
        if within(need, room.after(freed, relieved)):
            self.covers[relieved] = (0, 0, 0, 0)
            return self.covers[relieved]
        if room.accounts == 1:
            self.covers[relieved] = self._cover_one_account(relieved)
            return self.covers[relieved]
        rest = [0] * (len(pool) + 1)  # from each position on, the relief milli left (any account)
        for j in range(len(pool) - 1, -1, -1):
            rest[j] = rest[j + 1] + self.milli[pool[j]]
        rate = _suffix_min([self.parts[k][2] / self.milli[k] if self.milli[k] else math.inf for k in pool])
        best: list[Parts | None] = [None]

        def walk(start: int, cost: Parts, got: list[int]) -> None:
            for j in range(start, len(pool)):
                k = pool[j]
                total = plus(cost, self.parts[k])
                if best[0] is not None and total >= best[0]:
                    return
                now = [x + y for x, y in zip(got, self._relief(k), strict=True)]
                if within(need, room.after(freed, now)):
                    best[0] = total
                elif within(need, room.after(freed, [x + rest[j + 1] for x in now])):
                    # The rest must relieve what is still short, each milli at the least rate left.
                    lost = math.floor((need - room.after(freed, now)) * rate[j + 1] * (1 - 1e-9))
                    if best[0] is None or plus(total, (lost, 1, lost, 1)) < best[0]:
                        walk(j + 1, total, now)
                if not within(need, room.after(freed, [x + rest[j + 1] for x in got])):
                    return

        walk(0, (0, 0, 0, 0), list(relieved))
        self.covers[relieved] = best[0]
        return best[0]

    def _cover_one_account(self, relieved: tuple[int, ...]) -> Parts | None:
        """`_cover` for a request charged to one account: the least cost per relief reached
        (capped at the need), item by item (a knapsack over the few relief amounts)."""
        room, need, freed = self.room, self.need_min, self.freed_most
        short = need - room.after(freed, relieved)
        least: dict[int, Parts] = {0: (0, 0, 0, 0)}
        for k in self.cover_pool:
            give = self._relief(k)[0]
            if not give:
                continue
            for got, cost in list(least.items()):
                reach = min(short, got + give)
                total = plus(cost, self.parts[k])
                if reach not in least or total < least[reach]:
                    least[reach] = total
        return least.get(short)


def _suffix_min(values: list[float]) -> list[float]:
    """From each position on, the least of `values` (inf past the end)."""
    out = [math.inf] * (len(values) + 1)
    for j in range(len(values) - 1, -1, -1):
        out[j] = min(out[j + 1], values[j])
    return out
