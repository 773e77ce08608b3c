"""What a victim set's search reads: the parts of a set's cost, the cap room it must win back
(`CapRoom`, each victim's relief remembered by `KnownRelief`, interchangeable relief by `ReliefKinds`),
what a placement in the scope needs (`need_in_scope`, `need_bounds`), and the knapsack floor of a
scope's root, read before any search is built (`root_floor`). `victim_search.ScopeSearch` walks the
sets; `preemption` and `scope_order` read these to order and cut scopes.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from xirang_platform.scheduling.feasibility import eligible_nodes, single_node_fit, unit_rounded
from xirang_platform.scheduling.model import Allocation, Request
from xirang_platform.scheduling.placement import as_placed, is_single_node, usable_whole_gpus
from xirang_platform.scheduling.state import ClusterState

Parts = tuple[int, int, int, int]  # a set's cost without the tie-break: `candidates.victim_cost`[:4]
Need = Callable[[ClusterState], int | None]  # the least milli a placement on the state holds; None: none fits
NEVER: Parts = (1 << 62, 0, 0, 0)  # a bound no set reaches
INFINITE = 1 << 60  # a knapsack entry no set reaches
# A whole-GPU request's scope: the GPUs it needs, the scope's eligible nodes, per local victim
# (positions ascending) how many GPUs it holds there (each freed GPU is at most one of them).
Gang = tuple[int, np.ndarray, np.ndarray]


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


class KnownRelief:
    """`room` with each victim's relief remembered in `known` (by object: the victims of one
    cycle's lists, which keep them alive), and by position in `victims` in `at` (a row of
    `accounts` each, -1 where not asked yet): it depends only on whose work the victim is and the
    accounts the request is charged to, so the plans of one cycle for the same accounts share it."""

    def __init__(
        self, room: CapRoom, known: dict[int, tuple[int, ...]], victims: Sequence[Allocation], at: np.ndarray
    ) -> None:
        self.room, self.known, self.accounts = room, known, room.accounts
        self.after = room.after
        self.victims, self.at = victims, at

    def relief_at(self, ks: Sequence[int] | np.ndarray) -> np.ndarray:
        """`relief` of the victims at positions `ks`, one row each."""
        at = np.asarray(ks, dtype=np.int64)
        rows = self.at[at]
        new = at[rows[:, 0] < 0] if self.accounts else at[:0]
        if len(new):
            asked = [self.relief(self.victims[k]) for k in new.tolist()]
            rows[rows[:, 0] < 0] = self.at[new] = np.array(asked, dtype=np.int64).reshape(len(new), self.accounts)
        return rows

    def relief(self, victim: Allocation) -> tuple[int, ...]:
        """`room.relief`, asked once per victim."""
        found = self.known.get(id(victim))
        if found is None:
            found = self.known[id(victim)] = self.room.relief(victim)
        return found


def room_after(room: CapRoom, victims: Sequence[Allocation]) -> int:
    """`room.after` for a whole victim set."""
    relieved = [0] * room.accounts
    for v in victims:
        relieved = [a + b for a, b in zip(relieved, room.relief(v), strict=True)]
    return room.after(sum(v.milli for v in victims), relieved)


class ReliefKinds:
    """A tenant's own in-quota victims (`positions`, victim order) by kind of relief (the same milli,
    relieving the same accounts of a request): interchangeable as relief and cheapest first within
    a kind, so a cheapest set holds a prefix of each kind's usable ones. Built once per (tenant,
    project) and cycle; `candidates` answers per scope."""

    def __init__(
        self, positions: Sequence[int], victims: Sequence[Allocation], milli: Sequence[int], room: CapRoom
    ) -> None:
        kinds: dict[tuple, list[int]] = {}
        for k in positions:
            kinds.setdefault((milli[k], room.relief(victims[k])), []).append(k)
        # Per kind: the milli each victim relieves on every account (0: not every one), its victims.
        self.kinds = [(m if all(r) else 0, ks) for (m, r), ks in kinds.items()]

    def candidates(
        self, short: int, active: np.ndarray | None = None, members: frozenset[int] | set[int] = frozenset()
    ) -> list[int]:
        """The relief victims a cheapest set can hold when it may fall `short` milli of cap room at
        most: of each kind the live ones (`active`; None: all) not in `members` (the scope's own
        victims), and of a kind
        that relieves every account no more than cover `short` (one more would be one too many)."""
        out: list[int] = []
        for each, ks in self.kinds:
            wanted = -(-short // each) if each else len(ks)
            for k in ks:
                if wanted <= 0:
                    break
                if (active is None or active[k]) and k not in members:
                    out.append(k)
                    wanted -= 1
        out.sort()
        return out


def need_in_scope(view: ClusterState, request: Request, allowed: np.ndarray | None = None) -> Need:
    """The least GPU milli a placement of `request` on a what-if copy of `view` would hold (None
    when none fits), answered without building it: for a single-node request the least unit-rounded
    need over the nodes that fit; for a gang its total, when the usable whole GPUs of the scope
    cover it (one group, or the whole pool for P2's mixed fallback)."""
    placed = as_placed(request)
    eligible = eligible_nodes(view, placed)
    if allowed is not None:
        eligible = eligible & allowed
    if is_single_node(request):
        need = unit_rounded(view, placed.milli_per_gpu) * placed.gpus

        def single(trial: ClusterState) -> int | None:
            nodes = single_node_fit(trial, placed, eligible)
            return int(need[nodes].min()) if len(nodes) else None

        return single

    def gang(trial: ClusterState) -> int | None:
        return placed.total_milli if int(usable_whole_gpus(trial, placed, eligible).sum()) >= placed.gpus else None

    return gang


def need_bounds(view: ClusterState, request: Request, allowed: np.ndarray | None = None) -> tuple[int, int]:
    """The least and the most milli any placement of `request` in the scope could hold."""
    placed = as_placed(request)
    if not is_single_node(request):
        return placed.total_milli, placed.total_milli
    eligible = eligible_nodes(view, placed)
    if allowed is not None:
        eligible = eligible & allowed
    need = (unit_rounded(view, placed.milli_per_gpu) * placed.gpus)[eligible]
    return (int(need.min()), int(need.max())) if len(need) else (0, 0)


def root_floor(
    view: ClusterState,
    parts: np.ndarray,
    milli: np.ndarray,
    local: list[int],
    relief: list[int],
    room: KnownRelief,
    need_range: tuple[int, int],
    gang: Gang | None,
    local_needed: bool = False,
) -> Parts | None:
    """The knapsack part of `ScopeSearch`'s bound at its root, without building the search (None:
    no knapsack bound there): for a request charged to one account whose cap binds, the least cost
    of each part over the scope's candidates that free the whole GPUs still missing (`gang`: how
    many the request needs and the nodes they may be on; else, with `local_needed`, where the
    request does not fit the scope as it is, at least one of the scope's victims) and relieve the
    cap room still missing with every candidate gone. Candidates of one kind (the same GPUs and
    relief) are interchangeable, so per part only the cheapest that could be needed count.
    `parts`: per victim its cost alone, one row of four parts each; `milli`: its GPU milli."""
    if room.accounts != 1:
        return None
    short = need_range[1] - room.after(0, [0])
    if short <= 0:
        return None
    merged = np.array(sorted(local + relief), dtype=np.int64)
    give = room.relief_at(merged)[:, 0]
    unit = int(np.gcd.reduce(give))
    if not unit:
        return None
    freed = int(milli[merged].sum())
    lacking = need_range[0] - room.after(freed, [0]) if need_range[0] else 0
    held = np.zeros(len(merged), dtype=np.int64)  # per candidate, the GPUs it frees (relief elsewhere: none)
    if gang is not None:
        gpus, eligible, local_gpus = gang
        missing = gpus - int(view.whole_free[eligible].sum()) if gpus else 0
        if missing > 0:
            held[np.searchsorted(merged, local)] = local_gpus
    else:  # one "GPU" stands for one victim of the scope, of which a valid set holds at least one
        gpus = missing = int(local_needed)
        held[np.searchsorted(merged, local)] = missing
    if lacking <= 0 and missing <= 0:
        return None
    g = min(max(missing, 0), max(gpus, 0))
    r = min(-(-max(lacking, 0) // unit), -(-short // unit))
    kind = np.minimum(held, g) * (r + 1) + np.minimum(give // unit, r)  # (GPUs, relief) a candidate gives
    useful = kind > 0
    kind, costs = kind[useful], parts[merged[useful]]
    # Per part, the candidates by kind, cheapest first within one; `took`: the sums of the first so many.
    ranks = np.lexsort((costs, np.broadcast_to(kind[:, None], costs.shape)), axis=0)
    took = np.zeros((len(kind) + 1, 4), dtype=np.int64)
    np.cumsum(np.take_along_axis(costs, ranks, axis=0), axis=0, out=took[1:])
    table = np.full((4, (g + 1) * (r + 1)), INFINITE, dtype=np.int64)
    table[:, 0] = 0
    start = 0
    for each, count in sorted(Counter(kind.tolist()).items()):
        ig, ir = divmod(each, r + 1)
        wanted = min(count, max(-(-g // ig) if ig else 0, -(-r // ir) if ir else 0))
        # Taking j of a kind takes its j cheapest (per part): all j at once, j = 0 (none) included.
        taken = took[start : start + wanted + 1] - took[start]
        table = (table[:, rests(g, r, ig, ir, wanted)] + taken.T[:, :, None]).min(axis=1)
        start += count
    least = table[:, -1]
    if least[3] >= INFINITE:
        return NEVER
    return (int(least[0]), int(least[1]), int(least[2]), int(least[3]))


@functools.lru_cache(maxsize=1024)
def rests(gpus: int, relief: int, each_gpus: int, each_relief: int, most: int) -> np.ndarray:
    """For a knapsack table flat over (whole GPUs still to free, up to `gpus`; relief still
    needed, up to `relief`): per count j of items that each give `each_gpus` and `each_relief`, from
    0 to `most`, per entry the entry of what is still needed once they are taken (read-only: the
    plans of a cycle ask for the same few again and again)."""
    width = relief + 1
    gs, rs = np.divmod(np.arange((gpus + 1) * width), width)
    j = np.arange(most + 1)[:, None]
    rests = np.maximum(gs - j * each_gpus, 0) * width + np.maximum(rs - j * each_relief, 0)
    rests.setflags(write=False)
    return rests


def within(need: int, room: int) -> bool:
    """Whether a placement holding `need` milli fits a room of `room` (no GPU, no cap to fit)."""
    return need <= room or need == 0


def plus(a: Parts, b: Parts) -> Parts:
    """The sum of two costs, part by part."""
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


def minus(a: Parts, b: Parts) -> Parts:
    """`a` less `b`, part by part."""
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3])
