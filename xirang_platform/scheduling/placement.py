"""Per-tier placement rules (DESIGN.md section 4) over a `ClusterState`.

- Single-node requests (every P0 request, pods, anything on one GPU): among the feasible nodes, those
  that round the request up to the fewest compute units (least rounding waste) go to the node
  scorer, which picks the node and the GPUs (best-fit packing by default). A GPU without the
  request's GPU memory free is never picked.
- P1 gangs: whole GPUs of one model in one interconnect domain, on the fewest nodes.
- P2 gangs: P1's rule when it fits, else a heterogeneous mix of free whole GPUs, fewest nodes first.

Where the state carries a GPU model order for the request's tier (`preference`), single-node and
P1-rule placements keep to the nodes (groups) of the first model in the order that can host the
request now, and the rule above decides among those; the heterogeneous mix ignores the order.

`max_milli` (the request's quota headroom) rules out placements that would hold more GPU milli
than that once rounded to compute units. Every function returns a `Placement` or None; none of
them changes the state. Every GPU slice carries the request's GPU memory per GPU.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.derived import FEW_ROWS
from xirang_platform.scheduling.feasibility import (
    capacity_fit,
    eligible_nodes,
    fit_mask,
    row_fits,
    single_node_fit,
    unit_rounded,
)
from xirang_platform.scheduling.gang_groups import gang_groups, take_span, usable_whole_gpus
from xirang_platform.scheduling.model import GpuSlice, NodeShare, Placement, Request
from xirang_platform.scheduling.preference import first_in_order
from xirang_platform.scheduling.scorers import NodeLocalScorer, NodeScorer, is_node_local
from xirang_platform.scheduling.state import ClusterState


def model_ranks(state: ClusterState, request: Request) -> np.ndarray | None:
    """Per node, the place of its GPU model in the order for `request`'s tier (`state.gpu_model_order`;
    models not listed after every listed one, all alike); None where the order changes nothing: no
    order for the tier, none of its models in the pool, or a request without GPUs (read-only)."""
    order = state.gpu_model_order
    if not order.by_tier or not request.gpus:
        return None
    models = order.models_for(request.tier)
    if not models:
        return None

    def ranks() -> np.ndarray | None:
        place = {m: k for k, m in enumerate(models)}
        # Indexed by model id; the last entry is for nodes without GPUs (model id -1).
        by_model = np.array([place.get(m, len(models)) for m in state.model_names] + [len(models)], dtype=np.int64)
        found = by_model[state.model_id]
        found.setflags(write=False)
        return found if (found != len(models)).any() else None

    return state.static_fact(("model ranks", models), ranks)


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
    ranks = model_ranks(state, request)
    if is_single_node(request):
        if is_node_local(scorer) and not state.partial:
            return place_by_node_scores(state, request, scorer, priority, allowed, max_milli, ranks)
        eligible = _eligible(state, request, allowed)
        return place_single_node(state, request, scorer, priority, eligible, max_milli, ranks)
    if max_milli is not None and request.total_milli > max_milli:
        return None  # a gang takes whole GPUs: it holds exactly its total
    return _place_gang_by_tier(state, request, priority, allowed, ranks)


def fits(state: ClusterState, request: Request, priority: np.ndarray) -> bool:
    """Whether `request` could be placed now anywhere (no scoring: only the answer yes or no)."""
    request = as_placed(request)
    if is_single_node(request):
        if not state.partial:
            return bool(fit_mask(state, request).any())
        return len(single_node_fit(state, request)) > 0
    return _place_gang_by_tier(state, request, priority, None, None) is not None


def _eligible(state: ClusterState, request: Request, allowed: np.ndarray | None) -> np.ndarray:
    eligible = eligible_nodes(state, request)
    return eligible if allowed is None else eligible & allowed


def _place_gang_by_tier(
    state: ClusterState, request: Request, priority: np.ndarray, allowed: np.ndarray | None, ranks: np.ndarray | None
) -> Placement | None:
    """P1's gang rule (on the first model of `ranks`' order that can host it; None: any model); for
    P2, a heterogeneous mix when that fails."""
    if allowed is None and not state.partial:
        index = gang_groups(state, request, priority)
        among = index.first_in_order(ranks, request.gpus) if ranks is not None else None
        found = index.place(state, request, priority, among)
    else:
        eligible = _eligible(state, request, allowed)
        found = place_gang(state, request, priority, eligible, by_group=True, ranks=ranks)
    if found is None and request.tier.rules.mixed_fallback:
        found = place_gang(state, request, priority, _eligible(state, request, allowed), by_group=False)
    return found


def place_single_node(
    state: ClusterState,
    request: Request,
    scorer: NodeScorer,
    priority: np.ndarray,
    eligible: np.ndarray,
    max_milli: int | None = None,
    ranks: np.ndarray | None = None,
) -> Placement | None:
    """The scorer's choice among the nodes that can hold all of `request` alone, within `max_milli`
    once rounded, on the model that comes first in `ranks`' order among them (None: any model),
    with the least rounding waste."""
    nodes = single_node_fit(state, request, eligible)
    if len(nodes) == 0:
        return None
    if not request.gpus:
        node, _ = scorer.pick(state, request, nodes, np.zeros(len(nodes), np.int64), priority)
        return _single_placement(state, request, node, (), 0)
    need = unit_rounded(state, request.milli_per_gpu)[nodes]
    if ranks is None:
        keep = need == need.min() if max_milli is None else need * request.gpus <= max_milli
        if max_milli is not None and keep.any():
            keep &= need == need[keep].min()
    else:
        keep = need * request.gpus <= max_milli if max_milli is not None else np.ones(len(nodes), dtype=bool)
        keep = first_in_order(keep, ranks[nodes])
        if keep.any():
            keep &= need == need[keep].min()
    if not keep.all():
        nodes, need = nodes[keep], need[keep]
        if len(nodes) == 0:
            return None
    view = state.with_memory_for(request.gpu_memory_mib)
    node, gpus = scorer.pick(view, request, nodes, need, priority)
    return _single_placement(state, request, node, gpus, int(need[np.searchsorted(nodes, node)]))


def place_by_node_scores(
    state: ClusterState,
    request: Request,
    scorer: NodeLocalScorer,
    priority: np.ndarray,
    allowed: np.ndarray | None = None,
    max_milli: int | None = None,
    ranks: np.ndarray | None = None,
) -> Placement | None:
    """`place_single_node` for a scorer whose scores are node-local: the same choice, from scores
    kept per request shape and recomputed only on the nodes that changed since the last call.

    The scorer picks among the feasible nodes with the top score, as it would among all of them.
    """
    if not request.gpus:
        rounded, view = np.zeros(len(state.names), dtype=np.int64), state
    else:
        rounded, view = unit_rounded(state, request.milli_per_gpu), state.memory_view(request.gpu_memory_mib)
    eligible = eligible_nodes(state, request)

    def compute(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row of `rows`: whether the request fits there (`fit_mask`), and its score (-inf if not)."""
        fits_here = eligible[rows] & capacity_fit(state, request, rows)
        out = np.full(len(rows), -np.inf)
        ok = rows if all(fits_here) else rows[fits_here]  # (a mask from a list costs more than the test)
        if len(ok):
            out[fits_here] = scorer.node_scores(view, request, ok, rounded[ok])
        return fits_here, out

    def update(found: TopScores, rows: np.ndarray) -> None:
        """`compute` of the changed `rows` into `found`; a few rows (what an admission changed) in scalars."""
        if len(rows) > FEW_ROWS:
            found.update(rows, *compute(rows))
            return
        listed = rows.tolist()
        fits_here = [eligible.item(r) and row_fits(state, request, r) for r in listed]
        ok = rows if all(fits_here) else rows[fits_here]  # (a mask from a list costs more than the test)
        scores = iter(scorer.node_scores(view, request, ok, rounded[ok]).tolist() if len(ok) else ())
        found.update_rows(listed, fits_here, [next(scores) if f else -np.inf for f in fits_here])

    ranking = view.derived.synced(
        view, ("scores", scorer, request.shape), lambda: TopScores(*compute(np.arange(len(state.names)))), update
    )
    fit = ranking.fit
    candidates = fit if allowed is None else fit & allowed
    if request.gpus:
        candidates = _least_rounding(state, request, candidates, rounded, max_milli, ranks)
    if candidates is fit:
        best, nodes = ranking.best, ranking.top
    else:
        ranked = np.where(candidates, ranking.scores, -np.inf)
        best = ranked.max()
        nodes = np.flatnonzero(ranked == best)
    if best == -np.inf:
        nodes = np.flatnonzero(candidates)
    if len(nodes) == 0:
        return None
    node, gpus = scorer.pick_top(view, request, nodes, rounded[nodes], priority)
    return _single_placement(state, request, node, gpus, rounded.item(node))


class TopScores:
    """Per node, whether one request shape fits there (`fit_mask`) and a node-local scorer's score of
    it (-inf where it does not fit), with the top score and the nodes that have it (ascending), kept
    up to date row by row: an admission costs the rows it changed, not a pass over the pool
    (`place_by_node_scores`).

    The maximum of every block of `BLOCK` rows is kept too: when the last top node drops, the next
    top score is the largest block maximum, and its nodes are looked for (on the blocks that hold
    it, not on every node) only when `top` is next read. Until then the rows that change often
    lower the top score again (other shapes' admissions), and nothing more is needed.
    """

    BLOCK = 64

    __slots__ = ("_top", "best", "block_max", "fit", "scores")

    def __init__(self, fit: np.ndarray, scores: np.ndarray) -> None:
        self.fit, self.scores = fit, scores
        self._top: np.ndarray | None = None  # None: to look for when read
        self.block_max = np.maximum.reduceat(scores, np.arange(0, len(scores), self.BLOCK)) if len(scores) else scores
        self._next_best()

    @property
    def top(self) -> np.ndarray:
        """The nodes with the top score `best` (ascending; none when nothing fits)."""
        if self._top is None:
            self._top = self._rank()
        return self._top

    def _next_best(self) -> None:
        """The top score from the block maxima (its nodes are looked for when `top` is read)."""
        self.best, self._top = float(self.block_max.max(initial=-np.inf)), None

    def _rank(self) -> np.ndarray:
        """The nodes with the top score, looked for on the blocks whose maximum it is."""
        best = self.best
        if best == -np.inf:
            return _NO_NODES
        blocks = np.flatnonzero(self.block_max == best)
        if len(blocks) * 4 > len(self.block_max):
            return np.flatnonzero(self.scores == best)
        rows = (blocks[:, None] * self.BLOCK + np.arange(self.BLOCK)).ravel()
        rows = rows[rows < len(self.scores)]
        return rows[self.scores[rows] == best]

    def update(self, rows: np.ndarray, fit: np.ndarray, new: np.ndarray) -> None:
        """Take the fit and scores `new` of `rows` (ascending)."""
        if len(rows) <= FEW_ROWS:
            self.update_rows(rows.tolist(), fit.tolist(), new.tolist())
            return
        self.fit[rows] = fit
        scores, size = self.scores, self.BLOCK
        scores[rows] = new
        for b in np.unique(rows // size).tolist():
            self.block_max[b] = scores[b * size : (b + 1) * size].max()
        high = float(new.max())
        if high > self.best:  # a new top score: only these rows can have it
            self.best, self._top = high, rows[new == high]
            return
        if self.best == -np.inf:
            return
        top = self._top
        if top is None:  # the top nodes are not known: only whether the top score is still held
            self._next_best()
            return
        at = np.searchsorted(top, rows)
        held = top[np.minimum(at, len(top) - 1)] == rows if len(top) else np.zeros(len(rows), dtype=bool)
        left = held & (new < self.best)
        joined = ~held & (new == self.best)
        if left.any():
            top = np.delete(top, at[left])
        if joined.any():
            top = np.insert(top, np.searchsorted(top, rows[joined]), rows[joined])
        self._top = top
        if len(top) == 0:
            self._next_best()  # the top score is gone

    def update_rows(self, rows: list[int], fit: list[bool], new: list[float]) -> None:
        """`update` of a few rows given as Python scalars (what most admissions change), one by one."""
        for row, fits_here, score in zip(rows, fit, new, strict=True):
            self.fit[row] = fits_here
            self._update_one(row, score)

    def _update_one(self, row: int, score: float) -> None:
        """`update` of one row, in scalars."""
        scores, block_max, size = self.scores, self.block_max, self.BLOCK
        old = scores.item(row)
        scores[row] = score
        b = row // size
        most = block_max.item(b)
        if score >= most:
            block_max[b] = score
        elif old == most:
            block_max[b] = scores[b * size : (b + 1) * size].max()
        best, top = self.best, self._top
        if score > best:
            self.best, self._top = score, np.array([row])
        elif best == -np.inf or (old == best) == (score == best):
            return  # not a top node before nor after, or one before and after
        elif old == best:  # a top node no more
            if top is None or len(top) == 1:
                self._next_best()  # the same top score if another node holds it (then found when read)
            else:
                k = int(top.searchsorted(row))
                self._top = np.concatenate((top[:k], top[k + 1 :]))
        elif top is not None:  # a top node now
            k = int(top.searchsorted(row))
            self._top = np.concatenate((top[:k], [row], top[k:]))


_NO_NODES = np.zeros(0, dtype=np.int64)
_NO_NODES.setflags(write=False)


def _least_rounding(
    state: ClusterState,
    request: Request,
    candidates: np.ndarray,
    rounded: np.ndarray,
    max_milli: int | None,
    ranks: np.ndarray | None = None,
) -> np.ndarray:
    """The candidates within `max_milli`, on the model first in `ranks`' order among them (None: any),
    that round the request up least (as `place_single_node`)."""
    uniform = state.static_fact(
        ("uniform rounding", request.milli_per_gpu), lambda: bool(rounded.min() == rounded.max())
    )
    if uniform:
        if max_milli is not None and len(rounded) and rounded[0] * request.gpus > max_milli:
            return np.zeros(len(candidates), dtype=bool)
        return candidates if ranks is None else first_in_order(candidates, ranks)
    if max_milli is not None:
        candidates = candidates & (rounded * request.gpus <= max_milli)
    if ranks is not None:
        candidates = first_in_order(candidates, ranks)
    if candidates.any():
        candidates = candidates & (rounded == rounded[candidates].min())
    return candidates


def _single_placement(state: ClusterState, request: Request, node: int, gpus: tuple[int, ...], milli: int) -> Placement:
    name = state.names[node]
    return Placement(
        slices=tuple([GpuSlice(name, g, milli, request.gpu_memory_mib) for g in gpus]),
        shares=(NodeShare(name, request.cpu_milli, request.memory_mib),),
    )


def place_gang(
    state: ClusterState,
    request: Request,
    priority: np.ndarray,
    eligible: np.ndarray,
    *,
    by_group: bool,
    ranks: np.ndarray | None = None,
) -> Placement | None:
    """Whole GPUs on the fewest nodes: inside one (domain, model) group when `by_group`, else anywhere.

    Among groups that can hold the gang (those of the model first in `ranks`' order among them, when
    given with `by_group`), the one needing the fewest nodes wins, then the one with the least usable
    capacity (best fit), then the lowest group number. Inside the group the nodes with the most
    usable GPUs are taken first, and the last node is the smallest that covers the rest.
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
    holds = totals >= request.gpus
    if ranks is not None and by_group:
        holds = first_in_order(holds, ranks[nodes_sorted[starts]])  # a group's nodes share its model
    feasible = np.flatnonzero(holds)
    if len(feasible) == 0:
        return None
    # Fewest nodes, then the least usable capacity (best fit), then the lowest group number.
    pick = feasible[np.lexsort((g_sorted[starts[feasible]], totals[feasible], nodes_needed[feasible]))[0]]
    s, end = int(starts[pick]), int(starts[pick] + lengths[pick])
    return take_span(state, request, priority, nodes_sorted[s:end], u_sorted[s:end], int(nodes_needed[pick]))
