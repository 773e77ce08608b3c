"""GPU fragmentation as FGD measures it (Weng et al., USENIX ATC '23), vectorized over nodes.

A node's fragmentation F is the GPU milli that a random pod of the *typical workload* could not use
there, in expectation: F = sum_j p_j f_j, where for each typical shape j (cpu c_j, milli per GPU
m_j, GPU count k_j, allowed GPU models) f_j is
- the node's free GPU milli when the shape cannot run there (too little CPU, too few GPUs with
  m_j free, a GPU model it may not use) or asks for no GPU;
- otherwise the free milli of the GPUs with less than m_j free (the slivers it cannot use).
The reference is FGD's public simulator (github.com/hkust-adsl/kubernetes-scheduler-simulator at
commit 8f3d641, `pkg/utils/frag.go`); `tests/scheduling/test_scoring.py` pins its numbers.

The *fill measure* (`unusable_after_*`, ours) asks how many pods of each typical shape the node's
free GPUs and CPU would take, not whether one would: f_j is the free GPU milli left over after
filling the node with shape j alone. `scorers.Xirang` blends the two.

`memo.ContentMemo` memoizes, per node *content* (free CPU and the per-GPU free milli vector), the
score each pod shape gets there; content keys make it safe across state copies. Which typical shapes
a node's kind (`NodeKind`: GPU model, GPU count, CPU capacity) could host, and how much each weighs
there, is part of its content (`access`, one row per kind: the *access class*).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.model import Request


@dataclass(frozen=True)
class TypicalWorkload:
    """The pod shapes FGD expects to arrive, with their probabilities (summing to 1).

    Arrays are aligned: `cpu` (milli-cores), `milli` (per GPU, 0 for CPU-only), `gpus` (count),
    `prob`; `models` holds each shape's allowed GPU models (empty: any model; `()` for all shapes:
    none constrained).
    """

    cpu: np.ndarray
    milli: np.ndarray
    gpus: np.ndarray
    prob: np.ndarray
    models: tuple[frozenset[str], ...] = ()

    def __post_init__(self) -> None:
        n = len(self.prob)
        if n == 0 or not (len(self.cpu) == len(self.milli) == len(self.gpus) == n):
            raise ValueError("a typical workload needs at least one shape and aligned cpu/milli/gpus/prob arrays")
        if self.models and len(self.models) != n:
            raise ValueError(f"a typical workload needs one model set per shape, got {len(self.models)} for {n}")
        if np.any(self.prob < 0) or not np.isclose(self.prob.sum(), 1.0):
            raise ValueError(f"typical workload probabilities must be >= 0 and sum to 1, got sum {self.prob.sum()}")

    @classmethod
    def from_requests(
        cls, requests: Iterable[Request], coverage: float = 0.95, weight: str = "count"
    ) -> TypicalWorkload:
        """The most frequent shapes (cpu, milli per GPU, GPU count, allowed GPU models) that together
        cover `coverage` of the requests, renormalized; the shape that crosses the line is kept (FGD's
        `GetTypicalPods`, which groups by GPU type too).

        `weight="count"` weighs a shape by its number of requests (FGD); `weight="gpu"` by the GPU
        milli it asks in total (CPU-only shapes keep the weight of one GPU milli per request so they
        are not lost).
        """
        if weight not in ("count", "gpu"):
            raise ValueError(f"weight must be 'count' or 'gpu', got {weight!r}")
        counts: Counter[tuple[int, int, int, tuple[str, ...]]] = Counter()
        for r in requests:
            milli = r.milli_per_gpu if r.gpus else 0
            allowed = tuple(sorted(r.gpu_models)) if r.gpus else ()
            counts[(r.cpu_milli, min(milli, MILLI_PER_GPU), r.gpus, allowed)] += 1
        if not counts:
            raise ValueError("a typical workload needs at least one request")
        # Count descending, ties to the larger (cpu, milli, gpus), as FGD sorts.
        ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
        total = sum(counts.values())
        kept: list[tuple[tuple[int, int, int, tuple[str, ...]], int]] = []
        running = 0
        for shape, n in ranked:
            kept.append((shape, n))
            running += n
            if running >= coverage * total:
                break
        shapes = np.array([s[:3] for s, _ in kept], dtype=np.int64)
        models = tuple(frozenset(s[3]) for s, _ in kept)
        if weight == "count":
            w = np.array([n for _, n in kept], dtype=np.float64)
        else:
            w = np.array([n * max(1, s[1] * s[2]) for s, n in kept], dtype=np.float64)
        return cls(shapes[:, 0], shapes[:, 1], shapes[:, 2], w / w.sum(), models if any(models) else ())

    @classmethod
    def generic(cls) -> TypicalWorkload:
        """A workload for pools where none is known: whole GPUs 1/2/4/8 and halves/quarters of one,
        with modest CPU, equally likely."""
        shapes = [(4000, 250, 1), (4000, 500, 1), (8000, 1000, 1), (16000, 1000, 2), (32000, 1000, 4), (64000, 1000, 8)]
        arr = np.array(shapes, dtype=np.int64)
        return cls(arr[:, 0], arr[:, 1], arr[:, 2], np.full(len(shapes), 1 / len(shapes)))

    def __len__(self) -> int:
        return len(self.prob)

    def may_use(self, model: str | None) -> np.ndarray:
        """Which shapes may run on a node of GPU `model` (None: a node without GPUs), as a bool row."""
        if not self.models or model is None:
            return np.ones(len(self), dtype=bool)
        return np.array([not allowed or model in allowed for allowed in self.models])

    def may_host(self, kind: NodeKind) -> np.ndarray:
        """Which shapes a node of `kind` could ever host (empty): model allowed, enough GPUs and CPU."""
        return self.may_use(kind.model) & (self.gpus <= kind.gpus) & (self.cpu <= kind.cpu)

    def access(self, kind: NodeKind, gpus_per_kind: dict[NodeKind, int], rule: str = "fgd") -> np.ndarray:
        """How a node of `kind` weighs the shapes: rows (may use, weight), shape (2, shapes).

        `rule="fgd"` (FGD's repository): every shape keeps its probability; one that may not use
        the node's model counts the node's whole free GPU milli as fragment. `rule="demand"` (ours):
        only the shapes the node could ever host count (model allowed, GPU count and CPU capacity
        enough), each weighted by its probability over the GPUs of the nodes that could host it
        (`gpus_per_kind`): a pod that only a twentieth of the pool can host (a GPU model, or 120
        cores beside 8 GPUs) presses twenty times harder on each of those GPUs than one that fits
        anywhere; renormalized per kind, so a node's measure stays on the scale of one typical pod.
        """
        if rule == "fgd":
            return np.stack([self.may_use(kind.model), self.prob]).astype(np.float64)
        if rule != "demand":
            raise ValueError(f"access rule must be 'fgd' or 'demand', got {rule!r}")
        use = self.may_host(kind)
        total = sum(gpus_per_kind.values()) or 1
        reach = sum((self.may_host(k) * n for k, n in gpus_per_kind.items()), np.zeros(len(self)))
        weight = np.where(use, self.prob * total / np.where(reach > 0, reach, total), 0.0)
        if weight.sum() <= 0:
            weight = self.prob.copy()
        return np.stack([use.astype(np.float64), weight / weight.sum()])


@dataclass(frozen=True)
class NodeKind:
    """What a node could ever host, all a typical shape's access to it depends on: its GPU model
    (None without GPUs), GPU count and CPU capacity (milli-cores)."""

    model: str | None
    gpus: int
    cpu: int


def contention(wl: TypicalWorkload, model: str | None, gpus_per_model: dict[str, int]) -> float:
    """How hard the pods constrained to some GPU models press on one GPU of `model`: the sum over
    constrained shapes that may use it of probability / GPUs they may use (0 when none is constrained)."""
    if model is None:
        return 0.0
    total = 0.0
    for allowed, p in zip(wl.models, wl.prob, strict=False):
        if allowed and model in allowed:
            total += float(p) / max(1, sum(n for m, n in gpus_per_model.items() if m in allowed))
    return total


def weigh_shares(wl: TypicalWorkload, access: np.ndarray | None, nodes: int, factor: float) -> np.ndarray:
    """`access` (per node: may use, weight; None: every shape at its probability) with the weight of
    the GPU-share shapes (one GPU, part of it) multiplied by `factor` and the weights renormalized,
    per node: the measure a GPU share is placed by (`Xirang`'s `share_weight`). A node where no
    shape has weight keeps its weights. Shape (nodes, 2, shapes)."""
    if access is None:
        access = np.broadcast_to(np.stack([np.ones(len(wl)), wl.prob]), (nodes, 2, len(wl)))
    share = (wl.milli > 0) & (wl.milli < MILLI_PER_GPU)
    weight = access[..., 1, :] * np.where(share, factor, 1.0)
    total = weight.sum(axis=-1, keepdims=True)
    weight = np.where(total > 0, weight / np.where(total > 0, total, 1.0), access[..., 1, :])
    return np.stack([access[..., 0, :], weight], axis=-2)


def frag_parts(cpu: np.ndarray, left: np.ndarray, wl: TypicalWorkload) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node (rows of `left`, free milli per GPU) and typical shape: how many GPUs have the
    shape's milli free, and the free milli of the others; plus each node's free GPU milli."""
    ge = left[:, :, None] >= wl.milli[None, None, :]
    count = ge.sum(axis=1)
    below = np.einsum("ng,ngj->nj", left, ~ge)
    return count, below, left.sum(axis=1)


def frag_from_parts(
    cpu: np.ndarray,
    count: np.ndarray,
    below: np.ndarray,
    total: np.ndarray,
    wl: TypicalWorkload,
    access: np.ndarray | None = None,
) -> np.ndarray:
    """F per node from `frag_parts`-style pieces (broadcasting over any leading axes); `access`
    (per node: may use, weight; see `TypicalWorkload.access`) says which shapes may use each node's
    GPU model and how much each counts there (None: every shape, at its probability)."""
    fits = (count >= wl.gpus) & (cpu[..., None] >= wl.cpu) & (wl.milli > 0)
    if access is None:
        return np.where(fits, below, total[..., None]) @ wl.prob
    use, weight = access[..., 0, :], access[..., 1, :]
    f = np.where(fits & (use > 0), below, total[..., None])
    return (f * weight).sum(axis=-1)


def fragmentation(
    cpu: np.ndarray, left: np.ndarray, wl: TypicalWorkload, access: np.ndarray | None = None
) -> np.ndarray:
    """FGD's fragmentation F (milli-GPU) of each node, given free CPU `cpu` (n,), per-GPU free
    milli `left` (n, gpus) and which shapes may use each node's model `access` (n, shapes)."""
    count, below, total = frag_parts(cpu, left, wl)
    return frag_from_parts(cpu, count, below, total, wl, access)


def frag_after_share(
    cpu: np.ndarray, left: np.ndarray, req_cpu: int, milli: int, wl: TypicalWorkload, access: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """For a pod taking `milli` of one GPU and `req_cpu` CPU: F before (n,) and F after placing it on
    each GPU g (n, gpus); +inf where GPU g has less than `milli` free."""
    count, below, total = frag_parts(cpu, left, wl)
    before = frag_from_parts(cpu, count, below, total, wl, access)
    m = wl.milli[None, None, :]
    old = left[:, :, None]
    new = old - milli
    ge_old = old >= m
    ge_new = new >= m
    count2 = count[:, None, :] - ge_old + ge_new
    below2 = below[:, None, :] - np.where(ge_old, 0, old) + np.where(ge_new, 0, new)
    total2 = np.broadcast_to((total - milli)[:, None], left.shape)
    cpu2 = np.broadcast_to((cpu - req_cpu)[:, None], left.shape)
    after = frag_from_parts(cpu2, count2, below2, total2, wl, _per_gpu(access))
    return before, np.where(left >= milli, after, np.inf)


def frag_after_whole(
    cpu: np.ndarray, left: np.ndarray, req_cpu: int, gpus: int, wl: TypicalWorkload, access: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """For a pod taking `gpus` fully free GPUs (0 for CPU-only) and `req_cpu` CPU: F before and
    after, per node."""
    count, below, total = frag_parts(cpu, left, wl)
    before = frag_from_parts(cpu, count, below, total, wl, access)
    # The GPUs taken go from 1000 free (counted for every shape with milli > 0) to 0 (counted for none).
    count2 = count - gpus * (wl.milli > 0)
    after = frag_from_parts(cpu - req_cpu, count2, below, total - gpus * MILLI_PER_GPU, wl, access)
    return before, after


def _per_gpu(access: np.ndarray | None) -> np.ndarray | None:
    """`access` (n, 2, shapes) broadcast over a per-GPU axis: (n, 1, 2, shapes)."""
    return None if access is None else access[:, None]


def sigmoid_score(delta: np.ndarray) -> np.ndarray:
    """FGD's node score for a fragmentation increase `delta`: int(100 * sigmoid(-delta / 1000))."""
    with np.errstate(over="ignore"):
        return ((1.0 / (1.0 + np.exp(delta / 1000.0))) * 100.0).astype(np.int64)


def _units(left: np.ndarray, wl: TypicalWorkload) -> np.ndarray:
    """Per GPU and typical shape: how many pods of the shape the GPU's free milli holds (0 for CPU-only)."""
    m = np.maximum(wl.milli, 1)
    return np.where(wl.milli > 0, left[..., None] // m, 0)


def _unusable(
    cpu: np.ndarray,
    units: np.ndarray,
    total: np.ndarray,
    wl: TypicalWorkload,
    access: np.ndarray | None,
    multi_gpu: str = "count",
) -> np.ndarray:
    """Free GPU milli left over if the node were filled with each typical shape alone, weighted
    as `access` says; a shape that may not use the node's model leaves all of it.

    `multi_gpu="one"`: a multi-GPU shape asks only whether one pod fits (FGD's question), and then
    leaves only the partly used GPUs: whole GPUs it cannot fill go to smaller shapes."""
    pods = np.minimum(units // wl.gpus.clip(min=1), cpu[..., None] // np.maximum(wl.cpu, 1))
    taken = pods * wl.gpus * wl.milli
    if multi_gpu == "one":
        taken = np.where(wl.gpus > 1, np.where(pods >= 1, units * wl.milli, 0), taken)
    filled = total[..., None] - taken
    if access is None:
        return np.where(wl.milli > 0, filled, total[..., None]) @ wl.prob
    f = np.where((wl.milli > 0) & (access[..., 0, :] > 0), filled, total[..., None])
    return (f * access[..., 1, :]).sum(axis=-1)


def unusable_after_share(
    cpu: np.ndarray,
    left: np.ndarray,
    req_cpu: int,
    milli: int,
    wl: TypicalWorkload,
    access: np.ndarray | None = None,
    multi_gpu: str = "count",
) -> tuple[np.ndarray, np.ndarray]:
    """Like `frag_after_share` for the fill-alone measure: a node's free GPU milli that repeated
    pods of each typical shape could not take (CPU counted), before and after, per GPU."""
    per_gpu = _units(left, wl)
    units = per_gpu.sum(axis=1)
    total = left.sum(axis=1)
    before = _unusable(cpu, units, total, wl, access, multi_gpu)
    units2 = units[:, None, :] - per_gpu + _units(np.maximum(left - milli, 0), wl)
    cpu2 = np.broadcast_to((cpu - req_cpu)[:, None], left.shape)
    total2 = np.broadcast_to((total - milli)[:, None], left.shape)
    after = _unusable(cpu2, units2, total2, wl, _per_gpu(access), multi_gpu)
    return before, np.where(left >= milli, after, np.inf)


def unusable_after_whole(
    cpu: np.ndarray,
    left: np.ndarray,
    req_cpu: int,
    gpus: int,
    wl: TypicalWorkload,
    access: np.ndarray | None = None,
    multi_gpu: str = "count",
) -> tuple[np.ndarray, np.ndarray]:
    """Like `frag_after_whole` for the fill-alone measure."""
    units = _units(left, wl).sum(axis=1)
    total = left.sum(axis=1)
    before = _unusable(cpu, units, total, wl, access, multi_gpu)
    full = _units(np.array([MILLI_PER_GPU]), wl)
    after = _unusable(cpu - req_cpu, units - gpus * full, total - gpus * MILLI_PER_GPU, wl, access, multi_gpu)
    return before, after
