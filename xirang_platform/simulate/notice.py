"""Preemption with a notice, in the replay: victims stop after a grace, preemptors wait on reserved units.

The cycle decides as if its victims were gone at once (the core stays pure); the replay then gives
each victim a notice (`--preemption-notice S`). A victim whose checkpoint cost (`--checkpoint-cost S`)
fits in the notice saves the work it has done and stops `checkpoint-cost` seconds later, losing
nothing; any other victim runs to the end of the grace and is killed, losing the work since its last
periodic checkpoint (`--checkpoint`). A killed victim whose run ends within the grace just finishes.

Until its victims stop, a preemptor's allocation is held as reserved (`confirmed=False`, started when
they stop): it counts against its quota and no one else may take its units. A `Drain` is one cycle's
victims on notice and the preemptors waiting on them; its `hold` keeps in the cluster state the units
the victims still use beyond the preemptors' reservations, per GPU and node `max(0, victims -
reserved)`, so the state holds `others + max(victims, reserved)`: both the victims' running work and
the reservation, never counted twice. An admission of the same cycle that the hold leaves overfull
(it took units a victim still uses) waits for the next cycle (`overfull_admits`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from xirang_platform.scheduling.model import Allocation, GpuSlice, NodeShare, Placement, Preempt
from xirang_platform.scheduling.state import ClusterState
from xirang_platform.simulate.events import Event

EMPTY = Placement((), ())


@dataclass(frozen=True)
class NoticePolicy:
    """The grace a victim gets (`notice_s`, 0 = stopped at once, today's behaviour) and the time it
    needs to save a checkpoint (`checkpoint_cost_s`)."""

    notice_s: float = 0.0
    checkpoint_cost_s: float = 0.0

    def __post_init__(self) -> None:
        for name, value in (("preemption notice", self.notice_s), ("checkpoint cost", self.checkpoint_cost_s)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value}")

    @property
    def on(self) -> bool:
        """Whether victims get a notice at all."""
        return self.notice_s > 0

    @property
    def saves(self) -> bool:
        """Whether a victim's checkpoint fits in its notice (it saves and loses nothing)."""
        return self.checkpoint_cost_s <= self.notice_s

    @property
    def stop_delay_s(self) -> float:
        """Seconds from the notice until a victim stops: its checkpoint cost if that fits, else the grace."""
        return self.checkpoint_cost_s if self.saves else self.notice_s


@dataclass
class Drain:
    """One cycle's victims on notice (each with its preemption), the preemptors' reserved placements
    by id, and the units held for the victims beyond those reservations."""

    noticed_at: float
    stops_at: float
    victims: list[tuple[Preempt, Allocation]]
    reserved: dict[str, Placement]
    hold: Placement = EMPTY
    finished: set[str] = field(default_factory=set)  # victims whose run ended within the grace
    stopped: bool = False

    def rehold(self, state: ClusterState) -> None:
        """Set `hold` to what the victims use beyond the reservations now, in `state` too."""
        state.release(self.hold)
        self.hold = drain_hold([v.placement for _, v in self.victims], self.reserved.values())
        state.apply(self.hold)


def drain_hold(victims: Iterable[Placement], reserved: Iterable[Placement]) -> Placement:
    """Per GPU (milli, GPU memory) and per node (CPU, memory): what `victims` hold beyond `reserved`,
    `max(0, victims - reserved)`, as one placement (nodes and GPUs in name order)."""
    gpu: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    node: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for sign, placements in ((1, victims), (-1, reserved)):
        for p in placements:
            for s in p.slices:
                held = gpu[(s.node, s.gpu)]
                held[0] += sign * s.milli
                held[1] += sign * s.gpu_memory_mib
            for h in p.shares:
                node[h.node][0] += sign * h.cpu_milli
                node[h.node][1] += sign * h.memory_mib
    slices = tuple(
        GpuSlice(n, g, max(0, m), max(0, mem)) for (n, g), (m, mem) in sorted(gpu.items()) if m > 0 or mem > 0
    )
    shares = tuple(NodeShare(n, max(0, c), max(0, m)) for n, (c, m) in sorted(node.items()) if c > 0 or m > 0)
    return Placement(slices, shares)


def overfull_admits(state: ClusterState, admitted: Sequence[Allocation]) -> Allocation | None:
    """The last of `admitted` that holds a unit `state` has over-allocated (a GPU's milli or memory, a
    node's CPU or memory), or None when nothing is over-allocated."""
    gpus = {(state.names[i], int(g)) for i, g in np.argwhere((state.gpu_free < 0) | (state.gpu_mem_free < 0))}
    nodes = {state.names[i] for i in np.flatnonzero((state.cpu_free < 0) | (state.mem_free < 0))}
    if not gpus and not nodes:
        return None
    for a in reversed(admitted):
        p = a.placement
        if any((s.node, s.gpu) in gpus for s in p.slices) or any(h.node in nodes for h in p.shares):
            return a
    raise AssertionError(f"the cluster state is over-allocated on {sorted(gpus)} {sorted(nodes)} by no admission")


def notice_metrics(events: Iterable[Event], policy: NoticePolicy) -> dict:
    """`preemption_notice_s` and `preemptor_wait_added_s_mean`: over the preemptors that had units
    reserved, the mean wait from the reservation to their start (0 with no notice; null when nothing
    was preempted). A reservation that ended before it started counts its wait until then."""
    added = []
    reserved: dict[str, float] = {}
    preempted = False
    for e in events:
        kind = e["event"]
        if kind == "reserve":
            reserved[e["job"]] = e["t"]
        elif kind in ("admit", "preempt", "finish") and e["job"] in reserved:
            added.append(e["t"] - reserved.pop(e["job"]))
        preempted = preempted or kind == "preempt"
    if added:
        mean: float | None = float(np.mean(added))
    else:
        mean = 0.0 if preempted else None
    return {"preemption_notice_s": policy.notice_s, "preemptor_wait_added_s_mean": mean}
