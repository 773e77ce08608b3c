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

A pod's effect on a node is measured on the node's *states* taken at once, as it is and after the
pod (`ShareStates`: on each GPU in turn; `WholeStates`), the measure's rule applied once to all.

`memo.ContentMemo` memoizes, per node *content* (free CPU and the per-GPU free milli vector), the
score each pod shape gets there; content keys make it safe across state copies. Which typical shapes
a node's kind (`NodeKind`: GPU model, GPU count, CPU capacity) could host, and how much each weighs
there, is part of its content (`access`, one row per kind: the *access class*).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import NamedTuple

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

    @cached_property
    def has_gpu(self) -> np.ndarray:
        """Which shapes ask for GPU milli (not CPU-only)."""
        return self.milli > 0

    @cached_property
    def is_share(self) -> np.ndarray:
        """Which shapes are GPU shares (part of one GPU)."""
        return (self.milli > 0) & (self.milli < MILLI_PER_GPU)

    @cached_property
    def pod_milli(self) -> np.ndarray:
        """The GPU milli one pod of each shape takes in all."""
        return self.gpus * self.milli

    @cached_property
    def at_least_one(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Milli per GPU, GPU count and CPU per shape, each at least 1 (what pods are counted in)."""
        return np.maximum(self.milli, 1), self.gpus.clip(min=1), np.maximum(self.cpu, 1)

    @cached_property
    def whole_gpu_taken(self) -> tuple[np.ndarray, np.ndarray]:
        """What a whole GPU taken removes per shape in state 1 of `whole_states` (state 0: nothing),
        each (2, shapes): GPUs with the shape's milli free, and pods of it the GPUs hold (`_units`)."""
        count = np.stack([np.zeros(len(self), dtype=np.int64), self.has_gpu.astype(np.int64)])
        units = np.stack([np.zeros(len(self), dtype=np.int64), _units(np.array([MILLI_PER_GPU]), self)[0]])
        return count, units

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
    weight = access[..., 1, :] * np.where(wl.is_share, factor, 1.0)
    total = weight.sum(axis=-1, keepdims=True)
    weight = np.where(total > 0, weight / np.where(total > 0, total, 1.0), access[..., 1, :])
    return np.stack([access[..., 0, :], weight], axis=-2)


def frag_parts(cpu: np.ndarray, left: np.ndarray, wl: TypicalWorkload) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node (rows of `left`, free milli per GPU; any leading axes) and typical shape: how many
    GPUs have the shape's milli free, and the free milli of the others; plus each node's free GPU milli."""
    return (*_count_below(left, wl), left.sum(axis=-1))


def _count_below(left: np.ndarray, wl: TypicalWorkload) -> tuple[np.ndarray, np.ndarray]:
    """`frag_parts` but the free GPU milli."""
    ge, below = _gpu_parts(left, wl)
    return ge.sum(axis=-2), below.sum(axis=-2)


def _gpu_parts(left: np.ndarray, wl: TypicalWorkload) -> tuple[np.ndarray, np.ndarray]:
    """`frag_parts` of each GPU apart (..., gpus, shapes): whether it has the shape's milli free, and
    its free milli where not."""
    ge = left[..., None] >= wl.milli
    return ge, np.where(ge, 0, left[..., None])


def frag_terms(
    cpu: np.ndarray,
    count: np.ndarray,
    below: np.ndarray,
    total: np.ndarray,
    wl: TypicalWorkload,
    access: np.ndarray | None = None,
) -> np.ndarray:
    """f_j per node and typical shape from `frag_parts`-style pieces (broadcasting over any leading
    axes): the slivers where the shape fits, else all the free GPU milli."""
    fits = (count >= wl.gpus) & (cpu[..., None] >= wl.cpu) & wl.has_gpu
    if access is not None:
        fits = fits & (access[..., 0, :] > 0)
    return np.where(fits, below, total[..., None])


def expectation(terms: np.ndarray, wl: TypicalWorkload, access: np.ndarray | None = None) -> np.ndarray:
    """The per-shape `terms` weighed: at each shape's probability (`access` None), else at the
    weights `access` gives (per node: may use, weight; see `TypicalWorkload.access`)."""
    if access is None:
        return terms @ wl.prob
    return (terms * access[..., 1, :]).sum(axis=-1)


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
    return expectation(frag_terms(cpu, count, below, total, wl, access), wl, access)


def fragmentation(
    cpu: np.ndarray, left: np.ndarray, wl: TypicalWorkload, access: np.ndarray | None = None
) -> np.ndarray:
    """FGD's fragmentation F (milli-GPU) of each node, given free CPU `cpu` (n,), per-GPU free
    milli `left` (n, gpus) and which shapes may use each node's model `access` (n, shapes)."""
    count, below, total = frag_parts(cpu, left, wl)
    return frag_from_parts(cpu, count, below, total, wl, access)


class ShareStates(NamedTuple):
    """Nodes as they are (state 0) and after a pod takes `milli` of GPU g and its CPU (state g + 1);
    both measures are taken of all states at once (`frag_of_shares`, `unusable_of_shares`)."""

    cpu: np.ndarray  # free CPU (n, gpus + 1)
    total: np.ndarray  # free GPU milli (n, gpus + 1)
    # Free milli per GPU as it is (row 0) and with the pod on it (row 1; below 0 where it has less
    # than `milli` free), (n, 2, gpus): a state's GPUs are row 0's but its own GPU (`_state_sums`).
    gpu: np.ndarray
    fits: np.ndarray  # GPU g has `milli` free (n, gpus)


def share_states(cpu: np.ndarray, left: np.ndarray, req_cpu: int, milli: int) -> ShareStates:
    """`ShareStates` of nodes with free CPU `cpu` (n,) and free milli per GPU `left` (n, gpus) for a
    pod taking `req_cpu` CPU and `milli` of one GPU."""
    cpu_taken, milli_taken, on_gpu = _taken_by_share(left.shape[1], milli, req_cpu)
    states_total = left.sum(axis=1)[:, None] - milli_taken
    return ShareStates(cpu[:, None] - cpu_taken, states_total, left[:, None, :] - on_gpu, left >= milli)


@lru_cache(maxsize=256)
def _taken_by_share(gpus: int, milli: int, req_cpu: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What `share_states` takes: CPU and GPU milli per state (gpus + 1,), milli per GPU row (2, 1)."""
    cpu = np.full(gpus + 1, req_cpu, dtype=np.int64)
    total = np.full(gpus + 1, milli, dtype=np.int64)
    cpu[0] = total[0] = 0
    on_gpu = np.array([[0], [milli]], dtype=np.int64)
    for taken in (cpu, total, on_gpu):
        taken.setflags(write=False)
    return cpu, total, on_gpu


def _state_sums(per_gpu: np.ndarray) -> np.ndarray:
    """Per node and state of `ShareStates` (n, gpus + 1, ...), the sum over its GPUs of a value
    `per_gpu` (n, 2, gpus, ...) of the GPUs as they are (row 0) and with the pod on them (row 1)."""
    base = per_gpu[:, 0].sum(axis=1)[:, None]
    return np.concatenate([base, base - per_gpu[:, 0] + per_gpu[:, 1]], axis=1)


def frag_after_share(
    cpu: np.ndarray, left: np.ndarray, req_cpu: int, milli: int, wl: TypicalWorkload, access: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """For a pod taking `milli` of one GPU and `req_cpu` CPU: F before (n,) and F after placing it on
    each GPU g (n, gpus); +inf where GPU g has less than `milli` free."""
    return frag_of_shares(share_states(cpu, left, req_cpu, milli), wl, access)


def frag_of_shares(
    states: ShareStates, wl: TypicalWorkload, access: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """`frag_after_share` of `share_states`."""
    both = _state_sums(np.concatenate(_gpu_parts(states.gpu, wl), axis=-1))  # one pass for the two parts
    count, below = both[..., : len(wl)], both[..., len(wl) :]
    terms = frag_terms(states.cpu, count, below, states.total, wl, _per_gpu(access))
    before, after = _before_after(terms, wl, access)
    return before, np.where(states.fits, after, np.inf)


class WholeStates(NamedTuple):
    """Nodes as they are (state 0) and after a pod takes `gpus` whole GPUs and its CPU (state 1)."""

    cpu: np.ndarray  # free CPU (n, 2)
    total: np.ndarray  # free GPU milli (n, 2)
    left: np.ndarray  # free milli per GPU as they are (n, gpus)
    gpus: int


def whole_states(cpu: np.ndarray, left: np.ndarray, req_cpu: int, gpus: int) -> WholeStates:
    """`WholeStates` of nodes with free CPU `cpu` (n,) and free milli per GPU `left` (n, gpus) for a
    pod taking `req_cpu` CPU and `gpus` fully free GPUs (0 for CPU-only)."""
    cpu_taken, milli_taken = _taken_by_whole(gpus, req_cpu)
    return WholeStates(cpu[:, None] - cpu_taken, left.sum(axis=1)[:, None] - milli_taken, left, gpus)


@lru_cache(maxsize=256)
def _taken_by_whole(gpus: int, req_cpu: int) -> tuple[np.ndarray, np.ndarray]:
    """What each of `whole_states`' states takes: CPU (2,) and GPU milli (2,)."""
    cpu, milli = np.array((0, req_cpu), dtype=np.int64), np.array((0, gpus * MILLI_PER_GPU), dtype=np.int64)
    cpu.setflags(write=False)
    milli.setflags(write=False)
    return cpu, milli


def frag_after_whole(
    cpu: np.ndarray, left: np.ndarray, req_cpu: int, gpus: int, wl: TypicalWorkload, access: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """For a pod taking `gpus` fully free GPUs (0 for CPU-only) and `req_cpu` CPU: F before and
    after, per node."""
    return frag_of_whole(whole_states(cpu, left, req_cpu, gpus), wl, access)


def frag_of_whole(
    states: WholeStates, wl: TypicalWorkload, access: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """`frag_after_whole` of `whole_states`."""
    count, below = _count_below(states.left, wl)
    # The GPUs taken go from 1000 free (counted for every shape with milli > 0) to 0 (counted for none).
    count_s = count[:, None, :] - states.gpus * wl.whole_gpu_taken[0]
    terms = frag_terms(states.cpu, count_s, below[:, None, :], states.total, wl, _per_gpu(access))
    return _before_after(terms, wl, access, 1)


def _before_after(
    terms: np.ndarray, wl: TypicalWorkload, access: np.ndarray | None, after: int | slice = slice(1, None)
) -> tuple[np.ndarray, np.ndarray]:
    """The measure of nodes in states from their per-shape `terms` (n, states, shapes): before (state
    0, (n,)) and `after` (the others: per GPU for a share, (n, gpus); one for whole GPUs, (n,))."""
    if access is None:  # state 0 and the others as two products: a BLAS kernel may sum a row by where it sits
        return terms[:, 0] @ wl.prob, terms[:, after] @ wl.prob
    both = expectation(terms, wl, _per_gpu(access))
    return both[:, 0], both[:, after]


def _per_gpu(access: np.ndarray | None) -> np.ndarray | None:
    """`access` (n, 2, shapes) broadcast over the states of a node: (n, 1, 2, shapes)."""
    return None if access is None else access[:, None]


def sigmoid_score(delta: np.ndarray) -> np.ndarray:
    """FGD's node score for a fragmentation increase `delta`: int(100 * sigmoid(-delta / 1000))."""
    # Capped below where exp overflows (709.78): the score is 0 from far below either way.
    return ((1.0 / (1.0 + np.exp(np.minimum(delta / 1000.0, 700.0)))) * 100.0).astype(np.int64)


def _units(left: np.ndarray, wl: TypicalWorkload) -> np.ndarray:
    """Per GPU and typical shape: how many pods of the shape the GPU's free milli holds (0 for CPU-only)."""
    return np.where(wl.has_gpu, left[..., None] // wl.at_least_one[0], 0)


def unusable_terms(
    cpu: np.ndarray,
    units: np.ndarray,
    total: np.ndarray,
    wl: TypicalWorkload,
    access: np.ndarray | None,
    multi_gpu: str = "count",
) -> np.ndarray:
    """Per node and typical shape: the free GPU milli left over if the node were filled with the
    shape alone (`units`: how many pods of it the GPUs hold, CPU aside); all of it where the shape
    may not use the node's model.

    `multi_gpu="one"`: a multi-GPU shape asks only whether one pod fits (FGD's question), and then
    leaves only the partly used GPUs: whole GPUs it cannot fill go to smaller shapes."""
    _, gpus_per_pod, cpu_per_pod = wl.at_least_one
    pods = np.minimum(units // gpus_per_pod, cpu[..., None] // cpu_per_pod)
    taken = pods * wl.pod_milli
    if multi_gpu == "one":
        taken = np.where(wl.gpus > 1, np.where(pods >= 1, units * wl.milli, 0), taken)
    counted = wl.has_gpu if access is None else wl.has_gpu & (access[..., 0, :] > 0)
    return np.where(counted, total[..., None] - taken, total[..., None])


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
    return unusable_of_shares(share_states(cpu, left, req_cpu, milli), wl, access, multi_gpu)


def unusable_of_shares(
    states: ShareStates, wl: TypicalWorkload, access: np.ndarray | None = None, multi_gpu: str = "count"
) -> tuple[np.ndarray, np.ndarray]:
    """`unusable_after_share` of `share_states`."""
    units = _state_sums(_units(states.gpu, wl))
    terms = unusable_terms(states.cpu, units, states.total, wl, _per_gpu(access), multi_gpu)
    before, after = _before_after(terms, wl, access)
    return before, np.where(states.fits, after, np.inf)


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
    return unusable_of_whole(whole_states(cpu, left, req_cpu, gpus), wl, access, multi_gpu)


def unusable_of_whole(
    states: WholeStates, wl: TypicalWorkload, access: np.ndarray | None = None, multi_gpu: str = "count"
) -> tuple[np.ndarray, np.ndarray]:
    """`unusable_after_whole` of `whole_states`."""
    units = _units(states.left, wl).sum(axis=1)[:, None, :] - states.gpus * wl.whole_gpu_taken[1]
    terms = unusable_terms(states.cpu, units, states.total, wl, _per_gpu(access), multi_gpu)
    return _before_after(terms, wl, access, 1)
