"""The order in which the preemption planner tries scopes (DESIGN.md section 5.2): lower bounds on
the cost of any plan of a scope, tightened in steps, so the best plan tends to come first and every
scope bounded above it is never searched.

The steps: the cheapest victim of a scope (`scopes_by_bound`); for a gang's group, the whole GPUs it
must free (`gang_floor`, `tightened`); where the request's cap binds, the relief its own tenant's
in-quota work must give (`relief_floor` for groups, `with_relief` for nodes); then the scope's
knapsack root floor (`victim_sets.root_floor`, through `refined`). Each is a lower bound, so the
order never changes a plan, only how soon the planner may stop. Where the cap binds, the plans of a
cycle read nearly every scope's first bound, so those orders are kept across them (`NodeBounds`,
`GroupBounds`) and looked at again only where rows changed.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np

from xirang_platform.scheduling.feasibility import capacity_fit, single_node_fit
from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.placement import usable_whole_gpus
from xirang_platform.scheduling.state import ClusterState
from xirang_platform.scheduling.victim_sets import CapRoom, Parts, plus

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
    group_of: np.ndarray,
    shape: tuple,
    limit: Callable[[], Parts | None],
) -> Iterator[tuple[Parts, int]]:
    """(bound, group) of a gang's `scopes`, the bound raised by `relief_floor` where the cap
    binds even with every victim of the group and every relief victim that could join gone;
    floors kept per (`shape`, tenant, group) while the group's rows, the rate and the relief
    lacking stay the same (`Candidates.relief_floors`); none past `limit()` (`refined`)."""
    own = table.relief(tenant)
    mask = table.own_tenant(tenant)
    rate, elsewhere = 0.0, 0  # without own in-quota work, only a group's own victims relieve the cap
    if own:
        ks = np.array(own, dtype=np.int64)
        rate = float(np.min(table.lost[ks] / np.maximum(table.milli_of[ks], 1)))
        short = placed.total_milli - room.after(0, [0])
        # The most milli relief elsewhere frees: of each kind of own work no more than covers `short`.
        sizes, counts = (x.tolist() for x in np.unique(table.milli_of[ks], return_counts=True))
        elsewhere = sum(m * min(n, -(-short // m) if m else n) for m, n in zip(sizes, counts, strict=True))

    def raised(parts: Parts, group: int) -> tuple[Parts, None] | None:
        nodes, rows = scope_rows(group)
        stamp = int(state.row_version[rows].sum())
        whole = stamp if len(rows) == len(nodes) else int(state.row_version[nodes].sum())
        local, freed = table.group_victims(group_of, group, whole)
        lacking = placed.total_milli - room.after(freed + elsewhere, [0])
        if lacking <= 0:
            return parts, None
        if not own:
            return None  # the group's victims leave the cap binding, and no relief elsewhere exists
        key = (shape, tenant, group)
        known = table.relief_floors.get(key)
        if known is not None and known[:3] == (stamp, rate, lacking):
            floor = known[3]
        else:
            floor = relief_floor(table, state, placed.gpus, rows, local, mask, rate, lacking)
            table.relief_floors[key] = (stamp, rate, lacking, floor)
        return (max(parts, floor), None) if floor is not None else None

    yield from ((p, s) for p, s, _ in refined(scopes, raised, limit))


def single_scopes(
    table: Candidates, state: ClusterState, placed: Request, eligible: np.ndarray, shape: tuple | None
) -> np.ndarray:
    """Per node, whether a single-node request fits there with all its live victims gone (with
    `shape`, the request's when no mask limits it, only of the nodes that hold a live victim:
    the shape's `NodeBounds`)."""
    if shape is None:
        fits = np.zeros(len(table.cheapest), dtype=bool)
        fits[single_node_fit(table.potential, placed, eligible)] = True
        return fits
    nodes = _kept(table.node_bounds, shape, NodeBounds)
    nodes.ordered(table, state, placed, eligible)
    return nodes.fits


def with_relief(
    table: Candidates, scopes: Iterator[tuple[Parts, int]], tenant: str, fits: np.ndarray
) -> Iterator[tuple[Parts, int]]:
    """(bound, node) of the single-node `scopes` (bound: the node's cheapest victim) where every
    valid set holds some of `tenant`'s own in-quota work (the cap relief): a set either holds one
    on the node, costing at least the node's cheapest such, or one of the node's victims and one
    elsewhere, costing at least the node's cheapest victim plus the cheapest own victim; each node
    at the lesser, in ascending order (`fits`: per node, whether it is a scope, `single_scopes`;
    the nodes of a live victim are all that count)."""
    own = table.relief(tenant)
    if not own:
        return
    extra = table.parts[own[0]]

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
    kept: bool = False,
) -> Iterator[tuple[Parts, int]]:
    """(bound, scope) of the scopes of `scopes_by_bound`, by a tighter bound: for a gang's group, the
    cheapest victim alone is loose (a gang needs several GPUs freed), so each group's bound is
    `gang_floor`, computed as the group comes up in the cheap order and tried once no group not yet
    looked at could have a lower one. With `shape` (the request's, when no mask limits it) floors
    are kept per group while its rows do not change (`Candidates.gang_floors`); with `kept` too
    (the request's cap binds: its plans read nearly every scope's bound, each raised by the relief
    the cap needs) the order itself is kept across the cycle's plans (`NodeBounds`, `GroupBounds`),
    looked at again only where rows changed. Without it a plan stops after a few scopes, so the
    order is built afresh, as far as the plan reads it."""
    if kept and shape is not None:
        if single:
            by_node = _kept(table.node_bounds, shape, NodeBounds)
            for bound, node in by_node.ordered(table, state, placed, eligible):
                yield table.parts_of(bound), node
            return
        bounds = _kept(table.group_bounds, shape, GroupBounds)
        yield from bounds.ordered(table, state, placed, group_of, eligible, shape)
        return
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


_FEW_CHANGED = 256  # changed rows `NodeBounds` updates one at a time (Python); past it, one numpy pass


class NodeBounds:
    """For the plans of one single-node request shape (no mask) in one cycle, the nodes of
    `scopes_by_bound` (those where the request would fit with all their live victims gone, and
    that hold one) by the rank of their cheapest live victim, in that order: both depend only on
    the node's row (in the state and in `Candidates.potential`) and its live victims, so a node is
    looked at again only when its row's version changed (a victim goes only by being released
    from the state)."""

    def __init__(self) -> None:
        self.versions: np.ndarray | None = None  # `row_version` of the state when last looked at
        self.fits = np.zeros(0, dtype=bool)  # per node, whether it is a scope
        self.bound: dict[int, int] = {}  # per scope, its cheapest live victim
        self.order: list[tuple[int, int]] = []  # (bound, node), ascending

    def ordered(
        self, table: Candidates, state: ClusterState, placed: Request, eligible: np.ndarray
    ) -> list[tuple[int, int]]:
        """(bound, node) of every scope, ascending (ties by node), looking again at the nodes whose
        rows changed since the last call."""
        versions = state.row_version
        rows = np.flatnonzero(versions != self.versions) if self.versions is not None else None
        # Past `_FEW_CHANGED` changed rows (many plans of other lists since), rebuild in one pass.
        if rows is None or len(rows) > _FEW_CHANGED:
            nodes = single_node_fit(table.potential, placed, eligible)
            bounds = table.cheapest[nodes]
            keep = bounds < table.none
            nodes, bounds = nodes[keep], bounds[keep]
            order = np.lexsort((nodes, bounds))
            self.order = list(zip(bounds[order].tolist(), nodes[order].tolist(), strict=True))
            self.bound = {node: bound for bound, node in self.order}
            self.fits = np.zeros(len(versions), dtype=bool)
            self.fits[nodes] = True
        elif len(rows):
            fit = eligible[rows] & capacity_fit(table.potential, placed, rows)
            bounds = table.cheapest[rows]
            for node, fits, bound in zip(rows.tolist(), fit.tolist(), bounds.tolist(), strict=True):
                old = self.bound.pop(node, None)
                if old is not None:
                    del self.order[bisect.bisect_left(self.order, (old, node))]
                self.fits[node] = fits and bound < table.none
                if self.fits[node]:
                    self.bound[node] = bound
                    bisect.insort(self.order, (bound, node))
        self.versions = versions.copy()
        return list(self.order)  # a copy: the plan's cycle changes the rows while it reads them


class GroupBounds:
    """For the gang plans of one request shape (no mask) in one cycle, each (domain, model) group's
    bound, `gang_floor` raised to its cheapest live victim (kept in `Candidates.gang_floors`, where
    a plan may raise it), and the groups in ascending order of it: a scope is a group where the
    gang would fit with all its live victims gone (`scopes_by_bound`). All of it depends only on
    the group's rows (the capacity of the state and of `Candidates.potential`, the live victims),
    so a group is looked at again only when its stamp, the sum of its rows' versions, changed (or
    `forget` was told): the plans of a cycle change a few groups each, not every one. As in
    `tightened`, a group's floor is computed only once no group whose floor is known or not
    needed yet could come first (its cheapest victim bounds it until then)."""

    def __init__(self) -> None:
        self.stamps = np.zeros(0, dtype=np.int64)  # per group code (group + 1), when last looked at
        self.bound: dict[int, Parts] = {}  # per scope whose floor is known
        self.order: list[tuple[Parts, int]] = []  # (bound, group) of those, ascending
        self.pending: dict[int, tuple[Parts, int]] = {}  # per scope whose floor is not: (cheap bound, stamp)

    def forget(self, group: int) -> None:
        """Look at `group` again when next asked (its floor was raised)."""
        if group + 1 < len(self.stamps):
            self.stamps[group + 1] = -1

    def ordered(
        self,
        table: Candidates,
        state: ClusterState,
        placed: Request,
        group_of: np.ndarray,
        eligible: np.ndarray,
        shape: tuple,
    ) -> Iterator[tuple[Parts, int]]:
        """(bound, group) of every scope, ascending, looking again at the groups whose rows changed
        since the last call; a group's floor is computed as it comes up."""
        code = group_of + 1  # a node without a GPU model has group -1 in domain 0
        size = int(code.max()) + 1 if len(code) else 0
        stamps = np.bincount(code, weights=state.row_version, minlength=size).astype(np.int64)
        if len(self.stamps) != size:
            self.stamps = np.full(size, -1, dtype=np.int64)
        for c in np.flatnonzero(stamps != self.stamps).tolist():
            group, stamp = c - 1, int(stamps[c])
            old = self.bound.pop(group, None)
            if old is not None:
                del self.order[bisect.bisect_left(self.order, (old, group))]
            self.pending.pop(group, None)
            nodes = table.group_nodes(group_of, group)
            usable = usable_whole_gpus(table.potential, placed, eligible[nodes], nodes)
            cheapest = int(table.cheapest[nodes].min()) if len(nodes) else table.none
            if int(usable.sum()) >= placed.gpus and cheapest < table.none:
                self.pending[group] = (table.parts_of(cheapest), stamp)
        self.stamps = stamps
        known = list(self.order)  # a copy: the bounds change as floors come in, and as plans go
        cheap = sorted((parts, group) for group, (parts, _) in self.pending.items())
        waiting: list[tuple[Parts, int]] = []  # floors computed during this call
        i, j = 0, 0
        while True:
            head = known[i] if i < len(known) else None
            if waiting and (head is None or waiting[0] < head):
                head = waiting[0]
            if j < len(cheap) and (head is None or cheap[j][0] < head[0]):
                group = cheap[j][1]
                j += 1
                entry = self.pending.pop(group, None)
                if entry is None:
                    continue
                bound = self._bound(table, state, placed, group_of, eligible, shape, group, entry[1], entry[0])
                if bound is not None:
                    self.bound[group] = bound
                    bisect.insort(self.order, (bound, group))
                    heapq.heappush(waiting, (bound, group))
                continue
            if head is None:
                return
            if waiting and head == waiting[0]:
                heapq.heappop(waiting)
            else:
                i += 1
            yield head

    @staticmethod
    def _bound(
        table: Candidates,
        state: ClusterState,
        placed: Request,
        group_of: np.ndarray,
        eligible: np.ndarray,
        shape: tuple,
        group: int,
        stamp: int,
        cheap: Parts,
    ) -> Parts | None:
        """The group's bound (None: no set of its victims frees the GPUs), at least `cheap`."""
        known = table.gang_floors.get((shape, group))
        if known is not None and known[0] == stamp:
            floor = known[1]
        else:
            nodes = table.group_nodes(group_of, group)
            local, _ = table.group_victims(group_of, group, stamp)
            floor = gang_floor(table, state, placed.gpus, nodes[eligible[nodes]], local)
            table.gang_floors[(shape, group)] = (stamp, floor)
        return None if floor is None else max(floor, cheap)


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


Kept = TypeVar("Kept", GroupBounds, NodeBounds)


def _kept(store: dict[tuple, Any], shape: tuple, kind: type[Kept]) -> Kept:
    """The order of `kind` kept for `shape` in the victim list's `store`, made on first use."""
    kept = store.get(shape)
    if kept is None:
        kept = store[shape] = kind()
    return cast(Kept, kept)
