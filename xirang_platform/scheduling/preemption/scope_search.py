"""The cheapest victim set inside one scope, bounded (DESIGN.md section 5.2).

A scope is a node, a (domain, model) group or the whole pool. Its candidates are the victims holding
units there (they free room) and, when the request's cap binds, its own tenant's in-quota work
elsewhere (it relieves the cap). A set is valid when the request fits the scope with the set's local
victims gone, within the cap room the set leaves. Validity is monotone: freeing more never removes
room and never lowers the cap room (relief only adds, and a lower allocation only raises the ratio).

`greedy` is the first answer: take candidates in the victim order until the set is valid, then drop,
newest-taken first, every victim the set does not need; its work is one pass over the candidates and
one over the set. `improve` then walks sets by branch and bound in the order of their positions
(lexicographic, the contract's tie-break), adding victims only, and prunes a branch whose cost, or a
lower bound on what it still needs (one more local victim while the request does not fit; for a gang,
the whole GPUs it misses at the least cost per GPU to come), is no better than the best set known, or
whose cap stays short even with every candidate still to come. One step is one candidate tried; the
walk stops when `Steps` is spent: what it found is never dearer than the greedy set, and where it was
not stopped it is the scope's exact cheapest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.feasibility import capacity_fit, eligible_nodes, unit_rounded, values_fit
from xirang_platform.scheduling.gang_groups import usable_on, usable_whole_gpus
from xirang_platform.scheduling.model import Allocation, Placement, Request
from xirang_platform.scheduling.placement import as_placed, is_single_node
from xirang_platform.scheduling.preemption.cost import NEVER, NOTHING, Parts, minus, plus
from xirang_platform.scheduling.state import ClusterState


class VictimFacts(Protocol):
    """What a search reads of the cycle's victims (`victims.CycleVictims`), by position."""

    ordered: list[Allocation]
    parts: list[Parts]
    milli: list[int]
    gpus: list[int]


class CapRoom(Protocol):
    """The in-quota milli a request may hold once victims are gone (`victims.Headroom`); `accounts`:
    how many accounts the request is charged to (the width of a relief)."""

    accounts: int

    def relief(self, victim: Allocation) -> tuple[int, ...]:
        """Per account of the request, the in-quota milli `victim` gives back to it."""
        ...

    def after(self, freed: int, relieved: Sequence[int]) -> int:
        """The room once `freed` milli are released, `relieved` of them per account in-quota."""
        ...


class Steps:
    """A budget of search steps (one step: one victim set tried), per request and per cycle; and, in
    the live tick, a wall-clock guard (`out_of_time`, asked every `CLOCK_EVERY` steps): once it
    says so, the cycle's budget is spent."""

    CLOCK_EVERY = 64

    def __init__(self, per_request: int, per_cycle: int, out_of_time: Callable[[], bool] | None = None) -> None:
        self.per_request, self.cycle_left, self.out_of_time = per_request, per_cycle, out_of_time
        self.used = 0  # by the request being planned
        self.cut = False  # whether the request's search was stopped by the budget

    def begin(self) -> bool:
        """Start a request's budget; False when the cycle's is spent (the request is deferred)."""
        self.used, self.cut = 0, False
        if self.out_of_time is not None and self.out_of_time():
            self.cycle_left = 0
        return self.cycle_left > 0

    def spend(self, steps: int = 1) -> None:
        """Count `steps` against the request and the cycle."""
        self.used += steps
        self.cycle_left -= steps
        if self.out_of_time is not None and self.used % self.CLOCK_EVERY < steps and self.out_of_time():
            self.cycle_left = 0

    @property
    def spent(self) -> bool:
        """Whether the request's budget (or the cycle's) is used up: no more improving."""
        return self.used >= self.per_request or self.cycle_left <= 0


def within(need: int, room: int) -> bool:
    """Whether a placement holding `need` milli fits a room of `room` (no GPU, no cap to fit)."""
    return need <= room or need == 0


def room_after(room: CapRoom, victims: Sequence[Allocation]) -> int:
    """`room.after` for a whole victim set."""
    relieved = [0] * room.accounts
    for v in victims:
        relieved = [a + b for a, b in zip(relieved, room.relief(v), strict=True)]
    return room.after(sum(v.milli for v in victims), relieved)


class ScopeRows:
    """The scope's free capacity as a search changes it, and the least GPU milli a placement of the
    request there would hold (`need`; None: none fits), kept per node and summed up as it goes: a
    release or an apply re-reads only the nodes it touches, as Python ints (a node is read from the
    cycle's state the first time a victim touches it; the state itself is never changed).

    For a single-node request a node counts with its unit-rounded need where the request fits it
    (`feasibility.values_fit`), and the need is the least of them; for a gang a node counts its
    usable whole GPUs (`gang_groups.usable_on`), and the need is the gang's total where they cover it."""

    def __init__(self, state: ClusterState, rows: np.ndarray, request: Request) -> None:
        self.state, self.placed = state, as_placed(request)
        self.single = is_single_node(request)
        self.index = {state.names[i]: i for i in rows.tolist()}
        eligible = eligible_nodes(state, self.placed)
        self.eligible = {i: bool(eligible.item(i)) for i in rows.tolist()}
        self.rounded = unit_rounded(state, self.placed.milli_per_gpu)
        self.rows: dict[int, tuple[list[int], list[int], list[int]]] = {}  # node: ([cpu, mem], milli, memory)
        if self.single:
            fit = eligible[rows] & capacity_fit(state, self.placed, rows)
            self.counts: dict[int, int] = {}  # per need, the nodes that fit with it
            for need in (self.rounded[rows][fit] * self.placed.gpus).tolist():
                self.counts[need] = self.counts.get(need, 0) + 1
            self.fit = dict(zip(rows.tolist(), fit.tolist(), strict=True))
        else:
            usable = usable_whole_gpus(state, self.placed, eligible[rows], rows)
            self.usable = dict(zip(rows.tolist(), usable.tolist(), strict=True))
            self.total = int(usable.sum())

    def need(self) -> int | None:
        """The least milli a placement of the request on these rows would hold; None: none fits."""
        if self.single:
            return min(self.counts) if self.counts else None
        return self.placed.total_milli if self.total >= self.placed.gpus else None

    def release(self, placement: Placement) -> None:
        """Give back `placement`'s units (those on these rows)."""
        self._add(placement, +1)

    def apply(self, placement: Placement) -> None:
        """Take `placement`'s units again (those on these rows)."""
        self._add(placement, -1)

    def _add(self, placement: Placement, sign: int) -> None:
        index = self.index
        for s in placement.slices:
            i = index.get(s.node)
            if i is not None:
                _, free, memory = self._row(i)
                free[s.gpu] += sign * s.milli
                memory[s.gpu] += sign * s.gpu_memory_mib
        for share in placement.shares:
            i = index.get(share.node)
            if i is None:
                continue
            host, free, memory = self._row(i)
            host[0] += sign * share.cpu_milli
            host[1] += sign * share.memory_mib
            if self.eligible[i]:
                self._recount(i, host, free, memory)

    def _recount(self, i: int, host: list[int], free: list[int], memory: list[int]) -> None:
        """Node `i`'s part of the need, read again."""
        if self.single:
            fits = values_fit(self.placed, self.rounded.item(i), host[0], host[1], free, memory)
            if fits != self.fit[i]:
                self.fit[i] = fits
                need = self.rounded.item(i) * self.placed.gpus
                left = self.counts.get(need, 0) + (1 if fits else -1)
                if left:
                    self.counts[need] = left
                else:
                    del self.counts[need]
        else:
            usable = usable_on(self.placed, free.count(MILLI_PER_GPU), host[0], host[1])
            self.total += usable - self.usable[i]
            self.usable[i] = usable

    def _row(self, i: int) -> tuple[list[int], list[int], list[int]]:
        row = self.rows.get(i)
        if row is None:
            state = self.state
            host = [state.cpu_free.item(i), state.mem_free.item(i)]
            row = self.rows[i] = (host, state.gpu_free[i].tolist(), state.gpu_mem_free[i].tolist())
        return row


def need_bounds(state: ClusterState, request: Request, rows: np.ndarray) -> tuple[int, int]:
    """The least and the most milli any placement of `request` on `rows` could hold."""
    placed = as_placed(request)
    if not is_single_node(request):
        return placed.total_milli, placed.total_milli
    eligible = eligible_nodes(state, placed)[rows]
    need = (unit_rounded(state, placed.milli_per_gpu)[rows] * placed.gpus)[eligible]
    return (int(need.min()), int(need.max())) if len(need) else (0, 0)


class ScopeSearch:
    """One scope's victim sets: `greedy`, then `improve`; `best` is the cheapest found (positions
    ascending, with its cost)."""

    def __init__(
        self,
        rows: ScopeRows,
        victims: VictimFacts,
        local: list[int],
        relief: list[int],
        need_range: tuple[int, int],
        room: CapRoom,
        relief_of: Callable[[int], tuple[int, ...]],
        steps: Steps,
        price: float = 0.0,
    ) -> None:
        """`rows`: the scope's rows; `victims`: every victim in the victim order; `local`: the
        positions of the live victims holding units in the scope; `relief`: those of the request's
        own in-quota work elsewhere that may join (ascending); `need_range`: the least and the most
        milli a placement in the scope holds; `relief_of`: per position, `room.relief`; `price`: the
        least any relief costs per milli (0: relief is of no use)."""
        self.room, self.steps, self.trial, self.price = room, steps, rows, price
        self.need_min, self.need_max = need_range
        is_local = set(local)
        self.candidates = sorted({*local, *relief})
        # Per candidate: its cost alone, GPU milli, placement, whether it holds units in the scope,
        # its relief, and (a gang's bound) the GPUs it holds, each freed GPU one of them.
        self.parts = [victims.parts[k] for k in self.candidates]
        self.milli = [victims.milli[k] for k in self.candidates]
        self.placements = [victims.ordered[k].placement for k in self.candidates]
        self.local = [k in is_local for k in self.candidates]
        self.relief_of = [relief_of(k) for k in self.candidates]
        self.gang = 0 if rows.single else rows.placed.gpus
        self.gpus = [victims.gpus[k] if local else 0 for k, local in zip(self.candidates, self.local, strict=True)]
        n = len(self.candidates)
        steps.spend(n)  # reading the scope's candidates is a step each
        self.chosen: list[int] = []  # candidate indices, ascending in `improve`
        self.cost, self.freed, self.relieved = NOTHING, 0, [0] * room.accounts
        self.best: tuple[Parts, tuple[int, ...]] | None = None
        self.limit: Parts | None = None  # a valid set's cost: no set dearer can win
        self.outer: Parts | None = None  # another scope's plan: no set dearer can win
        self.stopped = self.outer_cut = False  # the walk was stopped by the budget; `outer` pruned a set
        self.exact = False  # `best` is the scope's own cheapest (`improve`)

    # -- the greedy set ------------------------------------------------------------------------------

    def greedy(self) -> tuple[Parts, tuple[int, ...]] | None:
        """The greedy minimal set (None: no set of the scope is valid): victims in order until the set
        is valid, then each one the set does not need dropped, newest-taken first. The order is the
        victim order; for a gang, the cost per GPU a victim frees, less the relief it gives at
        `price` (relief elsewhere: per GPU's worth of milli), which takes the one big victim (or the
        request's own, which frees room and relieves the cap at once) where the victim order takes
        many small ones."""
        order: Iterable[int] = range(len(self.candidates))
        if self.gang:
            per_gpu = [
                max(g if local else m / MILLI_PER_GPU, 1e-9)
                for g, m, local in zip(self.gpus, self.milli, self.local, strict=True)
            ]
            paid = [self.price * max(r, default=0) for r in self.relief_of]
            order = sorted(
                order,
                key=lambda j: ((self.parts[j][0] - paid[j]) / per_gpu[j], (self.parts[j][2] - paid[j]) / per_gpu[j], j),
            )
        self.best = self._greedy(order)
        return self.best

    def _greedy(self, order: Iterable[int]) -> tuple[Parts, tuple[int, ...]] | None:
        for j in order:
            if not self.local[j] and within(self.need_max, self._room()):
                continue  # relief is of no use while the cap does not bind
            self.steps.spend()
            self._include(j)
            if self._valid():
                break
        else:
            self._drop_all()
            return None
        for j in reversed(list(self.chosen)):
            self.steps.spend()
            self._exclude(j)
            if not self._valid():
                self._include(j)
        found = (self.cost, tuple(self.candidates[j] for j in sorted(self.chosen)))
        self._drop_all()
        return found

    # -- the bounded improvement ---------------------------------------------------------------------

    def improve(self, outer: Parts | None) -> None:
        """Look for a set cheaper than `best` (the greedy set: an equal cost may still win on ids)
        and no dearer than `outer` (another scope's plan: ties are settled between scopes), within
        the steps; `best` ends as the cheapest found."""
        self._suffixes()
        kept, self.outer = self.best, outer
        self.limit, self.best = (kept[0], None) if kept is not None else (None, None)
        if self._may_win(NOTHING):
            self._visit(0)
        if self.best is None:
            self.best = kept
        # The scope's own cheapest: the walk was not stopped, and another scope's plan pruned
        # nothing that could beat the set it kept.
        cheap_enough = self.best is not None and (outer is None or self.best[0] <= outer)
        self.exact = not self.stopped and (not self.outer_cut or cheap_enough)

    def _suffixes(self) -> None:
        """From each candidate on: the milli still to come, the most of it relieving any account, the
        first local candidate (None: none left), and per cost part the least a local one costs per
        GPU it holds, less its relief at `price` (what the walk's bounds read)."""
        n = len(self.candidates)
        self.milli_from, self.relief_from = [0] * (n + 1), [0] * (n + 1)
        self.next_local: list[int | None] = [None] * (n + 1)
        self.rate_from = [(math.inf, math.inf)] * (n + 1)
        for j in range(n - 1, -1, -1):
            self.milli_from[j] = self.milli_from[j + 1] + self.milli[j]
            self.relief_from[j] = self.relief_from[j + 1] + (self.milli[j] if any(self.relief_of[j]) else 0)
            self.next_local[j] = j if self.local[j] else self.next_local[j + 1]
            rate, g = self.rate_from[j + 1], self.gpus[j]
            if g:
                q, _, lost, _ = self.parts[j]
                paid = self.price * max(self.relief_of[j], default=0)
                rate = (min(rate[0], (q - paid) / g), min(rate[1], (lost - paid) / g))
            self.rate_from[j] = rate

    def _visit(self, start: int) -> None:
        """Try every next candidate from `start` on, cheapest first, with the chosen set."""
        fits = self.trial.need() is not None
        missing = self.gang - self.trial.total if self.gang else 0  # whole GPUs the gang still misses
        for j in range(start, len(self.candidates)):
            if self.steps.spent:
                self.steps.cut = self.stopped = True
                return
            self.steps.spend()
            cost = plus(self.cost, self.parts[j])
            if not self._may_win(cost):
                return  # every later candidate alone costs no less
            if not self._reachable(j, fits):
                return  # nor with every candidate to come
            if not (self.local[j] or not within(self.need_max, self._room())):
                continue  # relief is of no use while the cap does not bind
            if not self._may_win(self._bound(cost, j, fits, missing)):
                continue
            self._include(j)
            if self._valid():
                self.best = (self.cost, tuple(self.candidates[i] for i in self.chosen))
            else:
                self._visit(j + 1)
            self._exclude(j)

    def _bound(self, cost: Parts, j: int, fits: bool, missing: int) -> Parts:
        """A lower bound on any valid set holding the chosen one and candidate `j` (`cost` with it).
        Without room yet, a set of relief needs one more local victim after it. Else what is still
        to come pays, by weak duality with `price` per milli of relief, for the relief the cap still
        lacks with every candidate to come freed, and for each whole GPU a gang still misses the least
        a local victim to come costs per GPU less the relief it gives at that price."""
        if not fits and not self.local[j]:
            later = self.next_local[j + 1]
            return cost if later is None else plus(cost, self.parts[later])
        left = missing - self.gpus[j]
        relieved = [x + y for x, y in zip(self.relieved, self.relief_of[j], strict=True)]
        short = self.need_min - self.room.after(self.freed + self.milli_from[j], relieved)
        if left <= 0 and short <= 0:
            return cost
        in_quota, lost = self.rate_from[j + 1] if left > 0 else (0.0, 0.0)
        if math.isinf(lost):
            return NEVER
        relief = self.price * max(short, 0)
        gpus = max(left, 0)
        extra = (math.floor((gpus * in_quota + relief) * (1 - 1e-9)), int(short > 0), 0, 1)
        return plus(cost, (extra[0], extra[1], math.floor((gpus * lost + relief) * (1 - 1e-9)), 1))

    def _may_win(self, cost: Parts) -> bool:
        """Whether a set of `cost` may still be the scope's answer."""
        if self.best is not None and cost >= self.best[0]:
            return False
        if self.limit is not None and cost > self.limit:
            return False
        if self.outer is not None and cost > self.outer:
            self.outer_cut = True
            return False
        return True

    def _reachable(self, start: int, fits: bool) -> bool:
        """Whether the chosen set with candidates from `start` on might be valid: room in the scope
        now or a local victim to come, and the cap's room with every one of them."""
        if not fits and self.next_local[start] is None:
            return False
        relieved = [r + self.relief_from[start] for r in self.relieved]
        return within(self.need_min, self.room.after(self.freed + self.milli_from[start], relieved))

    # -- the chosen set ------------------------------------------------------------------------------

    def _room(self) -> int:
        return self.room.after(self.freed, self.relieved)

    def _valid(self) -> bool:
        need = self.trial.need()
        return need is not None and within(need, self._room())

    def _include(self, j: int) -> None:
        self.chosen.append(j)
        self.cost = plus(self.cost, self.parts[j])
        self.freed += self.milli[j]
        self.relieved = [x + y for x, y in zip(self.relieved, self.relief_of[j], strict=True)]
        if self.local[j]:
            self.trial.release(self.placements[j])

    def _drop_all(self) -> None:
        while self.chosen:
            self._exclude(self.chosen[-1])

    def _exclude(self, j: int) -> None:
        self.chosen.remove(j)
        self.cost = minus(self.cost, self.parts[j])
        self.freed -= self.milli[j]
        self.relieved = [x - y for x, y in zip(self.relieved, self.relief_of[j], strict=True)]
        if self.local[j]:
            self.trial.apply(self.placements[j])
