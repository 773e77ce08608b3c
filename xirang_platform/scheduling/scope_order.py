"""The order in which the preemption planner tries scopes (DESIGN.md section 5.2): lower bounds on
the cost of any plan of a scope, tightened in steps, so the best plan tends to come first and every
scope bounded above it is never searched.

The steps: the cheapest victim of a scope (`scopes_by_bound`); for a gang's group, the whole GPUs it
must free (`gang_floor`, `tightened`); where the request's cap binds, the relief its own tenant's
in-quota work must give (`relief_floor` for groups, `with_relief` for nodes); then the scope's
knapsack root floor (`victim_search.root_floor`, through `refined`). Each is a lower bound, so the
order never changes a plan, only how soon the planner may stop.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from xirang_platform.scheduling.feasibility import single_node_fit
from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.placement import usable_whole_gpus
from xirang_platform.scheduling.state import ClusterState
from xirang_platform.scheduling.victim_search import CapRoom, Parts, plus

if TYPE_CHECKING:
    from xirang_platform.scheduling.candidates import Candidates

T = TypeVar("T")


def refined(
    scopes: Iterator[tuple[Parts, int]],
    refine: Callable[[Parts, int], tuple[Parts, T] | None],
    limit: Callable[[], Parts | None],
) -> Iterator[tuple[Parts, int, T]]:
    """(bound, scope, what `refine` prepared) of `scopes` (bound ascending) by the tighter bound
    `refine` gives (None: the scope holds no valid set), still ascending: a refined scope is
    yielded once no scope not yet refined could have a lower bound. Ends where every scope left
    is bounded above `limit()` (the best plan's cost so far; None: none yet), refining none."""
    waiting: list[tuple[Parts, int, T]] = []
    upcoming = next(scopes, None)
    while upcoming is not None or waiting:
        if waiting and (upcoming is None or waiting[0][0] <= upcoming[0]):
            yield heapq.heappop(waiting)
            continue
        assert upcoming is not None
        best = limit()
        if best is not None and upcoming[0] > best:
            return  # every scope waiting or to come is bounded above the best plan
        parts, scope_id = upcoming
        found = refine(parts, scope_id)
        if found is not None:
            heapq.heappush(waiting, (found[0], scope_id, found[1]))
        upcoming = next(scopes, None)


def relief_floor(
    table: Candidates,
    state: ClusterState,
    gpus: int,
    rows: np.ndarray,
    local: list[int],
    own: np.ndarray,
    rate: float,
    short: int,
) -> Parts | None:
    """A lower bound on the in-quota work lost, and all work lost, of any set of a gang's group
    that frees `gpus` whole GPUs on `rows` from its victims `local` and relieves `short` milli of
    cap with its own tenant's in-quota work (`own`, per victim), at least `rate` lost per milli
    (None: no set frees the GPUs). Weak duality with `rate` as the price of a milli of relief:
    relief from elsewhere costs at least that, so the bound is `rate` x `short` plus the cheapest
    GPUs of the group (fractional), each own victim there costing its loss less the relief it gives."""
    need = gpus - int(state.whole_free[rows].sum())
    ks = np.array(local, dtype=np.int64)
    held = np.minimum(table.gpus_held[ks], max(need, 0))
    given = table.milli_of[ks] * own[ks]
    floors = []
    for lost in (np.where(table.borrowed[ks], 0, table.lost[ks]), table.lost[ks]):
        bound = rate * short
        if need > 0:
            useful = held > 0
            if int(held[useful].sum()) < need:
                return None
            per_gpu = (lost[useful] - rate * given[useful]) / held[useful]
            order = np.argsort(per_gpu, kind="stable")
            reach = np.cumsum(held[useful][order])
            j = int(np.searchsorted(reach, need))
            before = int(reach[j - 1]) if j else 0
            bound += float((per_gpu[order][:j] * held[useful][order][:j]).sum()) + (need - before) * per_gpu[order][j]
        floors.append(max(0, math.floor(bound * (1 - 1e-9)) - 1))
    return (floors[0], 0, floors[1], 0)


def relieved_groups(
    table: Candidates,
    state: ClusterState,
    placed: Request,
    tenant: str,
    room: CapRoom,
    scopes: Iterator[tuple[Parts, int]],
    scope_rows: Callable[[int], tuple[np.ndarray, np.ndarray]],
    shape: tuple,
    limit: Callable[[], Parts | None],
) -> Iterator[tuple[Parts, int]]:
    """(bound, group) of a gang's `scopes`, the bound raised by `relief_floor` where the cap
    binds even with every victim of the group and every relief victim that could join gone;
    floors kept per (`shape`, tenant, group) while the group's rows, the rate and the relief
    lacking stay the same (`Candidates.relief_floors`); none past `limit()` (`refined`)."""
    own = table.relief(tenant)
    if not own:
        return  # nothing can relieve the cap
    mask = table.own_tenant(tenant)
    ks = np.array(own, dtype=np.int64)
    rate = float(np.min(table.lost[ks] / np.maximum(table.milli_of[ks], 1)))
    short = placed.total_milli - room.after(0, [0])
    # The most milli relief elsewhere frees: of each kind of own work no more than covers `short`.
    sizes, counts = (x.tolist() for x in np.unique(table.milli_of[ks], return_counts=True))
    elsewhere = sum(m * min(n, -(-short // m) if m else n) for m, n in zip(sizes, counts, strict=True))

    def raised(parts: Parts, group: int) -> tuple[Parts, None] | None:
        nodes, rows = scope_rows(group)
        local = table.victims_on(nodes.tolist())
        freed = int(table.milli_of[local].sum()) + elsewhere
        lacking = placed.total_milli - room.after(freed, [0])
        if lacking <= 0:
            return parts, None
        stamp, key = int(state.row_version[rows].sum()), (shape, tenant, group)
        known = table.relief_floors.get(key)
        if known is not None and known[:3] == (stamp, rate, lacking):
            floor = known[3]
        else:
            floor = relief_floor(table, state, placed.gpus, rows, local, mask, rate, lacking)
            table.relief_floors[key] = (stamp, rate, lacking, floor)
        return (max(parts, floor), None) if floor is not None else None

    yield from ((p, s) for p, s, _ in refined(scopes, raised, limit))


def with_relief(
    table: Candidates, scopes: Iterator[tuple[Parts, int]], tenant: str, fit: np.ndarray
) -> Iterator[tuple[Parts, int]]:
    """(bound, node) of the single-node `scopes` (bound: the node's cheapest victim) where every
    valid set holds some of `tenant`'s own in-quota work (the cap relief): a set either holds one
    on the node, costing at least the node's cheapest such, or one of the node's victims and one
    elsewhere, costing at least the node's cheapest victim plus the cheapest own victim; each node
    at the lesser, in ascending order (`fit`: the nodes that are scopes)."""
    own = table.relief(tenant)
    if not own:
        return
    extra = table.parts[own[0]]
    fits = np.zeros(len(table.cheapest), dtype=bool)
    fits[fit] = True

    def on_own_nodes() -> Iterator[tuple[Parts, int]]:
        for k in own:
            for i in table.nodes_of[k]:
                if fits[i]:
                    yield table.parts[k], i

    elsewhere = ((plus(parts, extra), node) for parts, node in scopes)
    seen: set[int] = set()
    for parts, node in heapq.merge(on_own_nodes(), elsewhere):
        if node not in seen:
            seen.add(node)
            yield parts, node


def tightened(
    table: Candidates,
    state: ClusterState,
    placed: Request,
    single: bool,
    group_of: np.ndarray,
    eligible: np.ndarray,
    shape: tuple | None,
) -> Iterator[tuple[Parts, int]]:
    """(bound, scope) of the scopes of `scopes_by_bound`, by a tighter bound: for a gang's group, the
    cheapest victim alone is loose (a gang needs several GPUs freed), so each group's bound is
    `gang_floor`, computed as the group comes up in the cheap order and tried once no group not yet
    looked at could have a lower one. With `shape` (the request's, when no mask limits it) floors
    are kept per group while its rows do not change (`Candidates.gang_floors`)."""
    cheap = scopes_by_bound(table, placed, single, group_of, eligible)
    if single:
        for bound, scope in cheap:
            yield table.parts_of(bound), scope
        return
    waiting: list[tuple[Parts, int]] = []
    # Per group, the sum of its rows' versions: a stamp that changes whenever one of them does.
    stamps = np.bincount(group_of + 1, weights=state.row_version).astype(np.int64)
    upcoming = next(cheap, None)
    while upcoming is not None or waiting:
        while upcoming is not None and (not waiting or table.parts_of(upcoming[0]) < waiting[0][0]):
            bound, scope = upcoming
            stamp = int(stamps[scope + 1])
            known = table.gang_floors.get((shape, scope)) if shape is not None else None
            if known is not None and known[0] == stamp:
                floor = known[1]
            else:
                nodes = table.group_nodes(group_of, scope)
                floor = gang_floor(table, state, placed.gpus, nodes[eligible[nodes]], table.victims_on(nodes.tolist()))
                if shape is not None:
                    table.gang_floors[(shape, scope)] = (stamp, floor)
            if floor is not None:
                heapq.heappush(waiting, (max(floor, table.parts_of(bound)), scope))
            upcoming = next(cheap, None)
        if waiting:
            yield heapq.heappop(waiting)


def gang_floor(table: Candidates, state: ClusterState, gpus: int, rows: np.ndarray, local: list[int]) -> Parts | None:
    """A lower bound on the cost of any set of `local` victims that frees `gpus` whole GPUs on `rows`
    (None: even all of them cannot): each victim frees at most the GPUs it touches, so per part the
    fractional knapsack (cheapest per GPU first, the last one in part) bounds the work lost, and the
    largest first the count; in-quota victims must free what the borrowed ones cannot."""
    need = gpus - int(state.whole_free[rows].sum())
    if need <= 0:
        return (0, 0, 0, 0)
    ks = np.array(local, dtype=np.int64)
    # A victim counts for no more than the set needs: a 2-GPU gang pays for an 8-GPU victim in full.
    held, lost, borrowed = np.minimum(table.gpus_held[ks], need), table.lost[ks], table.borrowed[ks]
    if int(held.sum()) < need:
        return None
    in_quota_need = need - int(held[borrowed].sum())
    lost_floor, count_floor = _fractional(held, lost, need), _fewest(held, need)
    if in_quota_need <= 0:
        return (0, 0, lost_floor, count_floor)
    own = ~borrowed
    in_quota_lost = _fractional(np.minimum(held[own], in_quota_need), lost[own], in_quota_need)
    in_quota_count = _fewest(held[own], in_quota_need)
    return (in_quota_lost, in_quota_count, max(lost_floor, in_quota_lost), max(count_floor, in_quota_count))


def _fractional(held: np.ndarray, lost: np.ndarray, need: int) -> int:
    """The least work lost freeing `need` GPUs when a victim may go in part (a lower bound)."""
    useful = held > 0
    held, lost = held[useful], lost[useful]
    order = np.argsort(lost / held, kind="stable")
    held, lost = held[order], lost[order]
    reach = np.cumsum(held)
    j = int(np.searchsorted(reach, need))
    before = int(reach[j - 1]) if j else 0
    whole = int(lost[:j].sum())
    return max(0, whole + (need - before) * int(lost[j]) // int(held[j]) - 1)  # -1: float order slack


def _fewest(held: np.ndarray, need: int) -> int:
    """The fewest victims that together touch `need` GPUs."""
    reach = np.cumsum(np.sort(held)[::-1])
    return int(np.searchsorted(reach, need)) + 1


def scopes_by_bound(
    table: Candidates, placed: Request, single: bool, group_of: np.ndarray, eligible: np.ndarray
) -> Iterator[tuple[int, int]]:
    """(bound, scope) of every scope where the request would fit with all of the scope's live victims
    gone, cheapest bound first: a scope is a node (single-node requests) or a (domain, model) group,
    its bound the rank of its cheapest live victim (a lower bound on any plan there)."""
    potential = table.potential
    if single:
        nodes = single_node_fit(potential, placed, eligible)
        bounds = table.cheapest[nodes]
        keep = bounds < table.none
        nodes, bounds = nodes[keep], bounds[keep]
        yield from _in_order(bounds, nodes)
        return
    usable = usable_whole_gpus(potential, placed, eligible)
    code = group_of + 1  # a node without a GPU model has group -1 in domain 0
    size = int(code.max()) + 1 if len(code) else 0
    enough = np.flatnonzero(np.bincount(code, weights=usable, minlength=size) >= placed.gpus)
    cheapest = np.full(size, table.none, dtype=np.int64)
    np.minimum.at(cheapest, code, table.cheapest)
    bounds = cheapest[enough]
    keep = bounds < table.none
    yield from _in_order(bounds, enough[keep] - 1)


def _in_order(bounds: np.ndarray, scopes: np.ndarray) -> Iterator[tuple[int, int]]:
    """(bound, scope) pairs by bound, then scope, produced as the search asks for them (it
    usually stops after a few)."""
    order = np.lexsort((scopes, bounds))
    for j in order:
        yield int(bounds[j]), int(scopes[j])
