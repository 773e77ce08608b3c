"""Whole-GPU gangs: what a gang can take per node, the placement that takes it, and P1's gang rule
(`placement.place_gang` with `by_group=True`) over an index kept in sync per kind of gang, so that
a gang costs a few passes over the pool instead of a sort of it.

Per (CPU and memory per GPU, eligibility) the index holds every node's usable whole GPUs and, per
(domain, model) group, the group's nodes sorted most usable first (then node priority) with the
running total. An admission re-sorts only the groups whose nodes changed.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from operator import neg

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.feasibility import eligible_nodes
from xirang_platform.scheduling.model import GpuSlice, NodeShare, Placement, Request, whole_gpu_slices
from xirang_platform.scheduling.preference import first_in_order
from xirang_platform.scheduling.state import ClusterState


def per_gpu_share(request: Request) -> tuple[int, int]:
    """CPU milli and memory MiB a gang holds per GPU on each node it spans (rounded up)."""
    return math.ceil(request.cpu_milli / request.gpus), math.ceil(request.memory_mib / request.gpus)


def usable_whole_gpus(
    state: ClusterState, request: Request, eligible: np.ndarray, rows: np.ndarray | slice = slice(None)
) -> np.ndarray:
    """Per node (of `rows`; `eligible` is over those rows too), how many whole free GPUs `request`
    could take there, CPU and memory included."""
    cpu, mem = per_gpu_share(request)
    whole = state.whole_free[rows]
    if cpu:
        whole = np.minimum(whole, state.cpu_free[rows] // cpu)
    if mem:
        whole = np.minimum(whole, state.mem_free[rows] // mem)
    return np.where(eligible, whole, 0)


def usable_on(request: Request, whole: int, cpu_free: int, mem_free: int) -> int:
    """`usable_whole_gpus` of one eligible node with `whole` whole free GPUs and that CPU and memory free."""
    cpu, mem = per_gpu_share(request)
    if cpu:
        whole = min(whole, cpu_free // cpu)
    if mem:
        whole = min(whole, mem_free // mem)
    return whole


def gang_placement(state: ClusterState, request: Request, taken: list[tuple[int, int]]) -> Placement:
    """The placement that takes `count` lowest-index whole free GPUs on each (node, count) of `taken`."""
    cpu, mem = per_gpu_share(request)
    slices: list[GpuSlice] = []
    shares: list[NodeShare] = []
    memory = request.gpu_memory_mib
    for node, count in taken:
        name = state.names[node]
        if state.whole_free.item(node) == state.gpu_count.item(node):  # every GPU free: the first `count`
            free: Iterable[int] = range(count)
        else:
            free = [g for g, milli in enumerate(state.gpu_free[node].tolist()) if milli == MILLI_PER_GPU][:count]
        slices.extend(whole_gpu_slices(name, free, memory))
        shares.append(NodeShare(name, cpu * count, mem * count))
    return Placement(tuple(slices), tuple(shares))


def take_span(
    state: ClusterState,
    request: Request,
    priority: np.ndarray,
    span_nodes: np.ndarray,
    span_usable: np.ndarray,
    node_count: int,
) -> Placement:
    """The gang on `node_count` nodes of one group (`span_nodes`, most usable first, then lowest
    priority, with their usable whole GPUs): all of the first `node_count - 1`, and for the rest the
    smallest remaining node that covers it (best fit), lowest priority on ties."""
    head = node_count - 1
    nodes, usable = span_nodes.tolist(), span_usable.tolist()
    taken = list(zip(nodes[:head], usable[:head], strict=True))
    rest = request.gpus - sum(usable[:head])
    if len(nodes) - head <= _SCALAR_SPAN:  # a group's few nodes: scalars beat array calls
        # The least usable, then the lowest priority, then the lowest index. The nodes that cover the
        # rest lead the tail (the span's order), the least usable of them last, lowest priority first.
        end = bisect_right(usable, -rest, lo=head, key=neg)
        start = bisect_left(usable, -usable[end - 1], lo=head, hi=end, key=neg)
        rank = priority.item
        lowest, last = rank(nodes[start]), nodes[start]
        for n in nodes[start + 1 : end]:
            if rank(n) != lowest:
                break
            last = min(last, n)
    else:
        tail_nodes, tail_usable = span_nodes[head:], span_usable[head:]
        fits = np.flatnonzero(tail_usable >= rest)
        smallest = fits[tail_usable[fits] == tail_usable[fits].min()]
        last = int(tail_nodes[smallest[np.argmin(priority[tail_nodes[smallest]])]])
    taken.append((last, rest))
    return gang_placement(state, request, sorted(taken))


_SCALAR_SPAN = 64


class GangGroups:
    """Per (domain, model) group, its nodes by usable whole GPUs for one kind of gang (see module)."""

    def __init__(self, state: ClusterState, request: Request, priority: np.ndarray) -> None:
        self.priority, self.request = priority, request
        self.eligible = eligible_nodes(state, request)
        self.usable = usable_whole_gpus(state, request, self.eligible)
        group = state.domain_id * (len(state.model_names) + 1) + state.model_id
        by_group = np.lexsort((priority, -self.usable, group))
        groups = group[by_group]
        self.starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
        self.ends = np.r_[self.starts[1:], len(groups)]
        self.segment_of = np.empty(len(groups), dtype=np.int64)
        self.segment_of[by_group] = np.repeat(np.arange(len(self.starts)), self.ends - self.starts)
        self.nodes = by_group  # segment after segment, each most usable first
        self.sorted_usable = self.usable[by_group]
        # Per node, its place in a segment's order as one number: most usable first, then the lowest
        # priority (its rank among the distinct priorities, so that equal priorities stay equal).
        rank = np.unique(priority, return_inverse=True)[1].reshape(-1) if len(priority) else priority
        self.distinct = int(rank.max(initial=0)) + 1
        self.rank = rank
        self.order_key = rank - self.usable * self.distinct
        # The running totals inside each segment, offset by segment: ascending over the whole array,
        # so one binary search finds where a segment's running total reaches a gang's size.
        self.span = int(state.gpu_count.max(initial=0)) * int((self.ends - self.starts).max()) + 1
        self.bounds = list(zip(self.starts.tolist(), self.ends.tolist(), strict=True))  # as ints, for slicing
        lengths = self.ends - self.starts
        running = np.cumsum(self.sorted_usable)
        running -= np.repeat(running[self.starts] - self.sorted_usable[self.starts], lengths)
        self.offset = np.arange(len(self.starts)) * self.span  # per segment, what `ranked` adds to its totals
        self.last = self.ends - 1
        self.ranked = running + np.repeat(self.offset, lengths)
        self.totals = running[self.ends - 1]  # per segment, its usable GPUs (less than `span`)
        self.first = self.sorted_usable[self.starts]  # per segment, its most usable node's GPUs

    def _resort(self, k: int) -> None:
        """Sort segment `k` again (stable: nodes equal in usable GPUs and priority keep their order)."""
        s, e = self.bounds[k]
        members = self.nodes[s:e]
        members = members[self.order_key[members].argsort(kind="stable")]
        self.nodes[s:e] = members
        usable = self.sorted_usable[s:e]
        usable[:] = self.usable[members]
        running = usable.cumsum()  # (array methods: numpy's functions wrap them in a Python call)
        np.add(running, k * self.span, out=self.ranked[s:e])
        self.totals[k] = running[-1]
        self.first[k] = usable[0]

    def update(self, state: ClusterState, rows: np.ndarray) -> None:
        """Re-read `rows` of `state` and re-sort the groups they belong to (none when the usable GPUs
        of these rows did not change: a share or a CPU-only pod on a node often leaves them)."""
        usable = usable_whole_gpus(state, self.request, self.eligible[rows], rows)
        moved = usable != self.usable[rows]
        rows = rows[moved]
        self.usable[rows] = usable[moved]
        self.order_key[rows] = self.rank[rows] - usable[moved] * self.distinct
        segments = set(self.segment_of[rows].tolist())
        for k in sorted(segments) if len(segments) > 1 else segments:
            self._resort(k)

    def first_in_order(self, ranks: np.ndarray, gpus: int) -> np.ndarray:
        """The segments of the model that comes first in the order (`ranks`, per node) among those
        that could hold a gang of `gpus` now (`preference`)."""
        by_segment = ranks[self.nodes[self.starts]]  # a segment's nodes share its model
        return first_in_order(self.totals >= gpus, by_segment)

    def place(
        self, state: ClusterState, request: Request, priority: np.ndarray, among: np.ndarray | None = None
    ) -> Placement | None:
        """`place_gang(..., by_group=True)`: the group needing the fewest nodes, then the least usable
        capacity, then the lowest group number; its most usable nodes, the last one best fit.
        `among`: the segments it may take (`first_in_order`; None: all)."""
        gpus, span = request.gpus, self.span
        first, totals = self.first, self.totals
        if among is not None:  # the other segments as if they had no usable GPU
            first, totals = np.where(among, first, 0), np.where(among, totals, 0)
        # Segments are in group order and argmin takes the first of equals: the lowest group number.
        # On one node if any group can (the fewest nodes there can be): the least usable capacity
        # decides; `span` is more than any group's capacity, so it marks the groups that cannot.
        capacity = np.where(first >= gpus, totals, span)
        pick, node_count = int(capacity.argmin()), 1
        if capacity.item(pick) == span:
            feasible = totals >= gpus
            freest = int(np.maximum.reduce(first, where=feasible, initial=0))
            if not freest:
                return None
            # A group needs at least ceil(gpus / its freest node) nodes, so no group needs fewer than
            # `least`. Those whose `least` most usable nodes hold the gang need the fewest nodes there
            # can be, and the least usable capacity among them decides; when none does, every
            # feasible group is counted. (What a group's first `least` nodes hold reaches the gang only
            # for a feasible group at least `least` nodes long: the rest are read at their last node.)
            least = -(-gpus // freest)
            held = self.ranked[np.minimum(self.starts + (least - 1), self.last)] - self.offset
            reached = held >= gpus
            if among is not None:
                reached &= among
            capacity = np.where(reached, totals, span)
            pick, node_count = int(capacity.argmin()), least
            if capacity.item(pick) == span:  # fewest nodes, then least usable capacity, then lowest group number
                counted = feasible.nonzero()[0]
                needed = self._nodes_needed(counted, gpus)
                best = int((needed * span + totals[counted]).argmin())
                pick, node_count = int(counted[best]), int(needed[best])
        s, e = self.bounds[pick]
        return take_span(state, request, priority, self.nodes[s:e], self.sorted_usable[s:e], node_count)

    def _nodes_needed(self, segments: np.ndarray, gpus: int) -> np.ndarray:
        """Per segment (each holding `gpus` in all), how many of its nodes, most usable first, hold `gpus`."""
        return self.ranked.searchsorted(segments * self.span + gpus) - self.starts[segments] + 1


def gang_groups(state: ClusterState, request: Request, priority: np.ndarray) -> GangGroups:
    """The index for `request`'s kind of gang as of `state` (built once, then kept in sync)."""
    eligibility = (request.gpu_models, request.min_compute_level, request.gpu_memory_mib)
    key = ("gang groups", per_gpu_share(request), eligibility, id(priority))
    index = state.derived.synced(
        state, key, lambda: GangGroups(state, request, priority), lambda found, rows: found.update(state, rows)
    )
    if index.priority is not priority:  # another array under a reused id: start again
        index = GangGroups(state, request, priority)
    return index
