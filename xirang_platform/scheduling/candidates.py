"""What preempting costs and what a request may preempt: work lost since the last checkpoint
(`work_lost`), the contract's victim order (`victim_cost`: borrowed before in-quota, then least work
lost, then fewest victims; ids only break exact ties), and the cycle's table of candidate victims
with the per-node arrays the planner's bounds read (`Candidates`). `preemption` plans over them;
`scope_order` bounds scopes with them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.model import Allocation, Placement, PreemptReason
from xirang_platform.scheduling.state import ClusterState
from xirang_platform.scheduling.victim_sets import CapRoom, KnownRelief, Parts, ReliefKinds


class KeptOrder(Protocol):
    """What the victim list asks of a scope order kept across its plans (`scope_order.GroupBounds`,
    `scope_order.NodeBounds`, which this module does not import: they read the list)."""

    def forget(self, group: int) -> None:
        """Look at `group` again when next asked."""
        ...


@dataclass(frozen=True)
class Plan:
    """Victims to stop (with why) and where the request then runs."""

    victims: tuple[tuple[Allocation, PreemptReason], ...]
    placement: Placement


def work_lost(a: Allocation, now: float, checkpoint_interval_s: float | None) -> float:
    """GPU-seconds that preempting `a` at `now` throws away: the work since its last checkpoint, the
    later of the one it reported (`a.checkpointed_at`) and the last periodic one every
    `checkpoint_interval_s` from its start; since its start when it has neither."""
    ran = max(0.0, now - a.start)
    saved = math.floor(ran / checkpoint_interval_s) * checkpoint_interval_s if checkpoint_interval_s else 0.0
    if a.checkpointed_at is not None:
        saved = max(saved, min(ran, a.checkpointed_at - a.start))
    return (ran - saved) * a.milli / MILLI_PER_GPU


VictimCost = tuple[int, int, int, int, tuple[tuple[Parts, str], ...]]


def victim_parts(a: Allocation, now: float, checkpoint_interval_s: float | None) -> Parts:
    """The cost of preempting `a` alone, without its id: in-quota work lost, in-quota victims, work
    lost, victims; work in micro-GPU-seconds (integers, so the sums over a set are exact)."""
    lost = round(work_lost(a, now, checkpoint_interval_s) * 1e6)
    return (0, 0, lost, 1) if a.borrowed else (lost, 1, lost, 1)


def victim_cost(victims: Iterable[Allocation], now: float, checkpoint_interval_s: float | None) -> VictimCost:
    """The cost of preempting `victims` (one, or a whole plan); smaller is cheaper.

    In order: in-quota work lost and in-quota victims (so borrowed victims always go first), then
    all work lost, then the number of victims; exact ties only: the victims cheapest first (each
    alone, id among equals), compared in turn.
    """
    each = sorted((victim_parts(v, now, checkpoint_interval_s), v.id) for v in victims)
    total = [0, 0, 0, 0]
    for parts, _ in each:
        for j in range(4):
            total[j] += parts[j]
    return (total[0], total[1], total[2], total[3], tuple(each))


class Candidates:
    """The allocations a request may preempt, cheapest first (`victim_cost` of each alone), with the
    per-node arrays the planner's bounds read: `potential`, the free capacity with every live victim
    gone, and `cheapest`, per node, its cheapest live victim. A cycle keeps one per kind of request,
    marks victims gone (`drop`) as it preempts them and tells it what else changed capacity (`taken`,
    `freed`), so the list is sorted once per cycle."""

    def __init__(
        self,
        state: ClusterState,
        candidates: Sequence[tuple[Allocation, PreemptReason]],
        cost: Callable[[Sequence[Allocation]], VictimCost],
    ) -> None:
        costs = [cost([c[0]]) for c in candidates]
        order = sorted(range(len(candidates)), key=costs.__getitem__)
        self.ordered: list[tuple[Allocation, PreemptReason]] = [candidates[k] for k in order]
        self.parts: list[Parts] = [costs[k][:4] for k in order]  # per victim alone: `victim_parts`
        self.allocations = [a for a, _ in self.ordered]
        self.milli = [a.milli for a in self.allocations]
        self.tenant = np.array([a.request.tenant for a, _ in self.ordered], dtype=object)
        self.borrowed = np.array([a.borrowed for a, _ in self.ordered], dtype=bool)
        self.parts_rows = np.array(self.parts, dtype=np.int64).reshape(-1, 4)  # `parts`, one row per victim
        self.lost = self.parts_rows[:, 2].copy()
        self.milli_of = np.array(self.milli, dtype=np.int64).reshape(-1)
        self.own = np.zeros(len(self.ordered), dtype=bool)  # per victim, of the tenant of `own_of`
        self.own_of: str | None = None
        self.position = {a.id: k for k, (a, _) in enumerate(self.ordered)}
        self.active = np.ones(len(self.ordered), dtype=bool)
        index = state.index
        # Per victim, the GPUs it touches: at most that many whole GPUs come free when it goes; the
        # node of each, victim after victim (`gpus_on`), from `gpu_start`.
        touched = [dict.fromkeys((index[s.node], s.gpu) for s in a.placement.slices) for a in self.allocations]
        self.gpus_held = np.array([len(t) for t in touched], dtype=np.int64).reshape(-1)
        self.gpu_start = np.concatenate(([0], np.cumsum(self.gpus_held)))
        self.gpu_node = np.array([i for t in touched for i, _ in t], dtype=np.int64).reshape(-1)
        # The nodes each victim holds, and the victims on each node (cheapest first).
        self.nodes_of: list[list[int]] = [
            [index[name] for name in dict.fromkeys(a.placement.nodes)] for a, _ in self.ordered
        ]
        self.on_node: dict[int, list[int]] = {}
        for k, nodes in enumerate(self.nodes_of):
            for i in nodes:
                self.on_node.setdefault(i, []).append(k)
        self.none = len(self.ordered)  # `cheapest` of a node without live victims
        self.cheapest = np.full(len(state.names), self.none, dtype=np.int64)
        self.milli_on = np.zeros(len(state.names), dtype=np.int64)  # per node, its live victims' milli
        for i, ks in self.on_node.items():
            self.cheapest[i] = ks[0]
            self.milli_on[i] = sum(self.milli[k] for k in ks)
        self.potential = state.copy()
        self.potential.release_all([a.placement for a, _ in self.ordered])
        self._relief: dict[str, np.ndarray] = {}
        self._relief_positions: dict[str, list[int]] = {}
        self.relief_kinds: dict[tuple[str, str], ReliefKinds] = {}  # per (tenant, project)
        self._groups: dict[int, np.ndarray] = {}
        self._on_nodes: dict[tuple[int, ...], list[int]] = {}  # per scope's nodes, its victims, live or not
        # Per (tenant, project, accounts) of a request, each victim's relief (`KnownRelief`).
        self.reliefs: dict[tuple[str, str, int], tuple[dict[int, tuple[int, ...]], np.ndarray]] = {}
        self.relief_floors: dict[tuple, tuple[int, float, int, Parts | None]] = {}  # `_relieved_groups`
        self.origin: Candidates | None = None  # the list this one shares its live victims with (`relisted`)
        # Gang plans per (request shape, group), with the group's capacity stamp when planned: a
        # plan that quota did not shape holds while nothing in the group changed.
        self.gang_plans: dict[tuple, tuple[int, Plan | None, VictimCost | None]] = {}
        # Gang floors per (request shape, group), with the group's stamp: `gang_floor`, raised to
        # the bound that cut a search that found nothing (quota free, so nothing else shapes it).
        self.gang_floors: dict[tuple, tuple[int, Parts | None]] = {}
        # Per request shape, each group's bound and the groups by it (`scope_order.GroupBounds`).
        self.group_bounds: dict[tuple, KeptOrder] = {}
        self.node_bounds: dict[tuple, KeptOrder] = {}  # likewise per single-node shape, its nodes
        self._group_live: dict[int, tuple[int, list[int], int]] = {}  # `group_victims`

    def lists(self, candidates: Sequence[tuple[Allocation, PreemptReason]]) -> tuple[bool, bool]:
        """Whether `candidates` are exactly this list's live victims, and whether with the same
        reasons too."""
        position, active, ordered = self.position, self.active, self.ordered
        if len(candidates) != int(active.sum()):
            return False, False
        same_reasons = True
        for a, reason in candidates:
            k = position.get(a.id)
            if k is None or not active[k]:
                return False, False
            same_reasons = same_reasons and ordered[k][1] == reason
        return True, same_reasons

    def relisted(self, candidates: Sequence[tuple[Allocation, PreemptReason]]) -> Candidates:
        """This list for another kind of request that may preempt the same live victims (`lists`),
        with its reasons: everything but the reasons and the plans kept is shared, the live victims
        and the capacity too (so only the list it came from is told of changes: `origin`)."""
        out = copy.copy(self)
        reasons = {a.id: reason for a, reason in candidates}
        out.ordered = [(a, reasons.get(a.id, reason)) for a, reason in self.ordered]
        out.relief_kinds, out.gang_plans, out.gang_floors, out.relief_floors = {}, {}, {}, {}
        out.group_bounds, out.node_bounds = {}, {}
        out.origin = self.origin or self
        return out

    def known_relief(self, room: CapRoom, owner: tuple[str, str]) -> KnownRelief:
        """`room`, a request of `owner` (tenant, project)'s, with each victim's relief kept for the
        cycle's plans for the same accounts (`reliefs`)."""
        key = (*owner, room.accounts)
        kept = self.reliefs.get(key)
        if kept is None:
            kept = self.reliefs[key] = ({}, np.full((len(self.ordered), room.accounts), -1, dtype=np.int64))
        return KnownRelief(room, kept[0], self.allocations, kept[1])

    def parts_of(self, k: int) -> Parts:
        """The cost of victim `k` alone, ids left out: a lower bound on any plan that holds it."""
        return self.parts[k]

    def drop(self, allocation_id: str) -> None:
        """Mark a victim gone (it was preempted): no later plan of this cycle lists it."""
        k = self.position.get(allocation_id)
        if k is not None and self.active[k]:
            self.active[k] = False
            for i in self.nodes_of[k]:
                self.milli_on[i] -= self.milli[k]
                live = [j for j in self.on_node[i] if self.active[j]]
                self.cheapest[i] = live[0] if live else self.none

    def taken(self, placement: Placement) -> None:
        """Capacity the cycle gave away (an admission): no victim can free it."""
        self.potential.apply(placement)

    def freed(self, victim: Allocation) -> None:
        """A victim preempted for another kind of request: gone from the pool, so gone from this
        list (`drop`) or, when it was not on it, capacity every plan may count on."""
        if victim.id in self.position:
            self.drop(victim.id)
        else:
            self.potential.release(victim.placement)

    def relief(self, tenant: str) -> list[int]:
        """The live victims of `tenant`'s own in-quota work, cheapest first."""
        if tenant not in self._relief:
            self._relief[tenant] = np.flatnonzero((self.tenant == tenant) & ~self.borrowed)
        own = self._relief[tenant]
        return own[self.active[own]].tolist()

    def own_tenant(self, tenant: str) -> np.ndarray:
        """Per victim, whether it is `tenant`'s own in-quota work (kept in `own`)."""
        if self.own_of != tenant:
            self.own, self.own_of = (self.tenant == tenant) & ~self.borrowed, tenant
        return self.own

    def relief_positions(self, tenant: str) -> list[int]:
        """`tenant`'s own in-quota victims, live or not, cheapest first (`relief` keeps the live)."""
        found = self._relief_positions.get(tenant)
        if found is None:
            found = self._relief_positions[tenant] = np.flatnonzero((self.tenant == tenant) & ~self.borrowed).tolist()
        return found

    def group_nodes(self, group_of: np.ndarray, group: int) -> np.ndarray:
        """The nodes of one (domain, model) group (`group_of`: each node's group code)."""
        if group not in self._groups:
            self._groups[group] = np.flatnonzero(group_of == group)
        return self._groups[group]

    def group_victims(self, group_of: np.ndarray, group: int, stamp: int) -> tuple[list[int], int]:
        """The live victims of one (domain, model) group (`victims_on` its nodes) and their GPU
        milli, kept while the group's `stamp` (the sum of its rows' versions) stays: a victim goes
        only by being released from the state, which bumps the versions of its rows."""
        known = self._group_live.get(group)
        if known is not None and known[0] == stamp:
            return known[1], known[2]
        local = self.victims_on(self.group_nodes(group_of, group).tolist())
        freed = int(self.milli_of[local].sum())
        self._group_live[group] = (stamp, local, freed)
        return local, freed

    def raise_gang_floor(self, shape: tuple, group: int, stamp: int, floor: Parts) -> None:
        """A tighter floor for the group's gang plans of `shape` while its rows stay (`gang_floors`),
        so its bound is taken again (`GroupBounds`)."""
        self.gang_floors[(shape, group)] = (stamp, floor)
        bounds = self.group_bounds.get(shape)
        if bounds is not None:
            bounds.forget(group)

    def gpus_on(self, ks: Sequence[int], nodes: np.ndarray) -> np.ndarray:
        """Per victim of `ks`, how many of the GPUs it touches lie on `nodes` (per node of the pool,
        whether it counts): each GPU freed there is at most one of them."""
        at = np.asarray(ks, dtype=np.int64)
        count = self.gpus_held[at]
        owner = np.repeat(np.arange(len(at)), count)
        # Each victim's run of `gpu_node`: its start, then one on per GPU.
        entry = np.repeat(self.gpu_start[at] - (np.cumsum(count) - count), count) + np.arange(len(owner))
        return np.bincount(owner, weights=nodes[self.gpu_node[entry]], minlength=len(at)).astype(np.int64)

    def victims_on(self, nodes: Iterable[int]) -> list[int]:
        """The live victims holding any of `nodes`, cheapest first."""
        key = tuple(nodes)
        every = self._on_nodes.get(key)
        if every is None:  # the same scopes come up plan after plan
            found: set[int] = set()
            for i in key:
                found.update(self.on_node.get(i, ()))
            every = self._on_nodes[key] = sorted(found)
        active = self.active
        return [k for k in every if active[k]]
