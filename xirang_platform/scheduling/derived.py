"""Per-node values derived from a `ClusterState`, kept in sync row by row as its capacity changes.

Placement asks the same questions about every node again and again (can it hold this shape? what
does the scorer give it?) while each admission changes one node or a few. A derived value is
computed once for every node and afterwards only for the rows that changed, so an admission costs
what it touches, not the size of the pool.

How changes are found (`ClusterState` keeps both):
- every state has its own `ChangeLog` of the rows it changed, in order: a value last synced by the
  same state reads only the log since then;
- every row carries a stamp, drawn from one process-wide counter whenever the row changes, so equal
  stamps mean equal contents even across copies: a value last synced by another state (an earlier
  copy, the previous cycle's) finds the rows to redo with one vectorised comparison.

A `DerivedRows` registry is shared by a state and its copies (what one cycle computes serves the
next); views whose rows mean something else (`rows`, `empty_like`, memory views) use their own.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Protocol, TypeVar

import numpy as np

T = TypeVar("T")

FEW_ROWS = 4
"""Up to this many changed rows (what one admission changes: a node, or a gang's few) are re-read
one by one as Python scalars rather than as numpy arrays, where each array call costs more than the
arithmetic: `feasibility.capacity_fit` (`row_fits`) with `placement.TopScores` (`update_rows`),
`scorers.memo` and `ClusterState.memory_view`. Without them `bench/cycle_speed.py --run-one fill4k`
takes 23% (the first pair) and 5% (the other two) more CPU, where its 0.3 s target is met at 0.263 s
with 12% to spare. Figures: docs/design-notes.md, record G3."""

_stamp_lock = threading.Lock()
_next_stamp = 1


def new_stamps(count: int) -> np.ndarray:
    """`count` row stamps never handed out before in this process (ascending)."""
    global _next_stamp
    with _stamp_lock:
        first = _next_stamp
        _next_stamp += count
    return np.arange(first, first + count, dtype=np.int64)


def new_stamp() -> int:
    """One row stamp never handed out before in this process."""
    global _next_stamp
    with _stamp_lock:
        _next_stamp += 1
        return _next_stamp - 1


class ChangeLog:
    """The rows one state changed, in order; positions are absolute, so a reader can tell when the
    log no longer reaches back to its last sync (then it compares stamps instead). Past `limit`
    entries the log is cut, so a state kept for long holds a bounded log."""

    __slots__ = ("end", "limit", "rows", "start")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.rows: list[int] = []
        self.start = 0  # absolute position of rows[0]
        self.end = 0  # absolute position after the last change

    def add(self, rows: Iterable[int]) -> None:
        """Log a change of `rows`."""
        self.rows.extend(rows)
        self.end = self.start + len(self.rows)
        if len(self.rows) > self.limit:
            self.start, self.rows = self.end, []

    def since(self, position: int) -> np.ndarray | None:
        """The distinct rows changed since `position` (ascending); None when the log was cut since."""
        rows = self.listed_since(position)
        return None if rows is None else np.array(rows, dtype=np.int64)

    def listed_since(self, position: int) -> list[int] | None:
        """`since` as a list of Python ints (for a reader that takes a few rows one by one)."""
        if position < self.start:
            return None
        rows = self.rows[position - self.start :]
        return rows if len(rows) <= 1 else sorted(set(rows))


class Rows(Protocol):
    """What a derived value reads of a state (`ClusterState` is one): its row stamps and its change log."""

    @property
    def row_stamp(self) -> np.ndarray: ...

    @property
    def changes(self) -> ChangeLog: ...


class _Entry:
    __slots__ = ("log", "position", "stamps", "value")

    def __init__(self, value: Any, stamps: np.ndarray, log: ChangeLog) -> None:
        self.value, self.stamps, self.log, self.position = value, stamps, log, log.end


class DerivedRows:
    """A registry of derived per-node values (at most `limit`, least recently used dropped), plus
    sub-registries for views of the same states (`sub`)."""

    def __init__(self, limit: int = 48) -> None:
        self.limit = limit
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._subs: dict[Hashable, DerivedRows] = {}

    def sub(self, key: Hashable) -> DerivedRows:
        """The registry of the views `key` of the states sharing this one (created on first use)."""
        found = self._subs.get(key)
        if found is None:
            found = self._subs[key] = DerivedRows(self.limit)
        return found

    def synced(self, state: Rows, key: Hashable, build: Callable[[], T], update: Callable[[T, np.ndarray], None]) -> T:
        """The value `key` as of `state`: `build()` the first time, else `update(value, rows)` with
        the rows changed since it was last synced (nothing when none changed)."""
        stamps, log = state.row_stamp, state.changes
        entry = self._entries.get(key)
        if entry is None or len(entry.stamps) != len(stamps):
            entry = self._entries[key] = _Entry(build(), stamps.copy(), log)
            while len(self._entries) > self.limit:
                self._entries.popitem(last=False)
            return entry.value
        self._entries.move_to_end(key)
        if entry.log is log and entry.position == log.end:
            return entry.value  # nothing changed since the last sync by this state
        rows = log.since(entry.position) if entry.log is log else None
        if rows is None:
            rows = np.flatnonzero(stamps != entry.stamps)
        if len(rows):
            update(entry.value, rows)
            entry.stamps[rows] = stamps[rows]
        entry.log, entry.position = log, log.end
        return entry.value

    def per_node(self, state: Rows, key: Hashable, compute: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """A per-node array: `compute(rows)` gives the values of `rows` (ascending indices). Read-only
        for the caller: the next sync rewrites it in place."""

        def update(values: np.ndarray, rows: np.ndarray) -> None:
            values[rows] = compute(rows)

        return self.synced(state, key, lambda: compute(np.arange(len(state.row_stamp))), update)
