"""Our placement policy: FGD's score on a blended fragmentation measure, consolidating ties."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.scorers.fragmentation import (
    NodeKind,
    TypicalWorkload,
    contention,
    frag_of_shares,
    frag_of_whole,
    share_states,
    sigmoid_score,
    unusable_of_shares,
    unusable_of_whole,
    weigh_shares,
    whole_states,
)
from xirang_platform.scheduling.scorers.memo import ContentMemo, lone_candidate_gpus, memo_scores
from xirang_platform.scheduling.state import ClusterState

# The share of the pods the typical workload covers (`TypicalWorkload.from_requests`; FGD's is 0.95).
# A shape only a few nodes can host (openb's 8-GPU, 120-core pods: 1% of the multi-GPU mixes' pods,
# only the 39 128-core nodes) falls under FGD's cut; kept, the demand rule weighs it on those nodes
# and they stay free for it (figures: docs/design-notes.md, record B4).
TYPICAL_COVERAGE = 0.99
_NO_GPU = np.iinfo(np.int64).max  # a GPU choice's sort key past every real one


class Xirang:
    """Our placement policy: FGD's score on a blended fragmentation measure, consolidating ties.

    - Measure (`measure`): "fgd" is FGD's F (the free GPU milli a typical pod could not use, if
      one typical pod fits there, else all of it); "fit" is the free GPU milli left over when the
      node is filled with as many pods of each typical shape as its GPUs and CPU take; "blend"
      (default) is `(1 - fit_weight) * fgd + fit_weight * fit`. FGD's measure asks whether one pod
      fits, the fill measure how many: blended, shares stop stranding CPU or whole GPUs.
    - How a share is measured (`share_weight`, default 50): the workload's GPU-share shapes (one GPU,
      part of it) weigh `share_weight` times their probability, renormalized (`weigh_shares`; 1 is
      FGD's weighting). What a share leaves beside it can only ever be used by other shares; at their
      probabilities the whole-GPU shapes (most of a mix) count the free milli of every partly used
      GPU as fragment alike, which dominates the measure, and the integer score then rounds away
      what matters to the shares that follow: whether what is left beside a share fits another one,
      and whether a node's CPU can still serve them. The whole-GPU shapes keep a voice where theirs
      is large: a share that takes a node's last fit for a multi-GPU shape turns all the node's free
      milli into fragment for it. Not infinite: shares weighed alone spread over empty nodes, which
      the 8-GPU pods then lack (figures: docs/design-notes.md, record B4).
    - Score: FGD's int(100 * sigmoid(-dF / 1000)) (`score="int"`); `"float"` ranks by the exact -dF.
      The coarse score is kept because it leaves ties that the tie-breaks below turn into packing.
    - Node ties, a comma list of `_TIE_KEYS` (smallest first), node priority last: GPU requests
      (`tie`) take nodes already in use before untouched ones, keeping whole nodes for requests
      that need one; CPU-only requests (`cpu_only_tie`) take the node with the least free GPU milli,
      then the least free CPU: their CPU goes where GPU requests no longer need it.
    - GPU choice: a share takes the best-scoring GPU, the fullest on ties (`gpu_tie="bestfit"`) or
      the first index (`"first"`); whole GPUs are the lowest-index free ones.
    - Which shapes count at a node (`access`): "demand" (default) counts only the shapes the node
      could ever host (its GPU model allowed by their `gpu_spec`, GPU count and CPU capacity
      enough), each weighted by its probability over the GPUs of the nodes that could host it
      (`TypicalWorkload.access`): a shape only a few nodes can host keeps those nodes free for it;
      "fgd" is FGD's rule (every shape, at its probability; one that may not use the node's model
      sees all free GPU as fragment). The `contention` tie key prefers the model constrained pods
      press least.
    - Off by default, kept as options (record B4): `whole_fit_weight` (a separate fill weight for
      whole-GPU and CPU-only requests) and `multi_gpu="one"` (multi-GPU shapes ask only whether one
      pod fits).
    Without a workload, F is measured against `TypicalWorkload.generic()`.
    """

    name = "xirang"

    def __init__(
        self,
        workload: TypicalWorkload | None = None,
        measure: str = "blend",
        fit_weight: float = 0.65,
        score: str = "int",
        tie: str = "contention,untouched_last,priority",
        cpu_only_tie: str = "gpu_left,cpu_left,contention,priority",
        gpu_tie: str = "bestfit",
        access: str = "demand",
        whole_fit_weight: float | None = None,
        multi_gpu: str = "count",
        share_weight: float = 50.0,
    ) -> None:
        keys, cpu_keys = tie.split(","), cpu_only_tie.split(",")
        if measure not in ("fgd", "fit", "blend"):
            raise ValueError(f"xirang measure must be 'fgd', 'fit' or 'blend', got {measure!r}")
        if not 0.0 <= fit_weight <= 1.0:
            raise ValueError(f"xirang fit_weight must be in 0..1, got {fit_weight}")
        if score not in ("int", "float"):
            raise ValueError(f"xirang score must be 'int' or 'float', got {score!r}")
        if gpu_tie not in ("first", "bestfit"):
            raise ValueError(f"xirang gpu_tie must be 'first' or 'bestfit', got {gpu_tie!r}")
        if access not in ("fgd", "demand"):
            raise ValueError(f"xirang access must be 'fgd' or 'demand', got {access!r}")
        if not share_weight > 0:
            raise ValueError(f"xirang share_weight must be > 0, got {share_weight}")
        unknown = [k for k in keys + cpu_keys if k not in _TIE_KEYS]
        if unknown:
            raise ValueError(f"xirang tie keys {unknown} are unknown; use a comma list of {sorted(_TIE_KEYS)}")
        self.workload = workload or TypicalWorkload.generic()
        self.weight = {"fgd": 0.0, "fit": 1.0, "blend": fit_weight}[measure]
        if multi_gpu not in ("count", "one"):
            raise ValueError(f"xirang multi_gpu must be 'count' or 'one', got {multi_gpu!r}")
        self.share_fill = partial(unusable_of_shares, multi_gpu=multi_gpu)
        self.whole_fill = partial(unusable_of_whole, multi_gpu=multi_gpu)
        self.whole_weight = self.weight if whole_fit_weight is None else whole_fit_weight
        self.score, self.tie, self.cpu_only_tie, self.gpu_tie = score, keys, cpu_keys, gpu_tie
        self._contention_of: tuple[tuple[str, ...], np.ndarray | None] | None = None
        self.access_rule = access
        # FGD's rule without constraints: every shape counts, at its probability (weighed up for shares).
        self.every_shape = access == "fgd" and not self.workload.models
        self.share_weight = share_weight
        self.memo = ContentMemo(
            self._evaluate,
            self._access_rows,
            gpu_order_free=gpu_tie == "bestfit",  # the fullest GPU among the best: not the GPUs' order
        )

    def _measure(self, w: float, fgd_form, fit_form, *args) -> tuple[np.ndarray, np.ndarray]:
        """(before, after) of the measure blended with fill weight `w`."""
        if w == 0.0:
            return fgd_form(*args)
        if w == 1.0:
            return fit_form(*args)
        (b1, a1), (b2, a2) = fgd_form(*args), fit_form(*args)
        return (1 - w) * b1 + w * b2, (1 - w) * a1 + w * a2

    def _value(self, delta: np.ndarray) -> np.ndarray:
        if self.score == "int":
            return sigmoid_score(delta).astype(np.float64)
        return -np.round(delta, 6)  # rounded so that float noise does not break real ties

    def _access_rows(self, kind: NodeKind, gpus_per_kind: dict[NodeKind, int]) -> np.ndarray:
        """A node class's rows (`ContentMemo`): how a node of `kind` weighs the shapes (`TypicalWorkload.access`)
        for whole GPUs and, beside them, for a GPU share (`weigh_shares`), shape (2, 2, shapes)."""
        row = self.workload.access(kind, gpus_per_kind, self.access_rule)
        shares = row if self.share_weight == 1.0 else weigh_shares(self.workload, row[None], 1, self.share_weight)[0]
        return np.stack([row, shares])

    def _evaluate(
        self, cpu: np.ndarray, left: np.ndarray, access: np.ndarray, req_cpu: int, need: int, gpus: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Score and GPU choice of the pod shape on each content (`ContentMemo`); `access` holds each
        content's class rows (`_access_rows`)."""
        if gpus == 1 and need < MILLI_PER_GPU:
            share_access = None if self.every_shape and self.share_weight == 1.0 else access[:, 1]
            share = share_states(cpu, left, req_cpu, need)
            before, after = self._measure(
                self.weight, frag_of_shares, self.share_fill, share, self.workload, share_access
            )
            # After is +inf on a GPU the share does not fit (a value voided here).
            value = np.where(share.fits, self._value(after - before[:, None]), -np.inf)
            best = value.max(axis=1)
            if self.gpu_tie == "first":
                choice = value.argmax(axis=1)
            else:
                choice = np.where(value == best[:, None], left, _NO_GPU).argmin(axis=1)
            return best, choice
        whole = whole_states(cpu, left, req_cpu, gpus)
        whole_access = None if self.every_shape else access[:, 0]
        before, after = self._measure(
            self.whole_weight, frag_of_whole, self.whole_fill, whole, self.workload, whole_access
        )
        return self._value(after - before), np.full(len(cpu), -1)

    def node_scores(self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray) -> np.ndarray:
        """Node-local (`NodeLocalScorer`): each node's score from its own content; `pick` takes a top one."""
        return memo_scores(self.memo, state, request, nodes, need)[0]

    def pick(
        self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray, priority: np.ndarray
    ) -> tuple[int, tuple[int, ...]]:
        """The top-scoring node of `nodes` (ties broken as `pick_top` does) and the GPUs on it."""
        if len(nodes) > 1:
            score, _, need = memo_scores(self.memo, state, request, nodes, need)
            top = score == score.max()
            nodes, need = nodes[top], need[top]
        return self.pick_top(state, request, nodes, need, priority)

    def pick_top(
        self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray, priority: np.ndarray
    ) -> tuple[int, tuple[int, ...]]:
        """`pick` among `nodes` that share the top score (`NodeLocalScorer`): only the ties to break."""
        if len(nodes) == 1:  # no tie (most admissions)
            node = nodes.item(0)
            return node, lone_candidate_gpus(self.memo, state, request, node, need.item(0))
        # Ties: the keys in turn, each keeping the candidates at its least value (what a lexsort over
        # all of them picks first, computed on ever fewer nodes), then the lowest priority.
        tied, at = nodes, None  # the candidates still tied and their positions in `nodes` (None: all)
        keys = self.cpu_only_tie if request.gpus == 0 else self.tie
        if keys[-1] == "priority":
            keys = keys[:-1]  # the lowest priority is taken after the keys anyway
        for key in keys:
            if len(tied) == 1:
                break
            if key == "contention":
                column = self._contention(state, tied)
                if column is None:
                    continue  # constrained pods press on every GPU model alike: no tie to break
            else:
                column = _TIE_KEYS[key](state, tied, priority)
            keep = column == column.min()
            if not keep.all():  # a key that splits no tie leaves the candidates as they are
                at = np.flatnonzero(keep) if at is None else at[keep]
                tied = tied[keep]
        first = int(np.argmin(priority[tied])) if len(tied) > 1 else 0
        k = first if at is None else int(at[first])
        node = int(nodes[k])
        return node, lone_candidate_gpus(self.memo, state, request, node, int(need[k]))

    def _contention(self, state: ClusterState, nodes: np.ndarray) -> np.ndarray | None:
        """Per node of `nodes`, how hard constrained typical pods press on its GPU model (`contention`);
        None when they press on every model of the pool alike (nodes without GPUs included)."""
        names = tuple(state.model_names)
        if self._contention_of is None or self._contention_of[0] != names:
            gpus = {m: int(state.gpu_count[state.model_id == k].sum()) for k, m in enumerate(names)}
            per_model = np.array([contention(self.workload, m, gpus) for m in names] + [0.0])
            self._contention_of = (names, None if (per_model == per_model[0]).all() else per_model)
        pressure = self._contention_of[1]
        return None if pressure is None else pressure[state.model_id[nodes]]


def _free_gpu_milli(st: ClusterState, c: np.ndarray, p: np.ndarray | None = None) -> np.ndarray:
    return st.free_milli[c]  # the per-node total the state keeps (the sum of its GPUs' free milli)


def _untouched(st: ClusterState, c: np.ndarray) -> np.ndarray:
    """Per node of `c`, whether nothing is allocated on it (all its CPU and every GPU free)."""
    most = len(c) * 4 > len(st.names)  # most of the pool (a tie of empty nodes): compared on every node, then read
    rows = slice(None) if most else c
    gpus_free = st.free_milli[rows] == st.gpu_count[rows] * MILLI_PER_GPU
    untouched = (st.cpu_free[rows] == st.cpu_capacity[rows]) & gpus_free
    return untouched[c] if most else untouched


# Tie-break keys (smaller wins) over candidate nodes `c`; variants beside the defaults: design-notes B4.
_TIE_KEYS: dict[str, Callable[[ClusterState, np.ndarray, np.ndarray], np.ndarray]] = {
    "priority": lambda st, c, p: p[c],
    "contention": lambda st, c, p: np.zeros(len(c)),  # computed by the scorer, which knows the workload
    "gpu_left": _free_gpu_milli,
    "cpu_left": lambda st, c, p: st.cpu_free[c],
    "untouched_last": lambda st, c, p: _untouched(st, c).astype(np.int64),
    "free_whole": lambda st, c, p: (st.gpu_free[c] >= MILLI_PER_GPU).sum(axis=1),
    "neg_free_whole": lambda st, c, p: -(st.gpu_free[c] >= MILLI_PER_GPU).sum(axis=1),
    "gpu_count": lambda st, c, p: st.gpu_count[c],
    "neg_gpu_count": lambda st, c, p: -st.gpu_count[c],
    "cpu_per_gpu": lambda st, c, p: st.cpu_capacity[c] // np.maximum(st.gpu_count[c], 1),
    "neg_cpu_per_gpu": lambda st, c, p: -(st.cpu_capacity[c] // np.maximum(st.gpu_count[c], 1)),
}
