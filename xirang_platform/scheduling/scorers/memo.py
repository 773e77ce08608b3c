"""A memo of scores per node content, shared by the fragmentation scorers (FGD, Xirang)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.state import ClusterState

# evaluate(cpu (M,), left (M, G), access (M, shapes), req_cpu, need, gpus) -> (score (M,), gpu choice (M,))
Evaluator = Callable[[np.ndarray, np.ndarray, np.ndarray, int, int, int], tuple[np.ndarray, np.ndarray]]
# access(model name or None, GPUs per model of the pool) -> (2, shapes): may use, weight (TypicalWorkload.access)
Access = Callable[[str | None, dict[str, int]], np.ndarray]


class ContentMemo:
    """Per node content (access class, free CPU, per-GPU free milli), the score and GPU choice of
    each pod shape. The access class is the row `access(model)` of the node's GPU model: nodes of
    models the same typical shapes may use share scores.

    Content ids are interned by value, so the memo stays correct across state copies and pools. It
    remembers the last `VIEWS` states it saw (a cycle alternates between the live state and an empty
    pool when it checks whether a request could ever fit) and re-reads only the nodes that changed
    since the closest one.
    """

    MAX_CONTENTS = 400_000
    VIEWS = 2

    def __init__(self, evaluate: Evaluator, access: Access) -> None:
        self.evaluate = evaluate
        self.access = access
        self._class_ids: dict[bytes, int] = {}
        self._class_rows: list[np.ndarray] = []
        self._model_classes: dict[tuple, np.ndarray] = {}
        self._clear(0)

    def _clear(self, width: int) -> None:
        self._ids: dict[bytes, int] = {}
        self._cls = np.zeros(0, dtype=np.int64)
        self._cpu = np.zeros(0, dtype=np.int64)
        self._left = np.zeros((0, width), dtype=np.int64)
        self._tables: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._views: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # (cpu, gpu, class, ids)

    def node_classes(self, state: ClusterState) -> np.ndarray:
        """The access class of every node of `state` (from its GPU model)."""
        names = tuple(state.model_names)
        gpus = np.bincount(
            state.model_id[state.model_id >= 0], weights=state.gpu_count[state.model_id >= 0], minlength=len(names)
        )
        key = (names, gpus.astype(np.int64).tobytes())
        table = self._model_classes.get(key)
        if table is None:
            per_model = {m: int(n) for m, n in zip(names, gpus, strict=True)}
            table = np.empty(len(names) + 1, dtype=np.int64)  # the last entry: nodes without a model (-1)
            for k, model in enumerate([*names, None]):
                row = np.asarray(self.access(model, per_model), dtype=np.float64)
                table[k] = self._class_ids.setdefault(row.tobytes(), len(self._class_ids))
                if table[k] == len(self._class_rows):
                    self._class_rows.append(row)
            self._model_classes[key] = table
        return table[state.model_id]

    def node_ids(self, state: ClusterState) -> np.ndarray:
        """The content id of every node of `state`."""
        cpu, gpu, cls = state.cpu_free, state.gpu_free, self.node_classes(state)
        if len(self._ids) > self.MAX_CONTENTS or self._left.shape[1] != gpu.shape[1]:
            self._clear(gpu.shape[1])
        best: tuple[int, np.ndarray] | None = None
        for k, (seen_cpu, seen_gpu, seen_cls, _) in enumerate(self._views):
            if seen_gpu.shape == gpu.shape:
                changed = np.flatnonzero((cpu != seen_cpu) | (cls != seen_cls) | (gpu != seen_gpu).any(axis=1))
                if best is None or len(changed) < len(best[1]):
                    best = (k, changed)
        if best is None:
            changed, view = np.arange(len(cpu)), (cpu, gpu, cls, np.zeros(len(cpu), dtype=np.int64))
        else:
            changed, view = best[1], self._views.pop(best[0])
        ids = view[3]
        if len(changed):
            ids = ids.copy()
            new_cls, new_cpu, new_left = [], [], []
            for i in changed:
                key = cls[i].tobytes() + cpu[i].tobytes() + gpu[i].tobytes()
                cid = self._ids.get(key)
                if cid is None:
                    cid = len(self._ids)
                    self._ids[key] = cid
                    new_cls.append(cls[i])
                    new_cpu.append(cpu[i])
                    new_left.append(gpu[i])
                ids[i] = cid
            if new_cpu:
                self._cls = np.concatenate([self._cls, np.array(new_cls, dtype=np.int64)])
                self._cpu = np.concatenate([self._cpu, np.array(new_cpu, dtype=np.int64)])
                self._left = np.concatenate([self._left, np.array(new_left, dtype=np.int64)])
            view = (cpu.copy(), gpu.copy(), cls.copy(), ids)
        self._views.append(view)
        del self._views[: -self.VIEWS]
        return ids

    def lookup(self, shape: tuple[int, int, int], cids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Score and GPU choice of pod `shape` (cpu, milli per GPU, GPUs) on contents `cids`."""
        table = self._tables.get(shape)
        n = len(self._ids)
        if table is None or len(table[0]) < n:
            known = 0 if table is None else len(table[0])
            grown_s = np.full(max(n, 2 * known), np.nan)
            grown_c = np.full(len(grown_s), -1, dtype=np.int64)
            if table is not None:
                grown_s[:known], grown_c[:known] = table
            table = self._tables[shape] = (grown_s, grown_c)
        score, choice = table
        got = score[cids]
        missing = np.unique(cids[np.isnan(got)])
        if len(missing):
            access = np.array([self._class_rows[c] for c in self._cls[missing]])
            s, c = self.evaluate(self._cpu[missing], self._left[missing], access, *shape)
            score[missing] = s
            choice[missing] = c
            got = score[cids]
        return got, choice[cids]


def memo_scores(
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


def gpus_for(state: ClusterState, request: Request, node: int, choice: int, need: int) -> tuple[int, ...]:
    """The GPUs of `node` a request takes: the scored choice for a share, else the lowest-index GPUs
    with `need` free (whole GPUs: the lowest-index free ones, FGD's rule)."""
    if request.gpus == 0:
        return ()
    if choice >= 0:
        return (int(choice),)
    return tuple(int(g) for g in np.flatnonzero(state.gpu_free[node] >= need)[: request.gpus])
