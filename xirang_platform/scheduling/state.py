"""Free capacity of the pool as numpy arrays, the working surface of placement.

Per GPU the state tracks free milli and free GPU memory (MiB; capacity from the GPU model in the
catalog); per node free CPU and memory. Nodes are indexed by their position in `Pool.nodes` (sorted
by name), GPUs by their index on the node. A `ClusterState` is mutable and cheap to copy: a cycle
works on its own copy, so the caller's state is never changed by a cycle (the simulator and the
Dagster layer apply decisions themselves).

Every change to a row is logged and stamps the row (`derived.py`), so that values derived per node
(feasibility per shape, scores) are recomputed only for the rows that changed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable, Iterable
from itertools import groupby
from operator import attrgetter
from typing import TypeVar

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU, Pool
from xirang_platform.scheduling.derived import FEW_ROWS, ChangeLog, DerivedRows, new_stamp, new_stamps
from xirang_platform.scheduling.model import GpuSlice, NodeShare, Placement
from xirang_platform.scheduling.preference import GpuModelOrder

T = TypeVar("T")


class ClusterState:
    """Per-node free CPU and memory, per-GPU free milli and GPU memory, plus the static facts placement needs."""

    _masked_at = 0  # a memory view (`memory_view`): the position of the parent's change log it is masked to
    # The GPU models placement tries first per tier (`preference`): a cycle sets its config's on its
    # own copy, and every copy and view of it (preemption's trials, a hold's scope) places by it too.
    gpu_model_order = GpuModelOrder()

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        nodes = pool.nodes
        self.names: list[str] = [n.name for n in nodes]
        self.index: dict[str, int] = {name: i for i, name in enumerate(self.names)}
        n = len(nodes)
        width = max([1, *(node.gpus for node in nodes)])
        self.gpu_count = np.array([node.gpus for node in nodes], dtype=np.int64)
        self.gpu_free = np.zeros((n, width), dtype=np.int64)
        for i, node in enumerate(nodes):
            self.gpu_free[i, : node.gpus] = MILLI_PER_GPU
        self.cpu_free = np.array([node.cpu_milli for node in nodes], dtype=np.int64)
        self.mem_free = np.array([node.memory_mib for node in nodes], dtype=np.int64)
        self.cpu_capacity = self.cpu_free.copy()
        self.mem_capacity = self.mem_free.copy()
        self.model_names: list[str] = list(pool.models)
        model_code = {m: k for k, m in enumerate(self.model_names)}
        self.model_id = np.array([model_code[node.model.name] if node.model else -1 for node in nodes], dtype=np.int64)
        self.compute_level = np.array([node.model.compute_level if node.model else 0 for node in nodes], dtype=np.int64)
        self.gpu_memory_mib = np.array([node.model.memory_mib if node.model else 0 for node in nodes], dtype=np.int64)
        self.gpu_mem_capacity = np.where(self.gpu_free > 0, self.gpu_memory_mib[:, None], 0)
        self.gpu_mem_free = self.gpu_mem_capacity.copy()
        self.unit_milli = np.array([node.unit_milli for node in nodes], dtype=np.int64)
        self.domain_names: list[str] = list(pool.domains)
        domain_code = {d: k for k, d in enumerate(self.domain_names)}
        self.domain_id = np.array([domain_code[node.domain] for node in nodes], dtype=np.int64)
        self.capacity_milli = int(self.gpu_count.sum()) * MILLI_PER_GPU
        self.allocated_milli = 0
        self.whole_free = self.gpu_count.copy()  # per node, GPUs with nothing allocated on them
        self.free_milli = self.gpu_free.sum(axis=1)  # per node, free GPU milli over all its GPUs
        self.max_free = self.gpu_free.max(axis=1)  # per node, the most free milli on one GPU
        self.partial = False  # a view of some rows (`rows`): slices on other nodes only move the totals
        self.rounded: dict[int, np.ndarray] = {}  # milli -> per node, rounded up to its compute unit (static)
        self._fresh_tracking(new_stamps(n), DerivedRows())
        self._static: dict[Hashable, object] = {}  # `static_fact`s, shared by copies (not `rows`)

    def _fresh_tracking(self, stamps: np.ndarray, derived: DerivedRows) -> None:
        """Own change log and stamps; `derived`: the registry of values derived from this state's rows."""
        self.row_stamp = stamps  # per node, changes (to a value never used before) whenever the row changes
        self.changes = ChangeLog(2 * len(stamps) + 64)
        self.derived = derived
        self._memory_views: dict[int, ClusterState] = {}

    def static_fact(self, key: tuple, compute: Callable[[], T]) -> T:
        """The fact `key` of this pool's static arrays (models, counts, capacities; never what is
        free): `compute()` the first time it is asked for, afterwards the same object, for this
        state, its copies and memory views (a `rows` view keeps its own). `key` names the fact
        first, then what it is for: `("eligible", ...)`, `("uniform rounding", milli)`."""
        static = self._static
        if key in static:
            return static[key]  # type: ignore[return-value]
        found = static[key] = compute()
        return found

    def copy(self) -> ClusterState:
        """A copy whose free capacity can change without touching this one (static facts shared)."""
        other = copy.copy(self)
        other.gpu_free = self.gpu_free.copy()
        other.gpu_mem_free = self.gpu_mem_free.copy()
        other.cpu_free = self.cpu_free.copy()
        other.mem_free = self.mem_free.copy()
        other.whole_free = self.whole_free.copy()
        other.free_milli = self.free_milli.copy()
        other.max_free = self.max_free.copy()
        other._fresh_tracking(self.row_stamp.copy(), self.derived)
        return other

    def rows(self, nodes: np.ndarray) -> ClusterState:
        """A copy of the rows `nodes` (ascending indices) only, for what-if placement in one scope.

        Every per-node array is cut to those rows (names too, so placements name the same nodes);
        the cluster totals stay the pool's. Applying or releasing a placement that also holds other
        nodes changes these rows and the totals, and ignores the rest.
        """
        n = len(self.names)
        other = copy.copy(self)
        for key, value in vars(self).items():
            if isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == n:
                setattr(other, key, value[nodes].copy())
        other.names = [self.names[i] for i in nodes]
        other.index = {name: k for k, name in enumerate(other.names)}
        other.partial = True
        other.rounded = {}
        other._static = {}
        other._fresh_tracking(new_stamps(len(nodes)), DerivedRows())
        return other

    def empty_like(self) -> ClusterState:
        """A copy with nothing allocated: the pool's full capacity (for "could it ever fit?")."""
        other = self.copy()
        width = self.gpu_free.shape[1]
        other.gpu_free = np.where(np.arange(width)[None, :] < self.gpu_count[:, None], MILLI_PER_GPU, 0)
        other.gpu_mem_free = self.gpu_mem_capacity.copy()
        other.cpu_free = self.cpu_capacity.copy()
        other.mem_free = self.mem_capacity.copy()
        other.whole_free = self.gpu_count.copy()
        other.free_milli = other.gpu_free.sum(axis=1)
        other.max_free = other.gpu_free.max(axis=1)
        other.allocated_milli = 0
        # Every empty state of this pool has the same rows: one set of stamps, one registry.
        empty_stamps = self.static_fact(("empty stamps",), lambda: new_stamps(len(self.names)))
        other._fresh_tracking(empty_stamps.copy(), self.derived.sub("empty"))
        return other

    def with_memory_for(self, gpu_memory_mib: int) -> ClusterState:
        """This state as a request needing `gpu_memory_mib` per GPU sees it: a GPU without that much
        memory free shows no free milli (so a scorer never picks it); the state itself if every GPU has it."""
        short = (self.gpu_mem_free < gpu_memory_mib) & (self.gpu_free > 0)
        if not gpu_memory_mib or not short.any():
            return self
        view = self.copy()
        view._fresh_tracking(new_stamps(len(self.names)), DerivedRows())  # other contents: nothing derived carries over
        view.gpu_free = np.where(short, 0, self.gpu_free)
        view.whole_free = (view.gpu_free == MILLI_PER_GPU).sum(axis=1)
        view.free_milli = view.gpu_free.sum(axis=1)
        view.max_free = view.gpu_free.max(axis=1)
        return view

    def memory_view(self, gpu_memory_mib: int) -> ClusterState:
        """`with_memory_for(gpu_memory_mib)` kept in sync with this state: the view is made once and
        afterwards re-masked only on the rows that changed (read-only; this state's later changes
        reach it on the next call)."""
        if not gpu_memory_mib:
            return self
        view = self._memory_views.get(gpu_memory_mib)
        if view is None:
            view = copy.copy(self)
            for key in ("gpu_free", "whole_free", "free_milli", "max_free"):
                setattr(view, key, getattr(self, key).copy())
            view.derived = self.derived.sub(("memory", gpu_memory_mib))
            view._memory_views = {}
            view.partial = self.partial
            view._static = self._static
            self._memory_views[gpu_memory_mib] = view
            changed = None
        else:
            changed = self.changes.listed_since(view._masked_at)
        view._masked_at = self.changes.end
        view.allocated_milli = self.allocated_milli
        if changed is not None and len(changed) <= FEW_ROWS:  # the same masking, in Python ints
            for r in changed:
                free, memory = self.gpu_free[r].tolist(), self.gpu_mem_free[r].tolist()
                row = [0 if m < gpu_memory_mib and f > 0 else f for f, m in zip(free, memory, strict=True)]
                view.gpu_free[r] = row
                view.whole_free[r], view.free_milli[r], view.max_free[r] = row.count(MILLI_PER_GPU), sum(row), max(row)
        elif changed is None or len(changed):
            rows = np.arange(len(self.names)) if changed is None else np.array(changed, dtype=np.int64)
            free = self.gpu_free[rows]
            masked = np.where((self.gpu_mem_free[rows] < gpu_memory_mib) & (free > 0), 0, free)
            view.gpu_free[rows] = masked
            view.whole_free[rows] = (masked == MILLI_PER_GPU).sum(axis=1)
            view.free_milli[rows] = masked.sum(axis=1)
            view.max_free[rows] = masked.max(axis=1)
        return view

    @property
    def allocated_fraction(self) -> float:
        """Allocated GPU milli over capacity (0 for a pool without GPUs)."""
        return self.allocated_milli / self.capacity_milli if self.capacity_milli else 0.0

    def apply(self, placement: Placement) -> None:
        """Take the capacity `placement` holds."""
        self._add(placement, -1)

    def release(self, placement: Placement) -> None:
        """Give back the capacity `placement` held."""
        self._add(placement, +1)

    def release_all(self, placements: list[Placement]) -> None:
        """Give back the capacity of every one of `placements` at once (vectorised `release`)."""
        known = self.index
        slices = [
            (known[s.node], s.gpu, s.milli, s.gpu_memory_mib) for p in placements for s in p.slices if s.node in known
        ]
        shares = [(known[h.node], h.cpu_milli, h.memory_mib) for p in placements for h in p.shares if h.node in known]
        self.allocated_milli -= sum(s.milli for p in placements for s in p.slices)
        if slices:
            sl = np.array(slices, dtype=np.int64)
            np.add.at(self.gpu_free, (sl[:, 0], sl[:, 1]), sl[:, 2])
            np.add.at(self.gpu_mem_free, (sl[:, 0], sl[:, 1]), sl[:, 3])
            np.add.at(self.free_milli, sl[:, 0], sl[:, 2])
            rows = np.unique(sl[:, 0])
            self._changed(rows)
            self.whole_free[rows] = (self.gpu_free[rows] == MILLI_PER_GPU).sum(axis=1)
            self.max_free[rows] = self.gpu_free[rows].max(axis=1)
        if shares:
            sh = np.array(shares, dtype=np.int64)
            np.add.at(self.cpu_free, sh[:, 0], sh[:, 1])
            np.add.at(self.mem_free, sh[:, 0], sh[:, 2])
            self._changed(np.unique(sh[:, 0]))

    def _changed(self, rows: np.ndarray) -> None:
        self.row_stamp[rows] = new_stamps(len(rows))
        self.changes.add(rows.tolist())

    def _add(self, placement: Placement, sign: int) -> None:
        shares = placement.shares
        if len(shares) == 1 and not self.partial and self._add_on_one_node(placement, shares[0], sign):
            return
        index, partial = self.index, self.partial
        touched, placed = set(), 0
        # A node's run of slices at a time (a placement lists a node's slices together; a node met
        # again later is changed again).
        for name, run in groupby(placement.slices, _node_of):
            if partial and name not in index:
                placed += sum(s.milli for s in run)
                continue
            i = index[name]
            placed += self._take_gpus(i, run, sign)
            touched.add(i)
        self.allocated_milli -= sign * placed
        for sh in placement.shares:
            if partial and sh.node not in index:
                continue
            i = index[sh.node]
            self.cpu_free[i] += sign * sh.cpu_milli
            self.mem_free[i] += sign * sh.memory_mib
            touched.add(i)
        for i in touched:
            self.row_stamp[i] = new_stamp()
        self.changes.add(touched)

    def _add_on_one_node(self, placement: Placement, share: NodeShare, sign: int) -> bool:
        """`_add` of a placement whose slices all lie on the node of its one share (every single-node
        placement, most gangs), in one pass; False, with nothing changed, when a slice lies on another
        node. (Scalars are read with `item` and written back: cheaper than numpy's in-place `+=`.)"""
        name, slices = share.node, placement.slices
        for s in slices:
            if s.node != name:
                return False
        i = self.index[name]
        self.allocated_milli -= sign * self._take_gpus(i, slices, sign)
        cpu, mem = self.cpu_free, self.mem_free
        cpu[i] = cpu.item(i) + sign * share.cpu_milli
        mem[i] = mem.item(i) + sign * share.memory_mib
        self.row_stamp[i] = new_stamp()
        self.changes.add((i,))
        return True

    def _take_gpus(self, i: int, slices: Iterable[GpuSlice], sign: int) -> int:
        """Take (`sign` -1) or give back (+1) `slices`, all on row `i`, in the row's free milli, GPU
        memory and totals; the milli they hold. A row is a few GPUs: read into
        Python ints, changed, written back once (cheaper than numpy item by item)."""
        free, memory, added, count = self.gpu_free[i].tolist(), None, 0, 0
        for s in slices:
            free[s.gpu] += sign * s.milli
            added += s.milli
            count += 1
            if s.gpu_memory_mib:
                if memory is None:
                    memory = self.gpu_mem_free[i].tolist()
                memory[s.gpu] += sign * s.gpu_memory_mib
        if count:
            self.gpu_free[i] = free
            if memory is not None:
                self.gpu_mem_free[i] = memory
            self.free_milli[i] = self.free_milli.item(i) + sign * added
            self.max_free[i] = max(free)
            self.whole_free[i] = free.count(MILLI_PER_GPU)
        return added

    def check(self) -> list[str]:
        """Broken capacity invariants (DESIGN.md section 6, invariant 1), as messages; [] if none."""
        problems = []
        over_gpu = np.argwhere((self.gpu_free < 0) | (self.gpu_free > MILLI_PER_GPU))
        for i, g in over_gpu:
            problems.append(f"{self.names[i]} gpu {g}: free milli {self.gpu_free[i, g]} outside 0..1000")
        for i, g in np.argwhere(self.gpu_mem_free < 0):
            problems.append(
                f"{self.names[i]} gpu {g}: GPU memory over-allocated by {-self.gpu_mem_free[i, g]} MiB "
                f"(the GPU has {self.gpu_memory_mib[i]} MiB)"
            )
        totals = (self.free_milli != self.gpu_free.sum(axis=1)) | (self.max_free != self.gpu_free.max(axis=1))
        for i in np.flatnonzero(totals):
            problems.append(f"{self.names[i]}: the free milli totals kept per node disagree with its GPUs")
        for i in np.flatnonzero(self.cpu_free < 0):
            problems.append(f"{self.names[i]}: CPU over-allocated by {-self.cpu_free[i]} milli")
        for i in np.flatnonzero(self.mem_free < 0):
            problems.append(f"{self.names[i]}: memory over-allocated by {-self.mem_free[i]} MiB")
        return problems


_node_of = attrgetter("node")
