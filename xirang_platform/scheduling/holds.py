"""Holds: the message of each hold for people, built only when a request's hold changed
(`cycle_cache.CycleCache.hold`), and the rules of the gang reservation (DESIGN.md 5.3): which
requests it is for (`is_gang`), the ratio their in-quota chance is judged at (`hold_ratio`,
`BackfillIndex`) and the units held back for one (`reservation_scope`).
`cycle._CycleRun.reserve_for_starving_gangs` applies them.

A hold is `HoldOutcome(reason, token, build)`: the message is `build(request, token)`, or the
token itself when there is no builder. The token carries what the message reads besides the request (a quota
check's message, the milli left under a cap), so a request whose reason and token are unchanged
keeps last cycle's hold without building its message again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from xirang_platform.scheduling.feasibility import eligible_nodes
from xirang_platform.scheduling.model import Allocation, Hold, HoldReason, Request, Tier
from xirang_platform.scheduling.placement import is_single_node, usable_whole_gpus
from xirang_platform.scheduling.quota import OvercommitPolicy
from xirang_platform.scheduling.state import ClusterState

MessageBuilder = Callable[[Request, object], str]  # (request, token) -> the hold's message
# Holds a whole class of requests meets alike: their messages differ only by the request's own text.
# (`reserved-for-gang` too: the epoch moves whenever the gang reservation changes.)
CLASS_HOLDS = frozenset({HoldReason.NO_FIT, HoldReason.NEVER_FITS, HoldReason.OVER_QUOTA, HoldReason.RESERVED_FOR_GANG})


class HoldOutcome(NamedTuple):
    """The hold a request (and the rest of its class) meets, before its message is built."""

    reason: HoldReason
    token: object  # what the message reads besides the request
    build: MessageBuilder | None  # None: the token is the message

    def hold(self, request: Request) -> Hold:
        """The hold of `request`, its message built."""
        build = self.build
        return Hold(request.id, self.reason, build(request, self.token) if build is not None else str(self.token))


class KeptHold(NamedTuple):
    """A hold one cycle made, with what the next needs to re-use it: the request it was made for
    (re-used only for that very object), its message token and the number of the request's class."""

    request: Request
    hold: Hold
    token: object
    class_no: int

    def fits(self, request: Request, reason: HoldReason, token: object) -> bool:
        """Whether this hold is `request`'s hold for `reason` and `token` (its message unchanged)."""
        return self.request is request and self.hold.reason is reason and self.token == token


def shape_text(r: Request) -> str:
    """The request as people read it: id, tier, GPUs, CPU and memory."""
    gpu = f"{r.gpus} GPU" if r.whole_gpus else f"{r.milli_per_gpu} milli-GPU"
    return f"{r.id} ({r.tier}, {gpu}, {r.cpu_milli} milli-CPU, {r.memory_mib} MiB)"  # a StrEnum reads as its value


def no_fit_message(r: Request, _: object) -> str:
    """No-fit: the request alone decides the message."""
    return f"no free units fit {shape_text(r)} now; it waits for capacity"


def rounded_past_cap_message(r: Request, headroom: object) -> str:
    """Over its cap once a free unit rounds it up (`headroom`: the milli left under the cap)."""
    return (
        f"{shape_text(r)}: the free units round it up past its cap ({headroom} milli left under it); "
        "it waits for finer units or room"
    )


def already_running_message(r: Request, start: object) -> str:
    """A request whose id is running already (`start`: when that run was admitted)."""
    return (
        f"{r.id} is already running (admitted at t={start:g}); a request is admitted once: wait for that "
        "run to end, or submit the new run under another id"
    )


def deferred_message(r: Request, _: object = None) -> str:
    """The cycle's budget (its search steps, or the live tick's time) was spent before `r`'s turn."""
    return (
        f"this cycle's budget (search steps, or the tick's time) ran out before the turn of {shape_text(r)}; "
        "it goes first in its tier next cycle"
    )


MIXING_DOC = "docs/guide.md#which-tiers-may-mix-gpu-models"


def never_fits_message(r: Request, _: object = None) -> str:
    """Never fits this pool, with what the request could relax."""
    if is_single_node(r):
        rule = "one node"
    elif r.tier.rules.mixed_fallback:
        rule = "the whole pool"
    else:
        rule = "one interconnect domain of one GPU model"
    constraints = []
    if r.gpu_models:
        constraints.append(f"models {sorted(r.gpu_models)}")
    if r.min_compute_level:
        constraints.append(f"compute level >= {r.min_compute_level}")
    if r.gpu_memory_mib:
        constraints.append(f">= {r.gpu_memory_mib} MiB GPU memory")
    extra = f" with {', '.join(constraints)}" if constraints else ""
    return (
        f"{shape_text(r)} cannot fit on {rule}{extra} of this pool even when it is empty; "
        "ask for fewer GPUs, CPU or memory, or relax the GPU model / compute level / memory tags "
        f"(which tiers may mix GPU models and domains: {MIXING_DOC})"
    )


MOST_RESERVATION_MOVES = 16
"""How often one cycle moves the gang reservation on (to the next blocked gang, once the last got its
units): each move gives the requests the old hold kept out another turn, so the bound keeps a cycle's
turns within `MOST_RESERVATION_MOVES + 2` times its queue (DESIGN.md 5.2: no part of the cycle grows faster
than the pool times the queue). A gang past the bound gets its hold next cycle, one tick later."""


def is_gang(request: Request) -> bool:
    """Whether a starving `request` may be held for: a multi-GPU request of a gang tier (P1, P2). A P0
    replica never takes, uses up or lifts a gang's hold: it goes first, and the hold stays."""
    return request.gpus > 1 and not request.tier.rules.single_node


@dataclass(frozen=True)
class BackfillIndex:
    """Running work by tier and start time, to tell how much of it is backfill a starving gang's hold
    is there to stop: per tier rank r, the start times of the work of rank r or more, sorted, and the
    GPU milli of that work from each start on (`since` is two lookups)."""

    starts: tuple[np.ndarray, ...]
    after: tuple[np.ndarray, ...]  # after[r][k]: milli of the work of rank >= r from starts[r][k] on

    @classmethod
    def of(cls, allocations: Iterable[Allocation]) -> BackfillIndex:
        """The index of `allocations` (the snapshot's running work)."""
        # A placement's slices all hold the same milli (a fraction is one slice; more than one GPU is
        # whole GPUs), so its milli is the first slice's times their count, without summing them.
        rows = [
            (_RANK[a.request.tier], a.start, len(s) * s[0].milli if (s := a.placement.slices) else 0)
            for a in allocations
        ]
        table = np.array(rows, dtype=float).reshape(-1, 3)
        table = table[np.argsort(table[:, 1], kind="stable")]
        starts, after = [], []
        for rank in _RANKS:
            kept = table[table[:, 0] >= rank]
            starts.append(kept[:, 1])
            after.append(np.append(np.cumsum(kept[::-1, 2])[::-1], 0.0))
        return cls(tuple(starts), tuple(after))

    def since(self, rank: int, t: float) -> int:
        """GPU milli of the running work of tier `rank` or below (rank >= `rank`) that started at or after `t`."""
        return int(self.after[rank][int(np.searchsorted(self.starts[rank], t, side="left"))])


_RANK = {tier: tier.rank for tier in Tier}
_RANKS = range(max(_RANK.values()) + 1)


def hold_ratio(policy: OvercommitPolicy, state: ClusterState, backfill_milli: int) -> float:
    """The cap ratio a starving gang is judged at (whether it could run in quota): the ratio at the
    cluster's allocation less `backfill_milli`, the work of its tier or below admitted since it was
    submitted. That backfill is what the hold stops; counting it would lower the ratio until the gang
    it starves looked borrowed-only and got no hold. Work of higher tiers, and work that ran before the
    gang came, still counts."""
    if not state.capacity_milli:
        return policy.ratio(0.0)
    return policy.ratio(max(0, state.allocated_milli - backfill_milli) / state.capacity_milli)


def reservation_scope(
    state: ClusterState, request: Request, priority: np.ndarray, allowed: np.ndarray | None = None
) -> np.ndarray | None:
    """Nodes (of `allowed`; None = all) to hold back for a starving gang that does not fit now: the
    node (single-node gang) or (domain, model) group that already has the most usable whole GPUs and
    could hold the gang when empty; for a tier with the mixed fallback that no group could hold, the
    eligible nodes with the most usable whole GPUs, as many as hold the gang when empty. None when no
    such nodes exist."""
    eligible = eligible_nodes(state, request)
    if allowed is not None:
        eligible = eligible & allowed
    usable = usable_whole_gpus(state, request, eligible)
    if is_single_node(request):
        big_enough = np.flatnonzero(eligible & (state.gpu_count >= request.gpus))
        if len(big_enough) == 0:
            return None
        best = big_enough[np.lexsort((priority[big_enough], -usable[big_enough]))[0]]
        mask = np.zeros(len(state.names), dtype=bool)
        mask[best] = True
        return mask
    best_key, best_mask = None, None
    for domain, model in sorted(
        {(int(d), int(m)) for d, m in zip(state.domain_id[eligible], state.model_id[eligible], strict=True)}
    ):
        mask = eligible & (state.domain_id == domain) & (state.model_id == model)
        if state.gpu_count[mask].sum() < request.gpus:
            continue
        key = (-int(usable[mask].sum()), domain, model)
        if best_key is None or key < best_key:
            best_key, best_mask = key, mask
    if best_mask is None and request.tier.rules.mixed_fallback:
        return _mixed_scope(state, request, priority, eligible, usable)
    return best_mask


def _mixed_scope(
    state: ClusterState, request: Request, priority: np.ndarray, eligible: np.ndarray, usable: np.ndarray
) -> np.ndarray | None:
    """The fewest eligible nodes, most usable whole GPUs first (then node priority), whose GPUs add up
    to the gang: where the heterogeneous fallback will find room first as running work ends."""
    nodes = np.flatnonzero(eligible)
    if len(nodes) == 0:
        return None
    ranked = nodes[np.lexsort((priority[nodes], -usable[nodes]))]
    total = np.cumsum(state.gpu_count[ranked])
    if total[-1] < request.gpus:
        return None
    mask = np.zeros(len(state.names), dtype=bool)
    mask[ranked[: int(np.searchsorted(total, request.gpus)) + 1]] = True
    return mask


class ReservedGang(NamedTuple):
    """A gang units are held back for, and the nodes held for it."""

    gang: Request
    nodes: np.ndarray


@dataclass
class GangReservations:
    """The units held back in a cycle for starving gangs, oldest gang first: the oldest starving gang,
    where it fits now if it does, and the oldest blocked one (`blocked`: it does not fit now), the nodes
    `reservation_scope` chose. A request of a gang's tier or below may not use another held gang's
    nodes, whatever its place in the order; higher tiers (P0 first) are never bound."""

    gangs: list[ReservedGang] = field(default_factory=list)
    blocked: Request | None = None
    _masks: dict[tuple[str | None, int], np.ndarray | None] = field(default_factory=dict)

    @property
    def oldest(self) -> Request | None:
        """The oldest gang units are still held for, if any."""
        return self.gangs[0].gang if self.gangs else None

    def holds_for(self, request_id: str) -> bool:
        """Whether units are held for the gang `request_id`."""
        return any(g.id == request_id for g, _ in self.gangs)

    def allowed_for(self, request: Request) -> np.ndarray | None:
        """The nodes `request` may use (None = all): not those held for another gang of its tier or above."""
        if not self.gangs:
            return None
        key = (request.id if self.holds_for(request.id) else None, request.tier.rank)
        if key in self._masks:
            return self._masks[key]
        held = None
        for gang, scope in self.gangs:
            if gang.id != key[0] and gang.tier.rank <= key[1]:
                held = scope.copy() if held is None else held | scope
        found = self._masks[key] = None if held is None else ~held
        return found

    def binding(self, request: Request) -> Request | None:
        """The oldest gang whose units `request` may not use (None: it is bound by none)."""
        for gang, _ in self.gangs:
            if gang.id != request.id and gang.tier.rank <= request.tier.rank:
                return gang
        return None
