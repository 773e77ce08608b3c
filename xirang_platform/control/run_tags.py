"""The run tags that are the contract between a Dagster run and the platform (DESIGN.md section 7).

No Dagster here: the coordinator, the tick, the simulator and the tests read the same keys. A run
says who pays and what it needs with `xirang/*` request tags (`REQUEST_TAGS`); `tag_parsing` turns
them into the scheduler core's `Request`, or into a `TagProblem` that names the tag and the fix.

- **Numbers** a tag may hold are within `BOUNDS`: every bound is in that table.
- **Platform tags** (`PLATFORM_TAGS`: the gate, the hold reason, the allocation, the lineage of a
  resumption, ...) are written by the coordinator and the tick alone, the coordinator blanks a
  user's. What a resumption inherits is a `Lineage` (`lineage_tags` states it on a run).
- The allocation an admitted run carries is `run_allocation`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.model import Request, Tier

PREFIX = "xirang/"

# What a run asks for (written by users, on jobs, asset jobs, schedules, sensors or assets).
TENANT = "xirang/tenant"
PROJECT = "xirang/project"
TIER = "xirang/tier"
GPUS = "xirang/gpus"
GPU_MILLI = "xirang/gpu-milli"
GPU_MEMORY_GB = "xirang/gpu-memory-gb"
MIN_COMPUTE_LEVEL = "xirang/min-compute-level"
GPU_MODEL = "xirang/gpu-model"
EXPECTED_DURATION = "xirang/expected-duration"  # seconds the run is expected to take: the queue estimate reads it
# An elastic training run's range (DESIGN.md section 11), instead of `xirang/gpus`.
GPUS_MIN = "xirang/gpus-min"
GPUS_MAX = "xirang/gpus-max"
GPUS_STEP = "xirang/gpus-step"
RANGE_TAGS = (GPUS_MIN, GPUS_MAX, GPUS_STEP)
REQUEST_TAGS = (
    TENANT,
    PROJECT,
    TIER,
    GPUS,
    GPU_MILLI,
    GPU_MEMORY_GB,
    MIN_COMPUTE_LEVEL,
    GPU_MODEL,
    *RANGE_TAGS,
    EXPECTED_DURATION,
)
ASK_TAGS = (GPUS, GPU_MILLI)  # one spelling each: whole GPUs or a fraction of one
GPU_ASK_TAGS = (*ASK_TAGS, *RANGE_TAGS)  # the GPU ask, one field: a count, a fraction or a range

# Written by the platform only.
# The gate: a closed one holds the run in Dagster's queue (limit 0 for each closed value), and its value
# says why in a word, the kind its hold reason starts with (`HOLD_KINDS`); open: may launch; none: asks no GPU.
GATE = "xirang/gate"
HOLD_KINDS = ("queued", "capacity", "quota", "reserved", "deferred", "duplicate", "ledger", "reconcile")
GATE_CLOSED = "closed"  # a hold reason of no known kind (and the gate of runs queued by earlier releases)
CLOSED_GATES = (*HOLD_KINDS, GATE_CLOSED)
GATE_OPEN = "open"
GATE_NONE = "none"
HOLD_REASON = "xirang/hold-reason"  # why a gated run waits, for people (the UI shows run tags)
POSITION = "xirang/position"  # a held run's place in its tier's queue: `#2 in online-training`
ESTIMATED_START = "xirang/estimated-start"  # when a held run may start: `~14:05 UTC`, `~now` or `unknown`
ALLOCATION = "xirang/allocation"  # JSON: where the run was placed (see `run_allocation`)
ENV = "xirang/env"  # JSON: environment the local launcher gives the run (CUDA_VISIBLE_DEVICES, ...)
SUBMIT_TIME = "xirang/submit-time"  # the original submit time (a resumption keeps its parent's)
PREEMPTED = "xirang/preempted"  # how many times this work was preempted (a resumption goes first)
PREEMPTED_BY = "xirang/preempted-by"  # on a victim: the run that took its units, and why
PARENT_RUN = "xirang/parent-run"  # on a resumption: the preempted run it continues
# When this work's borrowed run was last reclaimed and how often (its borrow back-off).
RECLAIMED_AT = "xirang/reclaimed-at"
RECLAIMS = "xirang/reclaims"
RECLAIM_TAGS = (RECLAIMED_AT, RECLAIMS)
RESUME = "xirang/resume"  # on a victim: pending until its resumption is requested, then requested
RESUME_PENDING = "pending"
RESUME_REQUESTED = "requested"
LINEAGE_TAGS = (SUBMIT_TIME, PREEMPTED, RECLAIMED_AT, RECLAIMS)
NOTICE = "xirang/notice"  # JSON, on a victim: its preemption notice (by, grace, when; `notice.Notice`)
AFTER_NOTICE = "xirang/after-notice"  # JSON, on a preemptor: the victims it waits for (`notice.Wait`)
RESIZE = "xirang/resize"  # JSON, on an elastic run resized: its old and new size (`resize.ResizeNotice`)
SIZE_HISTORY = "xirang/size-history"  # an elastic run's sizes so far, oldest first: `4,8,6`
PLATFORM_TAGS = (
    GATE,
    HOLD_REASON,
    POSITION,
    ESTIMATED_START,
    ALLOCATION,
    ENV,
    PREEMPTED_BY,
    PARENT_RUN,
    RESUME,
    NOTICE,
    AFTER_NOTICE,
    RESIZE,
    SIZE_HISTORY,
    *LINEAGE_TAGS,
)

PRIORITY = "dagster/priority"  # Dagster's queue order; set from the tier, never from the user
K8S_CONFIG = "dagster-k8s/config"  # stripped from users; the tick writes it for the k8s launcher

# Dagster's queue daemon launches higher priorities first: P0 before P1 before P2, with room between.
PRIORITY_BY_RANK = {0: 200, 1: 100, 2: 0}
NO_GPU_PRIORITY = 0


@dataclass(frozen=True)
class Bound:
    """What a numeric tag may hold: `low..high`, whole or with one decimal point, and what it means."""

    low: int
    high: int
    decimal: bool
    what: str
    hint: str = ""

    def text(self) -> str:
        """`a whole number of GPUs, 0..100000 (...)`: what to give, for a message's fix."""
        return f"{self.what}, {self.low}..{self.high}" + (f" ({self.hint})" if self.hint else "")


MAX_COUNT = 1_000_000  # preemptions and reclaims: far past any real count, far inside a 32-bit column
MAX_UNIX_TIME = 10**11  # seconds: the year 5138
MAX_DURATION = 366 * 86_400  # seconds: a run expected to take longer than a year has no useful estimate
# Every number a run tag may hold (DESIGN.md section 7); the one place the bounds live.
BOUNDS = {
    GPUS: Bound(0, 100_000, False, "a whole number of GPUs", f"for a fraction of one GPU use {GPU_MILLI}"),
    GPU_MILLI: Bound(1, MILLI_PER_GPU - 1, False, "milli of one GPU", f"500 = half; for whole GPUs use {GPUS}"),
    GPUS_MIN: Bound(1, 100_000, False, "a whole number of GPUs, the smallest size of the range"),
    GPUS_MAX: Bound(1, 100_000, False, "a whole number of GPUs, the largest size of the range"),
    GPUS_STEP: Bound(1, 100_000, False, "a whole number of GPUs between two sizes of the range", "default 1"),
    GPU_MEMORY_GB: Bound(0, 10_000, True, "GPU memory per GPU in GB", "e.g. 40 or 0.5"),
    MIN_COMPUTE_LEVEL: Bound(0, 100_000, False, "a whole number, the GPU catalog's compute level"),
    EXPECTED_DURATION: Bound(1, MAX_DURATION, True, "the seconds the run is expected to take", "3600 = an hour"),
    SUBMIT_TIME: Bound(0, MAX_UNIX_TIME, True, "a Unix time in seconds"),
    RECLAIMED_AT: Bound(0, MAX_UNIX_TIME, True, "a Unix time in seconds"),
    PREEMPTED: Bound(0, MAX_COUNT, False, "a whole number of preemptions"),
    RECLAIMS: Bound(0, MAX_COUNT, False, "a whole number of reclaims"),
}


@dataclass(frozen=True)
class TagProblem:
    """A tag that cannot be used: which one, what it held, and a message that ends with the fix."""

    tag: str
    value: str | None
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Lineage:
    """Where a request's work comes from, written by the platform alone: its original submit time,
    how often it was preempted, when it was last reclaimed and how often (its borrow back-off)."""

    submit_time: float
    preempted: int = 0
    reclaimed_at: float | None = None
    reclaims: int = 0

    @classmethod
    def of(cls, request: Request) -> Lineage:
        """The lineage `request` carries (counts held within `MAX_COUNT`)."""
        return cls(
            request.submit_time,
            min(request.preempted, MAX_COUNT),
            request.reclaimed_at,
            min(request.reclaims, MAX_COUNT),
        )


def priority_for(tier: Tier) -> int:
    """The `dagster/priority` a run of `tier` gets (the only place the mapping lives)."""
    return PRIORITY_BY_RANK[tier.rank]


def hold_kind(text: str) -> str | None:
    """The kind a hold reason text names (`HOLD_KINDS`: the word before its first `:`), or None."""
    head, colon, _ = text.partition(":")
    return head.strip() if colon and head.strip() in HOLD_KINDS else None


def closed_gate(hold_reason: str) -> str:
    """The closed gate that holds a run waiting for `hold_reason`: the reason's kind, else `closed`."""
    return hold_kind(hold_reason) or GATE_CLOSED


def is_closed(gate: str | None) -> bool:
    """Whether a `xirang/gate` value holds its run in Dagster's queue."""
    return gate in CLOSED_GATES


def asks_for_gpus(tags: Mapping[str, str]) -> bool:
    """Whether the tags ask for any GPU (a run that does not passes the gate untouched)."""
    return any(key in tags and str(tags[key]).strip() not in ("", "0") for key in GPU_ASK_TAGS)


def request_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """Only the `xirang/*` tags a user may write to describe a request."""
    return {k: str(v) for k, v in tags.items() if k in REQUEST_TAGS}


def lineage_tags(lineage: Lineage) -> dict[str, str]:
    """The tags that state `lineage` on a run (what `tag_parsing.parse` reads back): the submit time
    always, the preemptions and reclaims when there were any."""
    out = {SUBMIT_TIME: f"{lineage.submit_time:.3f}"}
    if lineage.preempted:
        out[PREEMPTED] = str(lineage.preempted)
    if lineage.reclaimed_at is not None:
        out[RECLAIMED_AT] = repr(lineage.reclaimed_at)
        out[RECLAIMS] = str(lineage.reclaims)
    return out


def gb_text(mib: int) -> str:
    """`mib` in GB as `xirang/gpu-memory-gb` states it, exactly (`40`, `0.5`, `10.0009765625`), so it
    reads back as the same MiB."""
    return f"{mib / 1024:.10f}".rstrip("0").rstrip(".")


def reclaim_tags(request: Request) -> dict[str, str]:
    """The tags that carry `request`'s reclaims (`reclaimed_at`, `reclaims`); none when it was never
    reclaimed."""
    return {k: v for k, v in lineage_tags(Lineage.of(request)).items() if k in RECLAIM_TAGS}


# -- run config the platform owns ------------------------------------------------------------------------

POOL_RESOURCE = "gpu_pool"  # the key the platform's Definitions bind `GpuPoolResource` under
POOL_PLATFORM_FIELDS = ("config_path", "ledger_url")  # the deployment's settings, never a run's


def platform_settings_problem(run_config: Mapping[str, Any] | None, key: str = POOL_RESOURCE) -> TagProblem | None:
    """The problem with a run config that sets the GPU pool resource's platform settings (under
    `resources.<key>.config`), or None. Dagster exposes a resource's fields to run config; these
    name the ledger and the platform config, which a run must not choose (DESIGN.md section 7)."""
    resources = (run_config or {}).get("resources")
    entry = resources.get(key) if isinstance(resources, Mapping) else None
    fields = entry.get("config") if isinstance(entry, Mapping) else None
    named = sorted(f for f in POOL_PLATFORM_FIELDS if isinstance(fields, Mapping) and f in fields)
    if not named:
        return None
    where = ", ".join(f"resources.{key}.config.{f}" for f in named)
    return TagProblem(
        f"resources.{key}.config",
        None,
        f"run config sets {where}: the GPU pool's platform settings ({', '.join(POOL_PLATFORM_FIELDS)}) come "
        f"from the deployment (its Definitions and XIRANG_CONFIG), not from a run; remove resources.{key} "
        "from the run config",
    )
