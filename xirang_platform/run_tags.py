"""The run tags that are the contract between a Dagster run and the platform (DESIGN.md section 7).

No Dagster here: the coordinator, the tick, the simulator and the tests read the same keys and the
same parser. A run says who pays and what it needs with `xirang/*` tags; `parse` turns them into the
scheduler core's `Request`, or into a `TagProblem` that names the tag and the fix. The platform's own
tags (the gate, the hold reason, the allocation, the resumption marks) are written by the coordinator
and the tick, never trusted from a user.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from xirang_platform.pool.catalog import Catalog, default_catalog
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
REQUEST_TAGS = (TENANT, PROJECT, TIER, GPUS, GPU_MILLI, GPU_MEMORY_GB, MIN_COMPUTE_LEVEL, GPU_MODEL)

# Written by the platform only.
GATE = "xirang/gate"  # closed: held by the queue daemon; open: may launch; none: asks no GPU
GATE_CLOSED = "closed"
GATE_OPEN = "open"
GATE_NONE = "none"
HOLD_REASON = "xirang/hold-reason"  # why a gated run waits, for people (the UI shows run tags)
ALLOCATION = "xirang/allocation"  # JSON: where the run was placed (see `allocation_tag`)
ENV = "xirang/env"  # JSON: environment the local launcher gives the run (CUDA_VISIBLE_DEVICES, ...)
SUBMIT_TIME = "xirang/submit-time"  # the original submit time (a resumption keeps its parent's)
PREEMPTED = "xirang/preempted"  # how many times this work was preempted (a resumption goes first)
PREEMPTED_BY = "xirang/preempted-by"  # on a victim: the run that took its units, and why
PARENT_RUN = "xirang/parent-run"  # on a resumption: the preempted run it continues
# When this work's borrowed run was last reclaimed and how often (its borrow back-off): written on a
# reclaimed victim by the tick, carried to its resumption (`reclaim_tags`).
RECLAIMED_AT = "xirang/reclaimed-at"
RECLAIMS = "xirang/reclaims"
RECLAIM_TAGS = (RECLAIMED_AT, RECLAIMS)
RESUME = "xirang/resume"  # on a victim: pending until its resumption is requested, then requested
RESUME_PENDING = "pending"
RESUME_REQUESTED = "requested"
PLATFORM_TAGS = (GATE, HOLD_REASON, ALLOCATION, ENV, PREEMPTED_BY, RESUME)

PRIORITY = "dagster/priority"  # Dagster's queue order; set from the tier, never from the user
K8S_CONFIG = "dagster-k8s/config"  # stripped from users; the tick writes it for the k8s launcher

# Dagster's queue daemon launches higher priorities first: P0 before P1 before P2, with room between.
PRIORITY_BY_RANK = {0: 200, 1: 100, 2: 0}
NO_GPU_PRIORITY = 0

DEFAULT_CATALOG = object()  # sentinel: check `xirang/gpu-model` against the bundled GPU catalog


@dataclass(frozen=True)
class TagProblem:
    """A tag that cannot be used: which one, what it held, and a message that ends with the fix."""

    tag: str
    value: str | None
    message: str

    def __str__(self) -> str:
        return self.message


def priority_for(tier: Tier) -> int:
    """The `dagster/priority` a run of `tier` gets (the only place the mapping lives)."""
    return PRIORITY_BY_RANK[tier.rank]


def asks_for_gpus(tags: Mapping[str, str]) -> bool:
    """Whether the tags ask for any GPU (a run that does not passes the gate untouched)."""
    return any(key in tags and str(tags[key]).strip() not in ("", "0") for key in (GPUS, GPU_MILLI))


def request_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """Only the `xirang/*` tags a user may write to describe a request."""
    return {k: str(v) for k, v in tags.items() if k in REQUEST_TAGS}


def reclaim_tags(request: Request) -> dict[str, str]:
    """The tags that carry `request`'s reclaims (`reclaimed_at`, `reclaims`) to the run resuming it;
    none when it was never reclaimed."""
    if request.reclaimed_at is None:
        return {}
    return {RECLAIMED_AT: repr(request.reclaimed_at), RECLAIMS: str(request.reclaims)}


def parse(
    tags: Mapping[str, str],
    bound_tenant: str | None,
    *,
    run_id: str = "run",
    submit_time: float = 0.0,
    projects: Collection[str] | None = None,
    catalog: Catalog | Any = DEFAULT_CATALOG,
) -> Request | TagProblem | None:
    """The request a run's tags describe: None when it asks for no GPU, a `TagProblem` when a tag
    is bad. `bound_tenant` is the tenant of the run's code location (a tag naming another fails);
    `projects` are that tenant's projects (None: not checked); `catalog` checks `xirang/gpu-model`
    (None: not checked). `submit_time` is used unless the run carries its original one. A tag whose
    value is the empty string counts as absent (how the platform blanks a tag)."""
    # Dagster run tags cannot be deleted: a tag blanked to "" counts as absent.
    tags = {k: v for k, v in tags.items() if str(v) != ""}
    try:
        return _parse(tags, bound_tenant, run_id, submit_time, projects, catalog)
    except _Bad as bad:
        return bad.problem


class _Bad(Exception):
    def __init__(self, tag: str, value: str | None, message: str) -> None:
        super().__init__(message)
        self.problem = TagProblem(tag, value, message)


def _parse(
    tags: Mapping[str, str],
    bound_tenant: str | None,
    run_id: str,
    submit_time: float,
    projects: Collection[str] | None,
    catalog: Catalog | Any,
) -> Request | None:
    _unknown_keys(tags)
    gpus, milli = _gpu_ask(tags)
    if gpus == 0:
        for key in (GPU_MEMORY_GB, MIN_COMPUTE_LEVEL, GPU_MODEL):
            if key in tags:
                raise _Bad(key, tags[key], f"{key} is set but the run asks for no GPU: add {GPUS} or {GPU_MILLI}")
        return None
    tenant = _tenant(tags, bound_tenant)
    project = _project(tags, tenant, projects)
    tier = _tier(tags)
    memory_gb = _number(tags, GPU_MEMORY_GB, "a GPU memory in GB greater than 0, e.g. 40", minimum=0.0, strict=True)
    level = _integer(tags, MIN_COMPUTE_LEVEL, "a whole number >= 0 (the catalog's compute level)", minimum=0)
    models = _models(tags, default_catalog() if catalog is DEFAULT_CATALOG else catalog)
    return Request(
        id=run_id,
        tenant=tenant,
        project=project,
        tier=tier,
        submit_time=_number(tags, SUBMIT_TIME, "a Unix time", minimum=0.0) or submit_time,
        gpus=gpus,
        milli_per_gpu=milli,
        gpu_memory_mib=math.ceil((memory_gb or 0.0) * 1024),
        min_compute_level=int(level or 0),
        gpu_models=models,
        preempted=int(_integer(tags, PREEMPTED, "a whole number >= 0", minimum=0) or 0),
        reclaimed_at=_number(tags, RECLAIMED_AT, "a Unix time", minimum=0.0),
        reclaims=int(_integer(tags, RECLAIMS, "a whole number >= 0", minimum=0) or 0),
    )


def _unknown_keys(tags: Mapping[str, str]) -> None:
    known = set(REQUEST_TAGS) | set(PLATFORM_TAGS) | set(RECLAIM_TAGS) | {SUBMIT_TIME, PREEMPTED, PARENT_RUN}
    for key in sorted(tags):
        if key.startswith(PREFIX) and key not in known:
            close = difflib.get_close_matches(key, REQUEST_TAGS, n=1)
            hint = f"did you mean {close[0]}?" if close else f"known request tags: {', '.join(REQUEST_TAGS)}"
            raise _Bad(key, str(tags[key]), f"unknown tag {key}: {hint}")


def _gpu_ask(tags: Mapping[str, str]) -> tuple[int, int]:
    """(GPUs, milli per GPU): whole GPUs from `xirang/gpus`, a fraction of one from `xirang/gpu-milli`."""
    if GPUS in tags and GPU_MILLI in tags:
        raise _Bad(
            GPU_MILLI,
            str(tags[GPU_MILLI]),
            f"{GPUS} and {GPU_MILLI} are both set: use {GPUS} for whole GPUs or {GPU_MILLI} for a fraction of one",
        )
    if GPU_MILLI in tags:
        milli = _integer(tags, GPU_MILLI, f"a fraction of one GPU in milli-GPU, 1..{MILLI_PER_GPU} (500 = half)")
        if milli is None or not 0 <= milli <= MILLI_PER_GPU:
            raise _Bad(
                GPU_MILLI,
                str(tags[GPU_MILLI]),
                f"{GPU_MILLI}={tags[GPU_MILLI]!r} is out of range: give 1..{MILLI_PER_GPU} milli-GPU "
                f"(500 = half a GPU), or {GPUS} for whole GPUs",
            )
        return (1, milli) if milli else (0, MILLI_PER_GPU)
    gpus = _integer(tags, GPUS, "a whole number of GPUs >= 0 (for a fraction use xirang/gpu-milli)", minimum=0)
    return (gpus or 0, MILLI_PER_GPU)


def _tenant(tags: Mapping[str, str], bound: str | None) -> str:
    given = str(tags[TENANT]).strip() if TENANT in tags else None
    if bound is None:
        raise _Bad(
            TENANT,
            given,
            f"{TENANT}: the run's code location is bound to no tenant: map the location to a tenant under "
            "`locations:` in the platform config (xirang.yaml)",
        )
    if given is not None and given != bound:
        raise _Bad(
            TENANT,
            given,
            f"{TENANT}={given!r} names another tenant: runs of this code location are charged to {bound!r}; "
            f"remove the tag or set it to {bound!r}",
        )
    return bound


def _project(tags: Mapping[str, str], tenant: str, projects: Collection[str] | None) -> str:
    known = sorted(projects) if projects is not None else None
    if PROJECT not in tags or not str(tags[PROJECT]).strip():
        if known is not None and len(known) == 1:
            return known[0]
        choices = f": one of {', '.join(known)}" if known else ""
        raise _Bad(
            PROJECT, None, f"{PROJECT} is missing: tag the run with the project of {tenant!r} it runs for{choices}"
        )
    project = str(tags[PROJECT]).strip()
    if known is not None and project not in known:
        raise _Bad(
            PROJECT,
            project,
            f"{PROJECT}={project!r} is not a project of tenant {tenant!r}: use one of {', '.join(known)}",
        )
    return project


def _tier(tags: Mapping[str, str]) -> Tier:
    values = ", ".join(t.value for t in Tier)
    if TIER not in tags:
        raise _Bad(TIER, None, f"{TIER} is missing: a run that asks for GPUs must name its tier, one of {values}")
    try:
        return Tier(str(tags[TIER]).strip())
    except ValueError:
        raise _Bad(TIER, str(tags[TIER]), f"{TIER}={tags[TIER]!r} is not a tier: use one of {values}") from None


def _models(tags: Mapping[str, str], catalog: Catalog | None) -> frozenset[str]:
    if GPU_MODEL not in tags:
        return frozenset()
    raw = str(tags[GPU_MODEL])
    names = [n.strip() for n in raw.split("|")]
    if not all(names):
        raise _Bad(GPU_MODEL, raw, f"{GPU_MODEL}={raw!r} has an empty model name: give models separated by '|'")
    if catalog is None:
        return frozenset(names)
    out = set()
    for name in names:
        model = catalog.find(name)
        if model is None:
            close = catalog.suggest(name)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise _Bad(
                GPU_MODEL,
                raw,
                f"{GPU_MODEL}: unknown GPU model {name!r}: {hint}known models: {', '.join(catalog.names)}",
            )
        out.add(model.name)
    return frozenset(out)


def _integer(tags: Mapping[str, str], key: str, what: str, minimum: int | None = None) -> int | None:
    if key not in tags:
        return None
    raw = str(tags[key]).strip()
    try:
        value = int(raw)
    except ValueError:
        raise _Bad(key, raw, f"{key}={raw!r} is not a whole number: give {what}") from None
    if minimum is not None and value < minimum:
        raise _Bad(key, raw, f"{key}={raw!r} is below {minimum}: give {what}")
    return value


def _number(tags: Mapping[str, str], key: str, what: str, minimum: float, strict: bool = False) -> float | None:
    if key not in tags:
        return None
    raw = str(tags[key]).strip()
    try:
        value = float(raw)
    except ValueError:
        raise _Bad(key, raw, f"{key}={raw!r} is not a number: give {what}") from None
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        raise _Bad(key, raw, f"{key}={raw!r} is out of range: give {what}")
    return value


# -- the allocation a run carries once admitted -----------------------------------------------------------


def allocation_tag(allocation: Any, borrowed: bool, launcher: str) -> str:
    """The JSON written on an admitted run (`xirang/allocation`): its GPU slices, per-node shares,
    whether it is borrowed and which launcher runs it. `allocation` is a core `Allocation`."""
    placement = allocation.placement
    doc = {
        "request": allocation.id,
        "gpus": [
            {"node": s.node, "gpu": s.gpu, "milli": s.milli, "gpu_memory_mib": s.gpu_memory_mib}
            for s in placement.slices
        ],
        "nodes": [{"node": sh.node, "cpu_milli": sh.cpu_milli, "memory_mib": sh.memory_mib} for sh in placement.shares],
        "milli": placement.milli,
        "borrowed": borrowed,
        "launcher": launcher,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class RunAllocation:
    """What an admitted run holds, as its ops read it (decoded from `xirang/allocation`)."""

    request: str
    gpus: tuple[tuple[str, int, int, int], ...]  # (node, GPU index, milli, GPU memory MiB) per GPU slice
    nodes: tuple[tuple[str, int, int], ...]  # (node, CPU milli, memory MiB) per node
    milli: int
    borrowed: bool
    launcher: str

    @property
    def node(self) -> str:
        """The (first) node the run sits on; "" for a run placed on no node."""
        return self.nodes[0][0] if self.nodes else (self.gpus[0][0] if self.gpus else "")

    @property
    def gpu_count(self) -> int:
        """How many GPUs the run touches (a fraction of one GPU counts 1)."""
        return len(self.gpus)

    def device_ids(self, node: str | None = None) -> list[int]:
        """The GPU indices held on `node` (default: the first node), sorted."""
        wanted = node or self.node
        return sorted({g for n, g, _, _ in self.gpus if n == wanted})

    @property
    def gpu_memory_mib(self) -> int:
        """GPU memory held over all slices, MiB."""
        return sum(m for _, _, _, m in self.gpus)


def read_allocation_tag(value: str | None) -> RunAllocation | None:
    """The allocation a run carries (`xirang/allocation`), or None when it has none yet."""
    if not value:
        return None
    doc = json.loads(value)
    if not isinstance(doc, dict) or not doc:
        return None
    return RunAllocation(
        request=str(doc.get("request", "")),
        gpus=tuple((g["node"], int(g["gpu"]), int(g["milli"]), int(g.get("gpu_memory_mib", 0))) for g in doc["gpus"]),
        nodes=tuple((n["node"], int(n["cpu_milli"]), int(n["memory_mib"])) for n in doc["nodes"]),
        milli=int(doc["milli"]),
        borrowed=bool(doc["borrowed"]),
        launcher=str(doc.get("launcher", "local")),
    )
