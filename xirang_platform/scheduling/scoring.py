"""Node scorers: which feasible node, and which GPUs on it, a single-node request takes.

A scorer sees the feasible nodes (every one can hold the request) and picks one. Ties between
nodes go to the lowest `priority` value (a fixed order per pool: by name, or a seeded permutation,
as FGD's simulator does), so a replay reproduces exactly.

Registered policies (`make_scorer(name, **options)`):
- `bestfit`: the fullest node (least GPU, then CPU, left), fullest GPUs; `integer_score=True` uses
  FGD's repository score instead (int, GPU and CPU weighted 1:1 against 8 GPUs / 128 cores).
- `fgd`: fragmentation gradient descent, faithful to FGD's repository (needs `workload`).
- `xirang`: our policy, fragmentation-aware with best-fit tie-breaks (see `XirangScorer`).
- `random`: a uniform feasible node (seeded), for baselines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.fragmentation import (
    TypicalWorkload,
    frag_after_share,
    frag_after_whole,
    sigmoid_score,
    unusable_after_share,
    unusable_after_whole,
)
from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.state import ClusterState


class NodeScorer(Protocol):
    """Chooses a node among `nodes` (indices, ascending) and the GPUs on it for `request`.

    `need` is, per candidate node, the milli each GPU must give (the request's milli per GPU
    rounded up to the node's compute unit). Returns (node index, GPU indices); GPU indices are
    empty for a CPU-only request.
    """

    name: str

    def pick(
        self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray, priority: np.ndarray
    ) -> tuple[int, tuple[int, ...]]: ...


def best_fit_gpus(free: np.ndarray, count: int, need: int) -> tuple[int, ...]:
    """The `count` fullest GPUs of one node that still have `need` free, lowest index on ties."""
    order = np.lexsort((np.arange(len(free)), free))  # ascending free, then index
    chosen = [int(g) for g in order if free[g] >= need][:count]
    return tuple(sorted(chosen))


def first_free_gpus(free: np.ndarray, count: int) -> tuple[int, ...]:
    """The `count` lowest-index fully free GPUs of one node (FGD's rule for whole-GPU pods)."""
    return tuple(int(g) for g in np.flatnonzero(free >= MILLI_PER_GPU)[:count])


def _lowest_priority(candidates: np.ndarray, priority: np.ndarray) -> int:
    return int(candidates[np.argmin(priority[candidates])])


class BestFit:
    """The fullest node that fits, fullest GPUs.

    Default: least GPU milli left after placing, then least CPU left, then node priority.
    `integer_score=True`: FGD's repository BestFit, int(100 * (1 - 0.5 cpu_left/128000 -
    0.5 gpu_left/8000)), ties to node priority; coarse, so priority decides more often.
    """

    name = "bestfit"

    def __init__(self, integer_score: bool = False) -> None:
        self.integer_score = integer_score

    def pick(
        self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray, priority: np.ndarray
    ) -> tuple[int, tuple[int, ...]]:
        gpu_left = state.gpu_free[nodes].sum(axis=1) - request.gpus * need
        cpu_left = state.cpu_free[nodes] - request.cpu_milli
        if self.integer_score:
            waste = cpu_left / 128000 * 0.5 + gpu_left / 8000 * 0.5
            score = ((1.0 - waste) * 100.0).astype(np.int64)
            best = np.flatnonzero(score == score.max())
            k = best[np.argmin(priority[nodes[best]])]
        else:
            k = np.lexsort((priority[nodes], cpu_left, gpu_left))[0]
        node = int(nodes[k])
        if request.gpus == 0:
            return node, ()
        return node, best_fit_gpus(state.gpu_free[node], request.gpus, int(need[k]))


class RandomFit:
    """A uniform feasible node and, for a GPU share, a uniform GPU that fits (seeded)."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def pick(
        self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray, priority: np.ndarray
    ) -> tuple[int, tuple[int, ...]]:
        k = int(self.rng.integers(len(nodes)))
        node = int(nodes[k])
        if request.gpus == 0:
            return node, ()
        fitting = np.flatnonzero(state.gpu_free[node] >= need[k])
        if request.gpus == 1 and request.milli_per_gpu < MILLI_PER_GPU:
            return node, (int(self.rng.choice(fitting)),)
        return node, tuple(int(g) for g in fitting[: request.gpus])


# evaluate(cpu (M,), left (M, G), req_cpu, need, gpus) -> (score (M,) float, gpu choice (M,) int)
Evaluator = Callable[[np.ndarray, np.ndarray, int, int, int], tuple[np.ndarray, np.ndarray]]


class ContentMemo:
    """Per node content (free CPU, per-GPU free milli), the score and GPU choice of each pod shape.

    Content ids are interned by value, so the memo stays correct across state copies and pools. It
    remembers the last `VIEWS` states it saw (a cycle alternates between the live state and an empty
    pool when it checks whether a request could ever fit) and re-reads only the nodes that changed
    since the closest one.
    """

    MAX_CONTENTS = 400_000
    VIEWS = 2

    def __init__(self, evaluate: Evaluator) -> None:
        self.evaluate = evaluate
        self._clear(0)

    def _clear(self, width: int) -> None:
        self._ids: dict[bytes, int] = {}
        self._cpu = np.zeros(0, dtype=np.int64)
        self._left = np.zeros((0, width), dtype=np.int64)
        self._tables: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._views: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (cpu, gpu, ids), latest last

    def node_ids(self, state: ClusterState) -> np.ndarray:
        """The content id of every node of `state`."""
        cpu, gpu = state.cpu_free, state.gpu_free
        if len(self._ids) > self.MAX_CONTENTS or self._left.shape[1] != gpu.shape[1]:
            self._clear(gpu.shape[1])
        best: tuple[int, np.ndarray] | None = None
        for k, (seen_cpu, seen_gpu, _) in enumerate(self._views):
            if seen_gpu.shape == gpu.shape:
                changed = np.flatnonzero((cpu != seen_cpu) | (gpu != seen_gpu).any(axis=1))
                if best is None or len(changed) < len(best[1]):
                    best = (k, changed)
        if best is None:
            changed, view = np.arange(len(cpu)), (cpu, gpu, np.zeros(len(cpu), dtype=np.int64))
        else:
            changed, view = best[1], self._views.pop(best[0])
        ids = view[2]
        if len(changed):
            ids = ids.copy()
            new_cpu, new_left = [], []
            for i in changed:
                key = cpu[i].tobytes() + gpu[i].tobytes()
                cid = self._ids.get(key)
                if cid is None:
                    cid = len(self._ids)
                    self._ids[key] = cid
                    new_cpu.append(cpu[i])
                    new_left.append(gpu[i])
                ids[i] = cid
            if new_cpu:
                self._cpu = np.concatenate([self._cpu, np.array(new_cpu, dtype=np.int64)])
                self._left = np.concatenate([self._left, np.array(new_left, dtype=np.int64)])
            view = (cpu.copy(), gpu.copy(), ids)
        self._views.append(view)
        del self._views[: -self.VIEWS]
        return ids

    def lookup(self, shape: tuple[int, int, int], cids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Score and GPU choice of pod `shape` (cpu, milli per GPU, GPUs) on contents `cids`."""
        score, choice = self._tables.get(shape, (None, None))
        n = len(self._ids)
        if score is None or len(score) < n:
            grown_s = np.full(max(n, 2 * (0 if score is None else len(score))), np.nan)
            grown_c = np.full(len(grown_s), -1, dtype=np.int64)
            if score is not None:
                grown_s[: len(score)] = score
                grown_c[: len(choice)] = choice
            score, choice = grown_s, grown_c
            self._tables[shape] = (score, choice)
        got = score[cids]
        missing = np.unique(cids[np.isnan(got)])
        if len(missing):
            s, c = self.evaluate(self._cpu[missing], self._left[missing], *shape)
            score[missing] = s
            choice[missing] = c
            got = score[cids]
        return got, choice[cids]


def _is_share(request: Request, need: int) -> bool:
    return request.gpus == 1 and need < MILLI_PER_GPU


class FGD:
    """Fragmentation gradient descent, as FGD's repository scores it.

    Node score int(100 * sigmoid(-dF / 1000)) where dF is the node's fragmentation increase
    (`fragmentation.py`); a GPU share tries every GPU that fits and keeps the best score, first
    index on ties; whole GPUs are the lowest-index free ones; node ties go to the lowest priority.
    """

    name = "fgd"

    def __init__(self, workload: TypicalWorkload | None = None) -> None:
        self.workload = workload or TypicalWorkload.generic()
        self.memo = ContentMemo(self._evaluate)

    def _evaluate(self, cpu: np.ndarray, left: np.ndarray, req_cpu: int, need: int, gpus: int):
        if gpus == 1 and need < MILLI_PER_GPU:
            before, after = frag_after_share(cpu, left, req_cpu, need, self.workload)
            per_gpu = np.where(np.isinf(after), -1, sigmoid_score(after - before[:, None]))
            choice = per_gpu.argmax(axis=1)  # first index on ties
            return per_gpu.max(axis=1).astype(np.float64), choice
        before, after = frag_after_whole(cpu, left, req_cpu, gpus, self.workload)
        return sigmoid_score(after - before).astype(np.float64), np.full(len(cpu), -1)

    def pick(
        self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray, priority: np.ndarray
    ) -> tuple[int, tuple[int, ...]]:
        score, choice, needs = _memo_scores(self.memo, state, request, nodes, need)
        best = nodes[score == score.max()]
        node = _lowest_priority(best, priority)
        return node, _gpus_for(state, request, node, choice[np.searchsorted(nodes, node)], needs)


def _memo_scores(
    memo: ContentMemo, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Memoized (score, GPU choice) of `request` on each candidate node, and the need per node."""
    cids = memo.node_ids(state)[nodes]
    needs = np.broadcast_to(need, nodes.shape)
    gpus = request.gpus
    if gpus == 0 or np.all(needs == needs[0]):
        m = int(needs[0]) if gpus else 0
        score, choice = memo.lookup((request.cpu_milli, m, gpus), cids)
        return score, choice, needs
    score = np.empty(len(nodes))
    choice = np.empty(len(nodes), dtype=np.int64)
    for m in np.unique(needs):  # nodes with different compute units: one shape per unit size
        sel = needs == m
        score[sel], choice[sel] = memo.lookup((request.cpu_milli, int(m), gpus), cids[sel])
    return score, choice, needs


def _gpus_for(state: ClusterState, request: Request, node: int, choice: int, needs: np.ndarray) -> tuple[int, ...]:
    if request.gpus == 0:
        return ()
    if choice >= 0:
        return (int(choice),)
    return first_free_gpus(state.gpu_free[node], request.gpus)


class Xirang:
    """Our placement policy: FGD's score on a blended fragmentation measure, consolidating ties.

    - Measure (`measure`): "fgd" is FGD's F (the free GPU milli a typical pod could not use, if
      one typical pod fits there, else all of it); "fit" is the free GPU milli left over when the
      node is filled with as many pods of each typical shape as its GPUs and CPU take; "blend"
      (default) is `(1 - fit_weight) * fgd + fit_weight * fit`. FGD's measure asks whether one pod
      fits, the fill measure how many: blended, shares stop stranding CPU or whole GPUs.
    - Score: FGD's int(100 * sigmoid(-dF / 1000)) (`score="int"`); `"float"` ranks by the exact -dF,
      which measured worse: the coarse score leaves ties that the tie-breaks below turn into packing.
    - Node ties, a comma list of `_TIE_KEYS` (smallest first), node priority last: GPU requests
      (`tie`) take nodes already in use before untouched ones, keeping whole nodes for requests
      that need one; CPU-only requests (`cpu_only_tie`) take the node with the least free GPU milli,
      then the least free CPU: their CPU goes where GPU requests no longer need it.
    - GPU choice: a share takes the best-scoring GPU, the fullest on ties (`gpu_tie="bestfit"`) or
      the first index (`"first"`); whole GPUs are the lowest-index free ones.
    Without a workload, F is measured against `TypicalWorkload.generic()`.
    """

    name = "xirang"

    def __init__(
        self,
        workload: TypicalWorkload | None = None,
        measure: str = "blend",
        fit_weight: float = 0.65,
        score: str = "int",
        tie: str = "untouched_last,priority",
        cpu_only_tie: str = "gpu_left,cpu_left,priority",
        gpu_tie: str = "bestfit",
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
        unknown = [k for k in keys + cpu_keys if k not in _TIE_KEYS]
        if unknown:
            raise ValueError(f"xirang tie keys {unknown} are unknown; use a comma list of {sorted(_TIE_KEYS)}")
        self.workload = workload or TypicalWorkload.generic()
        self.weight = {"fgd": 0.0, "fit": 1.0, "blend": fit_weight}[measure]
        self.score, self.tie, self.cpu_only_tie, self.gpu_tie = score, keys, cpu_keys, gpu_tie
        self.memo = ContentMemo(self._evaluate)

    def _measure(self, fgd_form, fit_form, *args) -> tuple[np.ndarray, np.ndarray]:
        """(before, after) of the blended measure."""
        if self.weight == 0.0:
            return fgd_form(*args)
        if self.weight == 1.0:
            return fit_form(*args)
        (b1, a1), (b2, a2) = fgd_form(*args), fit_form(*args)
        w = self.weight
        return (1 - w) * b1 + w * b2, (1 - w) * a1 + w * a2

    def _value(self, delta: np.ndarray) -> np.ndarray:
        if self.score == "int":
            return sigmoid_score(delta).astype(np.float64)
        return -np.round(delta, 6)  # rounded so that float noise does not break real ties

    def _evaluate(self, cpu: np.ndarray, left: np.ndarray, req_cpu: int, need: int, gpus: int):
        if gpus == 1 and need < MILLI_PER_GPU:
            before, after = self._measure(
                frag_after_share, unusable_after_share, cpu, left, req_cpu, need, self.workload
            )
            fits = np.isfinite(after)
            value = np.where(fits, self._value(np.where(fits, after, 0.0) - before[:, None]), -np.inf)
            best = value.max(axis=1)
            if self.gpu_tie == "first":
                choice = value.argmax(axis=1)
            else:
                choice = np.where(value == best[:, None], left, np.iinfo(np.int64).max).argmin(axis=1)
            return best, choice
        before, after = self._measure(frag_after_whole, unusable_after_whole, cpu, left, req_cpu, gpus, self.workload)
        return self._value(after - before), np.full(len(cpu), -1)

    def pick(
        self, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray, priority: np.ndarray
    ) -> tuple[int, tuple[int, ...]]:
        score, choice, needs = _memo_scores(self.memo, state, request, nodes, need)
        top = np.flatnonzero(score == score.max())
        k = top[0]
        if len(top) > 1:
            cand = nodes[top]
            keys = self.cpu_only_tie if request.gpus == 0 else self.tie
            columns = [_TIE_KEYS[key](state, cand, priority) for key in reversed(keys)]
            k = top[np.lexsort([priority[cand], *columns])[0]]
        node = int(nodes[k])
        return node, _gpus_for(state, request, node, int(choice[k]), needs)


def _free_gpu_milli(st: ClusterState, c: np.ndarray, p: np.ndarray | None = None) -> np.ndarray:
    return st.gpu_free[c].sum(axis=1)


# Tie-break keys (smaller wins) over candidate nodes `c`; the variants measured are in the bench notes.
_TIE_KEYS: dict[str, Callable[[ClusterState, np.ndarray, np.ndarray], np.ndarray]] = {
    "priority": lambda st, c, p: p[c],
    "gpu_left": _free_gpu_milli,
    "cpu_left": lambda st, c, p: st.cpu_free[c],
    "untouched_last": lambda st, c, p: (
        (st.cpu_free[c] == st.cpu_capacity[c]) & (_free_gpu_milli(st, c) == st.gpu_count[c] * MILLI_PER_GPU)
    ).astype(np.int64),
    "free_whole": lambda st, c, p: (st.gpu_free[c] >= MILLI_PER_GPU).sum(axis=1),
    "neg_free_whole": lambda st, c, p: -(st.gpu_free[c] >= MILLI_PER_GPU).sum(axis=1),
    "gpu_count": lambda st, c, p: st.gpu_count[c],
    "neg_gpu_count": lambda st, c, p: -st.gpu_count[c],
    "cpu_per_gpu": lambda st, c, p: st.cpu_capacity[c] // np.maximum(st.gpu_count[c], 1),
    "neg_cpu_per_gpu": lambda st, c, p: -(st.cpu_capacity[c] // np.maximum(st.gpu_count[c], 1)),
}


_SCORERS: dict[str, type] = {"bestfit": BestFit, "fgd": FGD, "random": RandomFit, "xirang": Xirang}


def make_scorer(name: str, **options: object) -> NodeScorer:
    """The scorer registered as `name`, built with `options`."""
    try:
        cls = _SCORERS[name]
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r}; choose one of {sorted(_SCORERS)}") from None
    return cls(**options)


def scorer_for(policy: str, requests: Sequence[Request], seed: int = 0, **bestfit: object) -> NodeScorer:
    """The scorer `policy` names, built for a known workload: `fgd` and `xirang` get the typical
    workload of `requests`, `random` is seeded with `seed`, `bestfit` takes `bestfit` options."""
    if policy in ("fgd", "xirang"):
        return make_scorer(policy, workload=TypicalWorkload.from_requests(requests))
    if policy == "random":
        return make_scorer("random", seed=seed)
    if policy == "bestfit":
        return make_scorer("bestfit", **bestfit)
    return make_scorer(policy)  # an unknown name: make_scorer says which ones exist


def register(name: str, cls: type) -> None:
    """Make a scorer class available to `make_scorer` under `name`."""
    _SCORERS[name] = cls
