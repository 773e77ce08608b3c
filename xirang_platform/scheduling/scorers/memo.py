"""A memo of scores per node content, shared by the fragmentation scorers (FGD, Xirang)."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

import numpy as np

from xirang_platform.scheduling.derived import FEW_ROWS
from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.scorers.fragmentation import NodeKind
from xirang_platform.scheduling.state import ClusterState

# evaluate(cpu (M,), left (M, G), access (M, ...), req_cpu, need, gpus) -> (score (M,), gpu choice (M,)).
# The GPU choice is an index into `left` (-1: none, the lowest-index free GPUs are taken): the first GPU
# with its free milli, as GPUs with equal free milli score alike (the memo keeps the milli, not the index).
Evaluator = Callable[[np.ndarray, np.ndarray, np.ndarray, int, int, int], tuple[np.ndarray, np.ndarray]]
# access(node kind, GPUs per kind of the pool) -> the class's rows, e.g. (2, shapes): may use, weight
# (TypicalWorkload.access); `evaluate` gets each content's class rows
Access = Callable[[NodeKind, dict[NodeKind, int]], np.ndarray]


class ContentMemo:
    """Per node content (access class, free CPU, per-GPU free milli), the score and GPU choice of
    each pod shape. The access class is the row `access(kind)` of the node's kind (GPU model, GPU
    count, CPU capacity): nodes of kinds that weigh the typical shapes alike share scores.

    Content ids are interned by value, so the memo stays correct across state copies and pools. The
    content id of every node is a value derived from the state (`ClusterState.derived`): it is
    re-read only on the nodes that changed since the last call, by this state or a copy of it.

    `gpu_order_free`: contents whose GPUs differ only in order share one id (each row's GPUs sorted
    by free milli), so that a node with a share on GPU 0 and one with it on GPU 3 are scored once.
    Right for an evaluator whose scores depend on the GPUs' free milli as a multiset (FGD's and the
    fill measure: every sum over GPUs is of integers) and whose GPU choice among equal scores is
    the fullest GPU (`Xirang`'s `gpu_tie="bestfit"`); a choice of the first index among GPUs of
    different free milli depends on their order, and such an evaluator keeps it off.
    """

    MAX_CONTENTS = 400_000

    def __init__(self, evaluate: Evaluator, access: Access, gpu_order_free: bool = False) -> None:
        self.evaluate = evaluate
        self.access = access
        self.gpu_order_free = gpu_order_free
        self._class_ids: dict[bytes, int] = {}
        self._class_rows: list[np.ndarray] = []
        self._class_table = np.zeros(0)  # `_class_rows` stacked, rebuilt when a class is added
        self._classes_key = ("access classes", self)  # where a state's static facts keep `node_classes`
        self._clear(0)

    def _clear(self, width: int) -> None:
        self._ids: dict[bytes, int] = {}
        self._cls = np.zeros(0, dtype=np.int64)
        self._cpu = np.zeros(0, dtype=np.int64)
        self._left = np.zeros((0, width), dtype=np.int64)
        self._tables: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._pack = struct.Struct(f"={width + 2}q").pack  # a content's key from Python ints: its int64 row's bytes
        self._generation = getattr(self, "_generation", -1) + 1  # content ids of an earlier generation are void

    def node_classes(self, state: ClusterState) -> np.ndarray:
        """The access class of every node of `state` (from its kind: GPU model, GPU count, CPU capacity;
        once per pool, read-only)."""

        def classes() -> np.ndarray:
            found = self._classes_of(state)
            found.setflags(write=False)
            return found

        return state.static_fact(self._classes_key, classes)

    def _classes_of(self, state: ClusterState) -> np.ndarray:
        kinds, per_node = _distinct_rows(state.model_id, state.gpu_count, state.cpu_capacity)
        names = [*state.model_names, None]  # model id -1: a node without GPUs
        node_kinds = [NodeKind(names[m], int(g), int(c)) for m, g, c in kinds]
        gpus_per_kind = {k: 0 for k in node_kinds}
        for k, n in zip(node_kinds, np.bincount(per_node.ravel(), weights=state.gpu_count), strict=True):
            gpus_per_kind[k] += int(n)
        table = np.empty(len(node_kinds), dtype=np.int64)
        for i, kind in enumerate(node_kinds):
            row = np.asarray(self.access(kind, gpus_per_kind), dtype=np.float64)
            table[i] = self._class_ids.setdefault(row.tobytes(), len(self._class_ids))
            if table[i] == len(self._class_rows):
                self._class_rows.append(row)
        return table[per_node.ravel()]

    def node_ids(self, state: ClusterState) -> np.ndarray:
        """The content id of every node of `state` (read-only; re-read only on the nodes that changed
        since the last call, `ClusterState.derived`)."""
        self._fit_width(state)
        classes = self.node_classes(state)

        def intern(rows: np.ndarray) -> np.ndarray:
            if len(rows) <= FEW_ROWS:  # what an admission changed: the rows built from Python ints
                return self._ids_of_rows(state, classes, rows)
            left = np.sort(state.gpu_free[rows], axis=1) if self.gpu_order_free else state.gpu_free[rows]
            return self._intern(np.column_stack([classes[rows], state.cpu_free[rows], left]))

        return state.derived.per_node(state, ("content ids", self, self._generation), intern)

    def ids_of(self, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        """`node_ids(state)[nodes]`; a few nodes are read from their own rows (cheaper than bringing
        every node's id up to date: the id of a content is the same whoever reads it)."""
        if len(nodes) > FEW_ROWS:
            return self.node_ids(state)[nodes]
        self._fit_width(state)  # once: every id of the answer from the same generation of the memo
        return self._ids_of_rows(state, self.node_classes(state), nodes)

    def id_at(self, state: ClusterState, node: int) -> int:
        """The content id of the one node `node` of `state` (`node_ids(state)[node]`), from its row."""
        self._fit_width(state)
        return self._id_of(self._content(state, self.node_classes(state), node))

    def _ids_of_rows(self, state: ClusterState, classes: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The content ids of a few `rows` of `state`, each read from its own row (`_id_of`)."""
        return np.array([self._id_of(self._content(state, classes, r)) for r in rows.tolist()], dtype=np.int64)

    def _fit_width(self, state: ClusterState) -> None:
        """Start afresh when the memo grew past its bound or `state` has GPUs per node of another width."""
        if len(self._ids) > self.MAX_CONTENTS or self._left.shape[1] != state.gpu_free.shape[1]:
            self._clear(state.gpu_free.shape[1])

    def _content(self, state: ClusterState, classes: np.ndarray, row: int) -> list[int]:
        """The content of one row as `_intern` reads it (class, free CPU, free milli per GPU), as Python ints."""
        left = state.gpu_free[row].tolist()
        if self.gpu_order_free:
            left.sort()
        return [classes.item(row), state.cpu_free.item(row), *left]

    def _id_of(self, content: list[int]) -> int:
        """`_intern` of one content given as Python ints (its key packed as the int64 row's bytes)."""
        cid = self._ids.get(self._pack(*content))
        return int(self._intern(np.array([content], dtype=np.int64))[0]) if cid is None else cid

    def _intern(self, contents: np.ndarray) -> np.ndarray:
        """The content id of each row of `contents` (class, free CPU, free milli per GPU), new ones added."""
        unique, inverse = contents, None
        if len(contents) >= 64:  # rows compared as bytes: far cheaper than `np.unique(axis=0)`, same rows
            rows = np.ascontiguousarray(contents)
            keys = rows.view(np.dtype((np.void, rows.itemsize * rows.shape[1]))).ravel()
            _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
            unique = rows[first]
        ids = np.empty(len(unique), dtype=np.int64)
        fresh = []
        for k, row in enumerate(unique):
            key = row.tobytes()
            cid = self._ids.get(key)
            if cid is None:
                cid = self._ids[key] = len(self._ids)
                fresh.append(row)
            ids[k] = cid
        if fresh:
            added, end = np.array(fresh, dtype=np.int64), len(self._ids)
            if end > len(self._cls):  # grown by doubling: adding contents costs what is added
                size = max(end, 2 * len(self._cls), 64)
                self._cls, self._cpu = np.resize(self._cls, size), np.resize(self._cpu, size)
                self._left = np.resize(self._left, (size, self._left.shape[1]))
            self._cls[end - len(added) : end] = added[:, 0]
            self._cpu[end - len(added) : end] = added[:, 1]
            self._left[end - len(added) : end] = added[:, 2:]
        return ids if inverse is None else ids[inverse.reshape(-1)]

    def lookup(self, shape: tuple[int, int, int], cids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Score and GPU choice of pod `shape` (cpu, milli per GPU, GPUs) on contents `cids`; the GPU
        choice is the free milli of the GPU chosen (-1: none; `gpus_for` finds the GPU)."""
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
        unknown = np.isnan(got)
        if np.count_nonzero(unknown):  # not `.any()`: several times dearer on the row or two most calls ask
            missing = cids[unknown]
            if len(missing) > 1:
                missing = np.unique(missing)
            if len(self._class_table) != len(self._class_rows):
                self._class_table = np.array(self._class_rows)
            access = self._class_table[self._cls[missing]]
            left = self._left[missing]
            s, c = self.evaluate(self._cpu[missing], left, access, *shape)
            score[missing] = s
            choice[missing] = np.where(c >= 0, left[np.arange(len(c)), c], -1)
            got = score[cids]
        return got, choice[cids]

    def at(self, shape: tuple[int, int, int], cid: int) -> tuple[float, int]:
        """`lookup` of the one content `cid`, read as Python scalars where it is known."""
        table = self._tables.get(shape)
        if table is not None and cid < len(table[0]):
            score = table[0].item(cid)
            if not math.isnan(score):
                return score, table[1].item(cid)
        score_of, choice_of = self.lookup(shape, np.array([cid]))
        return score_of.item(0), choice_of.item(0)


def _distinct_rows(*columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)`: the distinct rows in the
    same (lexicographic) order and each row's index among them, by one lexsort (several times cheaper)."""
    order = np.lexsort(columns[::-1])
    rows = np.stack(columns, axis=1)[order]
    first = np.ones(len(rows), dtype=bool)
    first[1:] = (rows[1:] != rows[:-1]).any(axis=1)
    inverse = np.empty(len(rows), dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    return rows[first], inverse


def memo_scores(
    memo: ContentMemo, state: ClusterState, request: Request, nodes: np.ndarray, need: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Memoized (score, GPU choice) of `request` on each candidate node, and the need per node."""
    same_shape = isinstance(need, np.ndarray) and need.shape == nodes.shape
    needs = need if same_shape else np.broadcast_to(need, nodes.shape)
    if len(nodes) == 1:  # one changed row (most admissions): read as Python scalars
        score_here, choice_here = memo.at(_shape(request, int(needs[0])), memo.id_at(state, nodes.item(0)))
        return np.array([score_here]), np.array([choice_here], dtype=np.int64), needs
    cids = memo.ids_of(state, nodes)
    if request.gpus == 0 or (needs == needs[0]).all():
        score, choice = memo.lookup(_shape(request, int(needs[0])), cids)
        return score, choice, needs
    score = np.empty(len(nodes))
    choice = np.empty(len(nodes), dtype=np.int64)
    for m in np.unique(needs):  # nodes with different compute units: one shape per unit size
        sel = needs == m
        score[sel], choice[sel] = memo.lookup(_shape(request, int(m)), cids[sel])
    return score, choice, needs


def _shape(request: Request, need: int) -> tuple[int, int, int]:
    """The memo's pod shape of `request` where each GPU gives `need` milli: (cpu, milli per GPU, GPUs)."""
    return request.cpu_milli, need if request.gpus else 0, request.gpus


def lone_candidate_gpus(
    memo: ContentMemo, state: ClusterState, request: Request, node: int, need: int
) -> tuple[int, ...]:
    """`gpus_for` on `node` with the memo's GPU choice there: what a memo scorer's `pick` takes when
    `node` is its only candidate (no scores to compare; most admissions on a filling pool)."""
    choice = memo.at(_shape(request, need), memo.id_at(state, node))[1]  # scored before: a table read
    return gpus_for(state, request, node, choice, need)


def gpus_for(state: ClusterState, request: Request, node: int, choice: int, need: int) -> tuple[int, ...]:
    """The GPUs of `node` a request takes: for a share, the first GPU with the free milli the memo
    chose (`choice`), else the lowest-index GPUs with `need` free (whole GPUs: the lowest-index free
    ones, FGD's rule)."""
    if request.gpus == 0:
        return ()
    free = state.gpu_free[node].tolist()
    if choice >= 0:
        return (free.index(choice),)
    return tuple([g for g, f in enumerate(free) if f >= need][: request.gpus])
