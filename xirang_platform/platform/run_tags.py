"""The run tags that are the contract between a Dagster run and the platform (DESIGN.md section 7).

No Dagster here: the coordinator, the tick, the simulator and the tests read the same keys and the
same parser. A run says who pays and what it needs with `xirang/*` request tags; `parse_submission`
(the coordinator, on what a user submits) and `parse` (the tick, on what the coordinator wrote) turn
them into the scheduler core's `Request`, or into a `TagProblem` that names the tag and the fix.

- **Request tags** override what the run's assets declare field by field (`xirang/gpus` and
  `xirang/gpu-milli` are one field, the GPU ask); a tag may not ask for less than the assets declare.
- **Numbers** are ASCII decimal digits within `BOUNDS` (no sign, exponent, `_`, spaces or other
  scripts' digits; GPU memory and times may have one decimal point). Every bound is in that table.
- **Platform tags** (`PLATFORM_TAGS`: the gate, the hold reason, the allocation, the lineage of a
  resumption, ...) are written by the coordinator and the tick alone: `parse_submission` never reads
  them, the coordinator blanks a user's. What a resumption inherits comes in as a `Lineage` the
  coordinator read from the ledger's record of the preempted request.
- A user's tag holding `""` or spaces is a bad value; on a submitted run `""` is a tag the platform
  blanked (Dagster run tags cannot be deleted) and counts as absent.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Collection, Mapping
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
ASK_TAGS = (GPUS, GPU_MILLI)  # one field: whole GPUs or a fraction of one

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
PLATFORM_TAGS = (
    GATE,
    HOLD_REASON,
    ALLOCATION,
    ENV,
    PREEMPTED_BY,
    PARENT_RUN,
    RESUME,
    NOTICE,
    AFTER_NOTICE,
    *LINEAGE_TAGS,
)

PRIORITY = "dagster/priority"  # Dagster's queue order; set from the tier, never from the user
K8S_CONFIG = "dagster-k8s/config"  # stripped from users; the tick writes it for the k8s launcher

# Dagster's queue daemon launches higher priorities first: P0 before P1 before P2, with room between.
PRIORITY_BY_RANK = {0: 200, 1: 100, 2: 0}
NO_GPU_PRIORITY = 0

DEFAULT_CATALOG = object()  # sentinel: check `xirang/gpu-model` against the bundled GPU catalog


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
# Every number a run tag may hold (DESIGN.md section 7); the one place the bounds live.
BOUNDS = {
    GPUS: Bound(0, 100_000, False, "a whole number of GPUs", f"for a fraction of one GPU use {GPU_MILLI}"),
    GPU_MILLI: Bound(1, MILLI_PER_GPU - 1, False, "milli of one GPU", f"500 = half; for whole GPUs use {GPUS}"),
    GPU_MEMORY_GB: Bound(0, 10_000, True, "GPU memory per GPU in GB", "e.g. 40 or 0.5"),
    MIN_COMPUTE_LEVEL: Bound(0, 100_000, False, "a whole number, the GPU catalog's compute level"),
    SUBMIT_TIME: Bound(0, MAX_UNIX_TIME, True, "a Unix time in seconds"),
    RECLAIMED_AT: Bound(0, MAX_UNIX_TIME, True, "a Unix time in seconds"),
    PREEMPTED: Bound(0, MAX_COUNT, False, "a whole number of preemptions"),
    RECLAIMS: Bound(0, MAX_COUNT, False, "a whole number of reclaims"),
}
_WHOLE = re.compile(r"[0-9]{1,24}")  # ASCII digits only (`\d` would take other scripts' digits)
_DECIMAL = re.compile(r"[0-9]{1,24}(\.[0-9]{1,24})?")


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


def asks_for_gpus(tags: Mapping[str, str]) -> bool:
    """Whether the tags ask for any GPU (a run that does not passes the gate untouched)."""
    return any(key in tags and str(tags[key]).strip() not in ("", "0") for key in ASK_TAGS)


def ask_milli(tags: Mapping[str, str]) -> int:
    """The GPU milli the tags ask for in all (GPUs x milli per GPU); 0 when they ask for none or their
    ask does not parse."""
    try:
        gpus, milli = _gpu_ask({k: str(v) for k, v in tags.items() if str(v) != ""})
    except _Bad:
        return 0
    return gpus * milli


def request_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """Only the `xirang/*` tags a user may write to describe a request."""
    return {k: str(v) for k, v in tags.items() if k in REQUEST_TAGS}


def lineage_tags(lineage: Lineage) -> dict[str, str]:
    """The tags that state `lineage` on a run (what `parse` reads back): the submit time always, the
    preemptions and reclaims when there were any."""
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


def parse(
    tags: Mapping[str, str],
    bound_tenant: str | None,
    *,
    run_id: str = "run",
    submit_time: float = 0.0,
    projects: Collection[str] | None = None,
    catalog: Catalog | Any = DEFAULT_CATALOG,
) -> Request | TagProblem | None:
    """The request a submitted run's tags describe (the tick's reader of what the coordinator wrote):
    None when it asks for no GPU, a `TagProblem` when a tag is bad. `bound_tenant` is the tenant of
    the run's code location (a tag naming another fails); `projects` are that tenant's projects
    (None: not checked); `catalog` checks `xirang/gpu-model` (None: not checked). The lineage comes
    from the run's lineage tags, `submit_time` where it has none. A tag whose value is the empty
    string counts as absent (how the platform blanks a tag)."""
    tags = {k: str(v) for k, v in tags.items() if str(v) != ""}
    try:
        _unknown_keys(tags)
        return _parse(tags, bound_tenant, run_id, lambda: _lineage(tags, submit_time), projects, catalog)
    except _Bad as bad:
        return bad.problem


def parse_submission(
    given: Mapping[str, str],
    declared: Mapping[str, str],
    bound_tenant: str | None,
    *,
    run_id: str,
    lineage: Lineage,
    projects: Collection[str] | None = None,
    catalog: Catalog | Any = DEFAULT_CATALOG,
) -> Request | TagProblem | None:
    """The request of a run as a user submits it (the coordinator's reader): its own request tags
    `given` over what its assets declare (`declared`), field by field, with the `lineage` the
    platform gives it. Platform tags in `given` are not read. A given tag holding `""` or spaces
    is a problem, and so is a GPU ask below the declared one (a tag cannot drop a declared need);
    the rest as `parse`."""
    try:
        _unknown_keys(given)
        asked = _asked(given, declared)
        return _parse(asked, bound_tenant, run_id, lambda: lineage, projects, catalog)
    except _Bad as bad:
        return bad.problem


class _Bad(Exception):
    def __init__(self, tag: str, value: str | None, message: str) -> None:
        super().__init__(message)
        self.problem = TagProblem(tag, value, message)


def _asked(given: Mapping[str, str], declared: Mapping[str, str]) -> dict[str, str]:
    """The request tags a submission stands for: `given` over `declared`, field by field."""
    user = request_tags(given)
    for key, other in (ASK_TAGS, ASK_TAGS[::-1]):
        if user.get(key) == "" and user.get(other):
            del user[key]  # the other spelling of an ask the platform restated (a re-execution copies both)
    for key in sorted(user):
        if not user[key].strip():
            fix = BOUNDS[key].text() if key in BOUNDS else "a value"
            raise _Bad(key, user[key], f"{key}={user[key]!r} is empty: remove the tag, or give {fix}")
    base = {k: v for k, v in request_tags(declared).items() if v != ""}
    if any(k in user for k in ASK_TAGS):
        asked = {k: v for k, v in base.items() if k not in ASK_TAGS} | user
    else:
        asked = base | user
    _not_below(base, asked, user)
    return asked


def _not_below(declared: Mapping[str, str], asked: Mapping[str, str], user: Mapping[str, str]) -> None:
    """A user's tag may raise what the assets declare, never lower it: the GPU milli and the GPU memory."""
    try:
        want_gpus, want_milli = _gpu_ask(declared)
        want_memory = _number(declared, GPU_MEMORY_GB) or 0.0
        gpus, milli = _gpu_ask(asked)
        memory = _number(asked, GPU_MEMORY_GB) or 0.0
    except _Bad:
        return  # `_parse` reports a bad value of the run's own; a bad declaration it replaces is moot
    key = next((k for k in ASK_TAGS if k in user), None)
    if key is not None and gpus * milli < want_gpus * want_milli:
        raise _Bad(
            key,
            user[key],
            f"{key}={user[key]!r} asks for less than the run's assets declare ({_ask_text(want_gpus, want_milli)}): "
            f"a tag cannot drop a declared need; remove {key} or ask for at least that",
        )
    if GPU_MEMORY_GB in user and memory < want_memory:
        raise _Bad(
            GPU_MEMORY_GB,
            user[GPU_MEMORY_GB],
            f"{GPU_MEMORY_GB}={user[GPU_MEMORY_GB]!r} is below the {declared[GPU_MEMORY_GB]} GB the run's assets "
            f"declare: remove the tag or give at least {declared[GPU_MEMORY_GB]}",
        )


def _ask_text(gpus: int, milli: int) -> str:
    return f"{GPUS}={gpus}" if milli == MILLI_PER_GPU else f"{GPU_MILLI}={milli}"


def _parse(
    tags: Mapping[str, str],
    bound_tenant: str | None,
    run_id: str,
    lineage: Callable[[], Lineage],
    projects: Collection[str] | None,
    catalog: Catalog | Any,
) -> Request | None:
    for key in sorted(k for k in tags if k in REQUEST_TAGS):
        _plain(tags, key)
    if TENANT in tags:  # a run without GPUs cannot name another tenant either
        _tenant(tags, bound_tenant)
    gpus, milli = _gpu_ask(tags)
    if gpus == 0:
        for key in (GPU_MEMORY_GB, MIN_COMPUTE_LEVEL, GPU_MODEL):
            if key in tags:
                raise _Bad(key, tags[key], f"{key} is set but the run asks for no GPU: add {GPUS} or {GPU_MILLI}")
        return None
    tenant = _tenant(tags, bound_tenant)
    project = _project(tags, tenant, projects)
    tier = _tier(tags)
    memory_gb = _number(tags, GPU_MEMORY_GB)
    level = _number(tags, MIN_COMPUTE_LEVEL)
    models = _models(tags, default_catalog() if catalog is DEFAULT_CATALOG else catalog)
    came = lineage()
    return Request(
        id=run_id,
        tenant=tenant,
        project=project,
        tier=tier,
        submit_time=came.submit_time,
        gpus=gpus,
        milli_per_gpu=milli,
        gpu_memory_mib=math.ceil((memory_gb or 0.0) * 1024),
        min_compute_level=int(level or 0),
        gpu_models=models,
        preempted=came.preempted,
        reclaimed_at=came.reclaimed_at,
        reclaims=came.reclaims,
    )


def _lineage(tags: Mapping[str, str], submit_time: float) -> Lineage:
    """The lineage a submitted run's tags state (`lineage_tags`), `submit_time` where it has none."""
    submitted = _number(tags, SUBMIT_TIME)
    return Lineage(
        submit_time if submitted is None else submitted,
        int(_number(tags, PREEMPTED) or 0),
        _number(tags, RECLAIMED_AT),
        int(_number(tags, RECLAIMS) or 0),
    )


def _unknown_keys(tags: Mapping[str, str]) -> None:
    known = set(REQUEST_TAGS) | set(PLATFORM_TAGS)
    for key in sorted(tags):
        if key.startswith(PREFIX) and key not in known:
            close = difflib.get_close_matches(key, REQUEST_TAGS, n=1)
            hint = f"did you mean {close[0]}?" if close else f"known request tags: {', '.join(REQUEST_TAGS)}"
            raise _Bad(key, str(tags[key]), f"unknown tag {key}: {hint}")


def _plain(tags: Mapping[str, str], key: str) -> str:
    """A request tag's value, refused when it is blank or has spaces around it."""
    raw = tags[key]
    if not raw.strip():
        raise _Bad(key, raw, f"{key}={raw!r} is blank: remove the tag or give a value")
    if raw != raw.strip():
        raise _Bad(key, raw, f"{key}={raw!r} has spaces around its value: write {raw.strip()!r}")
    return raw


def _gpu_ask(tags: Mapping[str, str]) -> tuple[int, int]:
    """(GPUs, milli per GPU): whole GPUs from `xirang/gpus`, a fraction of one from `xirang/gpu-milli`."""
    if GPUS in tags and GPU_MILLI in tags:
        raise _Bad(
            GPU_MILLI,
            str(tags[GPU_MILLI]),
            f"{GPUS} and {GPU_MILLI} are both set: use {GPUS} for whole GPUs or {GPU_MILLI} for a fraction of one",
        )
    milli = _number(tags, GPU_MILLI)
    if milli is not None:
        return (1, int(milli))
    return (int(_number(tags, GPUS) or 0), MILLI_PER_GPU)


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


def _number(tags: Mapping[str, str], key: str) -> float | None:
    """The number tag `key` holds, within its `BOUNDS` (None when absent): ASCII digits, and one
    decimal point where the bound allows it."""
    if key not in tags:
        return None
    raw = str(tags[key])
    bound = BOUNDS[key]
    if not (_DECIMAL if bound.decimal else _WHOLE).fullmatch(raw):
        kind = "a plain decimal number" if bound.decimal else "a whole number in ASCII digits"
        raise _Bad(key, raw, f"{key}={raw!r} is not {kind}: give {bound.text()}")
    value = float(raw) if bound.decimal else int(raw)
    if not bound.low <= value <= bound.high:
        raise _Bad(key, raw, f"{key}={raw!r} is out of range: give {bound.text()}")
    return value


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
