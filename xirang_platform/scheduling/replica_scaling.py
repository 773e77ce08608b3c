"""Inference autoscaling: how many replicas a service needs for its load, as a pure decision.

One call per service and tick: `decide(spec, memory, current, qps, now, cap_replicas)`. It reads no
clock but `now` and returns a `ScaleDecision` (outcome as data) that carries the memory for the next
tick. The caller turns it into scheduler work:
- scale-up: `replica_requests` makes P0 (`inference`) replica requests; the scheduling `cycle` places
  them first, and may preempt P2 work and reclaim borrowed units for them (DESIGN.md sections 4-5);
- scale-down: `replicas_to_release` picks which replicas stop (waiting ones first, then the newest
  running); their units go to training in the next cycle.

The rule, in order:
1. wanted = ceil(qps x (1 + headroom) / replica_qps): headroom keeps replicas below full load so a
   rise is served while the next replica starts;
2. bounded: at least `min_replicas`; at most `max_replicas` and what the tenant's cap holds (P0 never
   borrows, so a replica past the cap could never be admitted); when the cap cuts, `capped` is set and
   `unserved_qps` says how much load the capped replicas cannot serve;
3. hysteresis: a scale-up happens at once, then not again for `up_cooldown_s` (the replicas just asked
   for need time to start before the load is judged again); a scale-down goes only to the highest
   bounded want of the last `down_cooldown_s`, so a dip shorter than that window never releases
   replicas a returning load needs (Kubernetes HPA's scale-down stabilization window), and only when
   that want is at least `down_tolerance` below the current replicas (HPA's tolerance): on a shared
   pool a released replica's units go to training at once and taking them back costs a preemption,
   so a release smaller than the load's own noise is not worth it. A cap or maximum that falls below
   the current replicas applies at once. Up is fast and down is slow because a missing replica drops
   requests, a spare one only costs GPU time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.model import Request, Tier


@dataclass(frozen=True)
class ServiceSpec:
    """An inference service and how it scales.

    `replica_gpu_milli` is what one replica holds: below 1000 a fraction of one GPU, otherwise whole
    GPUs (a multiple of 1000, on one node). `replica_gpu_memory_mib` is the GPU memory each of its GPUs
    must have. `max_replicas` None leaves the bound to the tenant's cap.
    """

    name: str
    tenant: str
    project: str
    replica_qps: float
    replica_gpu_milli: int = MILLI_PER_GPU
    replica_gpu_memory_mib: int = 0
    replica_cpu_milli: int = 4000
    replica_memory_mib: int = 16384
    min_replicas: int = 1
    max_replicas: int | None = None
    headroom: float = 0.2
    up_cooldown_s: float = 60.0
    down_cooldown_s: float = 600.0
    down_tolerance: float = 0.1

    def __post_init__(self) -> None:
        problems = []
        if not self.name or "/" in self.name:
            problems.append(f"name {self.name!r} must be non-empty and without '/'")
        if not self.replica_qps > 0:
            problems.append(f"replica_qps must be > 0, got {self.replica_qps}")
        milli = self.replica_gpu_milli
        if milli <= 0 or (milli > MILLI_PER_GPU and milli % MILLI_PER_GPU):
            problems.append(f"replica_gpu_milli must be 1..1000 or a multiple of 1000, got {milli}")
        if self.min_replicas < 0 or (self.max_replicas is not None and self.max_replicas < self.min_replicas):
            problems.append(f"need 0 <= min_replicas <= max_replicas, got {self.min_replicas}, {self.max_replicas}")
        if self.headroom < 0 or self.up_cooldown_s < 0 or self.down_cooldown_s < 0:
            problems.append("headroom and cooldowns must be >= 0")
        if not 0 <= self.down_tolerance < 1:
            problems.append(f"down_tolerance must be in [0, 1), got {self.down_tolerance}")
        if problems:
            raise ValueError(f"service {self.name!r}: " + "; ".join(problems))

    @property
    def replica_gpus(self) -> int:
        """GPUs one replica spans (1 for a fraction of a GPU)."""
        return max(1, self.replica_gpu_milli // MILLI_PER_GPU)

    @property
    def replica_milli_per_gpu(self) -> int:
        """Milli of each of its GPUs (1000 for whole GPUs)."""
        return min(self.replica_gpu_milli, MILLI_PER_GPU)

    def wanted(self, qps: float) -> int:
        """Replicas the load asks for, with headroom, before any bound."""
        return math.ceil(max(qps, 0.0) * (1.0 + self.headroom) / self.replica_qps - 1e-9)


@dataclass(frozen=True)
class ScalerMemory:
    """What the policy remembers between ticks: the last scale-up and recent bounded wants."""

    last_up: float | None = None
    recent: tuple[tuple[float, int], ...] = ()  # (time, bounded want), oldest first, within the down window


class Action(StrEnum):
    """What a decision asks the caller to do."""

    UP = "scale-up"
    DOWN = "scale-down"
    STEADY = "steady"  # current replicas match the load
    UP_COOLDOWN = "up-cooldown"  # more wanted, but the last scale-up is too recent
    DOWN_WINDOW = "down-window"  # fewer wanted now, but not for the whole down window
    NO_READING = "no-reading"  # the load source had no value: keep what runs


@dataclass(frozen=True)
class ScaleDecision:
    """One tick's outcome for one service: `target` replicas (`delta` from `current`)."""

    service: str
    now: float
    qps: float | None
    current: int
    wanted: int
    target: int
    action: Action
    capped: bool = False
    unserved_qps: float = 0.0
    memory: ScalerMemory = field(default_factory=ScalerMemory)

    @property
    def delta(self) -> int:
        """Replicas to add (positive) or release (negative)."""
        return self.target - self.current


def cap_replicas(cap_milli: int, replica_gpu_milli: int) -> int:
    """How many replicas fit in `cap_milli` of the tenant's cap (what it may hold in quota, less what
    its other in-quota work holds): P0 must fit its tenant's cap, it never borrows."""
    return max(0, cap_milli) // replica_gpu_milli


def decide(
    spec: ServiceSpec,
    memory: ScalerMemory,
    current: int,
    qps: float | None,
    now: float,
    cap: int | None = None,
) -> ScaleDecision:
    """The replicas `spec` should have at `now` for load `qps` (None: no reading) with `current`
    replicas live (running or waiting), at most `cap` by the tenant's quota (None: no cap)."""
    if qps is None:
        return ScaleDecision(spec.name, now, None, current, current, current, Action.NO_READING, memory=memory)
    wanted = spec.wanted(qps)
    upper = min(x for x in (spec.max_replicas, cap, math.inf) if x is not None)
    bounded = int(min(max(wanted, spec.min_replicas), upper))
    capped = cap is not None and wanted > bounded and bounded == cap
    window_start = now - spec.down_cooldown_s
    recent = tuple(p for p in memory.recent if p[0] > window_start) + ((now, bounded),)
    last_up = memory.last_up
    if bounded > current:
        if last_up is not None and now - last_up < spec.up_cooldown_s:
            target, action = current, Action.UP_COOLDOWN
        else:
            target, action, last_up = bounded, Action.UP, now
    else:
        hold = max(w for _, w in recent)  # the highest want of the down window
        if upper < current:
            target, action = int(upper), Action.DOWN  # a cap or max that fell wins at once
        elif hold <= current * (1.0 - spec.down_tolerance) - 1e-9 or (hold < current and spec.down_tolerance == 0):
            target, action = hold, Action.DOWN
        else:
            target, action = current, Action.DOWN_WINDOW if bounded < current else Action.STEADY
    unserved = max(0.0, qps - target * spec.replica_qps)
    return ScaleDecision(
        spec.name, now, qps, current, wanted, target, action, capped, unserved, ScalerMemory(last_up, recent)
    )


def replica_id(service: str, index: int) -> str:
    """The id of replica number `index` of `service` (indexes are never reused)."""
    return f"{service}/replica-{index}"


def replica_requests(spec: ServiceSpec, first_index: int, count: int, now: float) -> list[Request]:
    """`count` P0 replica requests of `spec`, numbered from `first_index`, submitted at `now`."""
    return [
        Request(
            id=replica_id(spec.name, first_index + i),
            tenant=spec.tenant,
            project=spec.project,
            tier=Tier.INFERENCE,
            submit_time=now,
            gpus=spec.replica_gpus,
            milli_per_gpu=spec.replica_milli_per_gpu,
            cpu_milli=spec.replica_cpu_milli,
            memory_mib=spec.replica_memory_mib,
            gpu_memory_mib=spec.replica_gpu_memory_mib,
            single_node=True,
        )
        for i in range(max(0, count))
    ]


def replicas_to_release(waiting: Sequence[str], running: Sequence[str], count: int) -> list[str]:
    """Which `count` replicas a scale-down stops: waiting ones first (they serve nothing yet), then
    running ones newest first (`waiting` and `running` in the order they were asked for / started)."""
    order = list(reversed(waiting)) + list(reversed(running))
    return order[: max(0, count)]
