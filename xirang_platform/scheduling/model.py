"""Requests, allocations and the decisions a scheduling cycle returns (DESIGN.md sections 4-5).

All values are immutable; a cycle's outcome is data (admit, preempt, hold with a reason, return),
never an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace
from enum import StrEnum

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.tiers import Tier as Tier  # re-exported beside the request types


@dataclass(frozen=True)
class GpuRange:
    """The sizes an elastic training run may take: `min` to `max` GPUs in steps of `step` from `min`
    (DESIGN.md section 11; the tags `xirang/gpus-min`, `xirang/gpus-max`, `xirang/gpus-step`)."""

    min: int
    max: int
    step: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.max:
            raise ValueError(f"elastic range {self.min}..{self.max}: needs 1 <= min <= max")
        if self.step < 1 or (self.max - self.min) % self.step:
            raise ValueError(f"elastic range {self.min}..{self.max}: step {self.step} must divide max - min")

    def sizes(self) -> tuple[int, ...]:
        """Every size in the range, largest first."""
        return tuple(range(self.max, self.min - 1, -self.step))

    def contains(self, gpus: int) -> bool:
        """True when `gpus` is one of the range's sizes."""
        return self.min <= gpus <= self.max and (gpus - self.min) % self.step == 0

    def __str__(self) -> str:
        return f"{self.min}..{self.max}" + (f" step {self.step}" if self.step != 1 else "")


@dataclass(frozen=True)
class Request:
    """What a run asks for.

    `gpus` GPUs with `milli_per_gpu` of each (1000 = whole GPUs; a fraction of one GPU is
    `gpus=1, milli_per_gpu<1000`; a CPU-only request has `gpus=0`). `cpu_milli` and `memory_mib`
    are totals for the request, split over nodes in proportion to the GPUs placed there.
    `gpu_memory_mib` is the least GPU memory each GPU must have (memory-fit). `gpu_models` is the
    allowed set (empty = any). `single_node` keeps all GPUs on one node (a pod, not a gang of pods).
    `preempted` counts earlier preemptions: a preempted request resumes first. `reclaimed_at` is when
    its borrowed run was last reclaimed and `reclaims` how often that happened (it may borrow again
    only after a back-off that doubles with every reclaim). `deferred`: the last cycle's budget
    ran out before its turn (it comes first in its tier). `elastic`: the sizes an elastic training run
    may take (DESIGN.md section 11); `gpus` is then the size it asks for now (pending: its largest).
    """

    id: str
    tenant: str
    project: str
    tier: Tier
    submit_time: float
    gpus: int = 0
    milli_per_gpu: int = MILLI_PER_GPU
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_memory_mib: int = 0
    min_compute_level: int = 0
    gpu_models: frozenset[str] = frozenset()
    single_node: bool = False
    preempted: int = 0
    reclaimed_at: float | None = None
    reclaims: int = 0
    deferred: bool = False
    elastic: GpuRange | None = None

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.cpu_milli < 0 or self.memory_mib < 0 or self.gpu_memory_mib < 0:
            raise ValueError(f"request {self.id}: negative amounts are not a request")
        if not 0 < self.milli_per_gpu <= MILLI_PER_GPU:
            raise ValueError(f"request {self.id}: milli_per_gpu must be in 1..1000, got {self.milli_per_gpu}")
        if self.gpus > 1 and self.milli_per_gpu != MILLI_PER_GPU:
            raise ValueError(f"request {self.id}: a fraction of a GPU is asked on one GPU only (gpus=1)")
        if self.elastic is not None and not self.elastic.contains(self.gpus):
            raise ValueError(f"request {self.id}: {self.gpus} GPUs is outside its elastic range {self.elastic}")

    @property
    def total_milli(self) -> int:
        """GPU milli the request holds when placed."""
        return self.gpus * self.milli_per_gpu

    @property
    def whole_gpus(self) -> bool:
        """True when the request takes whole GPUs (or none)."""
        return self.milli_per_gpu == MILLI_PER_GPU

    def requeued(self, reason: PreemptReason, at: float) -> Request:
        """This request back in the queue after a preemption at `at`: it resumes first, and after a
        reclaim it may borrow again only after the back-off (`SchedulerConfig.borrow_backoff_s`)."""
        if reason is PreemptReason.RECLAIM:
            return replace(
                self, preempted=self.preempted + 1, reclaimed_at=at, reclaims=self.reclaims + 1, deferred=False
            )
        return replace(self, preempted=self.preempted + 1, deferred=False)

    _shape = None  # `shape` once computed (an attribute, not a field: equality and hashing ignore it)

    @property
    def shape(self) -> tuple:
        """Everything placement depends on (not who asks): requests of one shape fit alike."""
        # Kept on the instance after the first call, set as an attribute rather than through
        # `__dict__` (what `functools.cached_property` does, with a lock on Python 3.11): reading
        # `__dict__` makes each request a dict of its own, 10,000 more objects for the cycle collector
        # in a 10,000-request fill.
        found = self._shape
        if found is None:
            found = self._compute_shape()
            object.__setattr__(self, "_shape", found)
        return found

    def _compute_shape(self) -> tuple:
        return (
            self.tier.rank,
            self.gpus,
            self.milli_per_gpu,
            self.cpu_milli,
            self.memory_mib,
            self.gpu_memory_mib,
            self.min_compute_level,
            tuple(sorted(self.gpu_models)),
            self.single_node,
        )


@dataclass(frozen=True, slots=True)
class GpuSlice:
    """`milli` of GPU `gpu` on node `node`, holding `gpu_memory_mib` of that GPU's memory."""

    node: str
    gpu: int
    milli: int
    gpu_memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class NodeShare:
    """The CPU and memory a request holds on one node."""

    node: str
    cpu_milli: int
    memory_mib: int


def whole_gpu_slices(node: str, gpus: Iterable[int], gpu_memory_mib: int) -> list[GpuSlice]:
    """`GpuSlice(node, g, MILLI_PER_GPU, gpu_memory_mib)` for each `g` of `gpus` (a gang's GPUs on one node)."""
    return [GpuSlice(node, g, MILLI_PER_GPU, gpu_memory_mib) for g in gpus]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request runs: its GPU slices and its CPU/memory per node."""

    slices: tuple[GpuSlice, ...]
    shares: tuple[NodeShare, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes used, in order."""
        return tuple(s.node for s in self.shares)

    @property
    def milli(self) -> int:
        """GPU milli placed."""
        return sum(s.milli for s in self.slices)


@dataclass(frozen=True, slots=True)
class Allocation:
    """A running (or admitted, not yet confirmed) request and where it sits.

    `borrowed` marks an allocation admitted past its account's cap on idle units: it is
    preemptible whatever its tier, and turns in-quota (a `return`) when the account has room.
    `confirmed` is False between admission (reserved) and the launcher confirming it (used).
    `checkpointed_at` is when the run last reported a checkpoint (None: it reported none); preempting
    it loses only the work since then (`candidates.work_lost`).
    """

    request: Request
    placement: Placement
    start: float
    borrowed: bool = False
    confirmed: bool = True
    checkpointed_at: float | None = None

    @property
    def id(self) -> str:
        """The request id."""
        return self.request.id

    @property
    def milli(self) -> int:
        """GPU milli held."""
        return self.placement.milli


class HoldReason(StrEnum):
    """Why a request was not admitted this cycle."""

    NO_FIT = "no-fit"  # fits the pool, not the free units now
    NEVER_FITS = "never-fits"  # no node or domain of the pool could ever hold it
    OVER_QUOTA = "over-quota"  # past its cap and may not (or cannot) borrow
    RESERVED_FOR_GANG = "reserved-for-gang"  # units held back for a starving gang
    EXCEEDS_CAP = "exceeds-cap"  # larger than its account's cap at the highest ratio, and may not borrow
    UNKNOWN_ACCOUNT = "unknown-account"  # no such tenant/project in the quota book
    ALREADY_RUNNING = "already-running"  # a request of this id is running: it is never admitted twice
    DEFERRED = "deferred"  # the cycle's budget ran out before its turn: it goes first in its tier next cycle


class PreemptReason(StrEnum):
    """Why an allocation was preempted (the ledger's `preempt` entry records it)."""

    PRIORITY = "priority"  # a higher tier needed the units
    RECLAIM = "reclaim"  # the owner of lent capacity took it back


@dataclass(frozen=True, slots=True)
class Admit:
    """Admit a request with this allocation."""

    allocation: Allocation

    @property
    def request_id(self) -> str:
        return self.allocation.id


@dataclass(frozen=True)
class Preempt:
    """Stop `victim` so `by` can run, at `at` (the cycle's time); the victim is requeued as preempted."""

    victim: Allocation
    by: str
    reason: PreemptReason
    at: float = 0.0

    def requeued(self) -> Request:
        """The victim's request as it waits again (`Request.requeued`)."""
        return self.victim.request.requeued(self.reason, self.at)


class ResizeKind(StrEnum):
    """Which way an elastic run is resized."""

    GROW = "grow"  # into units idle for a while that nobody pending wants
    SHRINK = "shrink"  # instead of stopping it, for a preemption or a reclaim


@dataclass(frozen=True)
class Resize:
    """Restart an elastic run at a new size (DESIGN.md section 11): a notice, a checkpoint, and a
    resumption that holds `new` (same request id, `gpus` in its range) instead of `old`. `by` and
    `reason` say which request a shrink made room for and why (None for a grow)."""

    old: Allocation
    new: Allocation
    kind: ResizeKind
    at: float
    by: str | None = None
    reason: PreemptReason | None = None

    @property
    def request_id(self) -> str:
        return self.old.id


@dataclass(frozen=True, slots=True)
class Hold:
    """Leave a request pending, with a reason and a message for people."""

    request_id: str
    reason: HoldReason
    message: str

    # Written out: the generated frozen `__init__` costs 1.0 us more a hold, and the tick makes one per
    # waiting request: +7% CPU on `bench/cycle_speed.py --cases tick`, whose 20 ms target is met
    # narrowly (18.8 ms). Figures: docs/design-notes.md, record G3.
    def __init__(self, request_id: str, reason: HoldReason, message: str) -> None:
        set_request_id, set_reason, set_message = _HOLD_SETTERS
        set_request_id(self, request_id)
        set_reason(self, reason)
        set_message(self, message)


def slot_setters(cls: type) -> tuple[Callable[[object, object], None], ...]:
    """The setters of `cls`'s slots, in field order (they bypass the frozen `__setattr__`)."""
    return tuple(cls.__dict__[f.name].__set__ for f in fields(cls))


_HOLD_SETTERS = slot_setters(Hold)


@dataclass(frozen=True)
class Return:
    """A borrowed allocation becomes in-quota (the account is back under its cap)."""

    request_id: str
    milli: int
