"""Per-tier placement rules (DESIGN.md section 4) over a `ClusterState`.

- Single-node requests (every P0 request, pods, anything on one GPU): among the feasible nodes, those
  that round the request up to the fewest compute units (least rounding waste) go to the node
  scorer, which picks the node and the GPUs (best-fit packing by default). A GPU without the
  request's GPU memory free is never picked.
- P1 gangs: whole GPUs of one model in one interconnect domain, on the fewest nodes.
- P2 gangs: P1's rule when it fits, else a heterogeneous mix of free whole GPUs, fewest nodes first.

`max_milli` (the request's quota headroom) rules out placements that would hold more GPU milli
than that once rounded to compute units. Every function returns a `Placement` or None; none of
them changes the state. Every GPU slice carries the request's GPU memory per GPU.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.feasibility import eligible_nodes, single_node_fit, unit_rounded
from xirang_platform.scheduling.model import GpuSlice, NodeShare, Placement, Request
from xirang_platform.scheduling.scorers import NodeScorer
from xirang_platform.scheduling.state import ClusterState


def is_single_node(request: Request) -> bool:
    """Whether the request must sit on one node: pods, inference replicas and one-GPU requests."""
    return request.single_node or request.tier.rules.single_node or request.gpus <= 1


def as_placed(request: Request) -> Request:
    """The request as placement sees it: P1 takes whole GPUs, so a P1 fraction becomes one GPU."""
    if request.tier.rules.whole_gpus and not request.whole_gpus:
        return replace(request, milli_per_gpu=MILLI_PER_GPU)
    return request


def place(
    state: ClusterState,
    request: Request,
    scorer: NodeScorer,
    priority: np.ndarray,
    allowed: np.ndarray | None = None,
    max_milli: int | None = None,
) -> Placement | None:
    """Where `request` fits now under its tier's rule, using only `allowed` nodes (mask; None = all)
    and holding at most `max_milli` GPU milli (None = no limit)."""
    request = as_placed(request)
    eligible = eligible_nodes(state, request)
    if allowed is not None:
        eligible &= allowed
    if is_single_node(request):
        return place_single_node(state, request, scorer, priority, eligible, max_milli)
    if max_milli is not None and request.total_milli > max_milli:
        return None  # a gang takes whole GPUs: it holds exactly its total
    return _place_gang_by_tier(state, request, priority, eligible)


def fits(state: ClusterState, request: Request, priority: np.ndarray) -> bool:
    """Whether `request` could be placed now anywhere (no scoring: only the answer yes or no)."""
    request = as_placed(request)
    eligible = eligible_nodes(state, request)
    if is_single_node(request):
        return len(single_node_fit(state, request, eligible)) > 0
    return _place_gang_by_tier(state, request, priority, eligible) is not None


def _place_gang_by_tier(
    state: ClusterState, request: Request, priority: np.ndarray, eligible: np.ndarray
) -> Placement | None:
    """P1's gang rule; for P2, a heterogeneous mix when that fails."""
    found = place_gang(state, request, priority, eligible, by_group=True)
    if found is None and request.tier.rules.mixed_fallback:
        found = place_gang(state, request, priority, eligible, by_group=False)
    return found


def place_single_node(
    state: ClusterState,
    request: Request,
    scorer: NodeScorer,
    priority: np.ndarray,
    eligible: np.ndarray,
    max_milli: int | None = None,
) -> Placement | None:
    """The scorer's choice among the nodes that can hold all of `request` alone, within `max_milli`
    once rounded, with the least rounding waste."""
    nodes = single_node_fit(state, request, eligible)
    if len(nodes) == 0:
        return None
    if not request.gpus:
        node, _ = scorer.pick(state, request, nodes, np.zeros(len(nodes), np.int64), priority)
        return Placement((), (NodeShare(state.names[node], request.cpu_milli, request.memory_mib),))
    need = unit_rounded(state, request.milli_per_gpu)[nodes]
    keep = need == need.min() if max_milli is None else need * request.gpus <= max_milli
    if max_milli is not None and keep.any():
        keep &= need == need[keep].min()
    if not keep.all():
        nodes, need = nodes[keep], need[keep]
        if len(nodes) == 0:
            return None
    view = state.with_memory_for(request.gpu_memory_mib)
    node, gpus = scorer.pick(view, request, nodes, need, priority)
    milli = int(need[np.searchsorted(nodes, node)])
    name = state.names[node]
    return Placement(
        slices=tuple(GpuSlice(name, g, milli, request.gpu_memory_mib) for g in gpus),
        shares=(NodeShare(name, request.cpu_milli, request.memory_mib),),
    )


def per_gpu_share(request: Request) -> tuple[int, int]:
    """CPU milli and memory MiB a gang holds per GPU on each node it spans (rounded up)."""
    return math.ceil(request.cpu_milli / request.gpus), math.ceil(request.memory_mib / request.gpus)


def usable_whole_gpus(state: ClusterState, request: Request, eligible: np.ndarray) -> np.ndarray:
    """Per node, how many whole free GPUs `request` could take there, CPU and memory included."""
    cpu, mem = per_gpu_share(request)
    whole = state.whole_free
    if cpu:
        whole = np.minimum(whole, state.cpu_free // cpu)
    if mem:
        whole = np.minimum(whole, state.mem_free // mem)
    return np.where(eligible, whole, 0)


def place_gang(
    state: ClusterState, request: Request, priority: np.ndarray, eligible: np.ndarray, *, by_group: bool
) -> Placement | None:
    """Whole GPUs on the fewest nodes: inside one (domain, model) group when `by_group`, else anywhere.

    Among groups that can hold the gang, the one needing the fewest nodes wins, then the one with
    the least usable capacity (best fit), then the lowest group number. Inside the group the nodes
    with the most usable GPUs are taken first, and the last node is the smallest that covers the rest.
    """
    usable = usable_whole_gpus(state, request, eligible)
    candidates = np.flatnonzero(usable > 0)
    if usable[candidates].sum() < request.gpus:
        return None
    if by_group:
        group = state.domain_id[candidates] * (len(state.model_names) + 1) + state.model_id[candidates]
    else:
        group = np.zeros(len(candidates), dtype=np.int64)
    u = usable[candidates]
    order = np.lexsort((priority[candidates], -u, group))
    g_sorted, u_sorted, nodes_sorted = group[order], u[order], candidates[order]
    starts = np.flatnonzero(np.r_[True, g_sorted[1:] != g_sorted[:-1]])
    lengths = np.diff(np.r_[starts, len(g_sorted)])
    totals = np.add.reduceat(u_sorted, starts)
    # Per group, how many of its nodes (most usable first) it takes to reach the gang's size.
    running_total = np.cumsum(u_sorted)
    before_group = np.repeat(np.r_[0, running_total[starts[1:] - 1]], lengths)
    position = np.arange(len(g_sorted)) - np.repeat(starts, lengths)
    reached_at = np.where(running_total - before_group >= request.gpus, position, len(g_sorted))
    nodes_needed = np.minimum.reduceat(reached_at, starts) + 1
    feasible = np.flatnonzero(totals >= request.gpus)
    if len(feasible) == 0:
        return None
    # Fewest nodes, then the least usable capacity (best fit), then the lowest group number.
    pick = feasible[np.lexsort((g_sorted[starts[feasible]], totals[feasible], nodes_needed[feasible]))[0]]
    s, end = int(starts[pick]), int(starts[pick] + lengths[pick])
    span_nodes, span_usable = nodes_sorted[s:end], u_sorted[s:end]
    node_count = int(nodes_needed[pick])
    taken = list(zip(span_nodes[: node_count - 1].tolist(), span_usable[: node_count - 1].tolist(), strict=True))
    rest = request.gpus - sum(u for _, u in taken)
    # Best fit for the last node: the smallest remaining node that covers the rest.
    tail_nodes, tail_usable = span_nodes[node_count - 1 :], span_usable[node_count - 1 :]
    fits = np.flatnonzero(tail_usable >= rest)
    last = fits[np.lexsort((priority[tail_nodes[fits]], tail_usable[fits]))[0]]
    taken.append((int(tail_nodes[last]), rest))
    return gang_placement(state, request, sorted(taken))


def gang_placement(state: ClusterState, request: Request, taken: list[tuple[int, int]]) -> Placement:
    """The placement that takes `count` lowest-index whole free GPUs on each (node, count) of `taken`."""
    cpu, mem = per_gpu_share(request)
    slices: list[GpuSlice] = []
    shares: list[NodeShare] = []
    for node, count in taken:
        name = state.names[node]
        free = np.flatnonzero(state.gpu_free[node] == MILLI_PER_GPU)[:count]
        slices.extend(GpuSlice(name, int(g), MILLI_PER_GPU, request.gpu_memory_mib) for g in free)
        shares.append(NodeShare(name, cpu * count, mem * count))
    return Placement(tuple(slices), tuple(shares))
