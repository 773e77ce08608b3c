"""A run's tags read as the scheduler core's `Request` (DESIGN.md section 7): `parse_submission`
(the coordinator, on what a user submits) and `parse` (the tick, on what the coordinator wrote) turn
them into a `Request`, or into a `TagProblem` that names the tag and the fix. The tag names and
their bounds are `run_tags`'.

- **Request tags** override what the run's assets declare field by field (`xirang/gpus`,
  `xirang/gpu-milli` and the elastic range `xirang/gpus-min`/`-max`/`-step` are one field, the GPU
  ask); a tag may not ask for less than the assets declare (a range: its minimum).
- **An elastic range** (DESIGN.md section 11) is for training tiers only, needs both ends, min <= max,
  and a step dividing max - min; the request asks its max while it waits (`Request.elastic`).
- **Numbers** are ASCII decimal digits within `run_tags.BOUNDS` (no sign, exponent, `_`, spaces or
  other scripts' digits; GPU memory and times may have one decimal point).
- **Platform tags** (`run_tags.PLATFORM_TAGS`) are never read by `parse_submission`. What a
  resumption inherits comes in as a `Lineage` the coordinator read from the ledger's record of the
  preempted request.
- A user's tag holding `""` or spaces is a bad value; on a submitted run `""` is a tag the platform
  blanked (Dagster run tags cannot be deleted) and counts as absent.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

from xirang_platform.control.run_tags import (
    ASK_TAGS,
    BOUNDS,
    EXPECTED_DURATION,
    GPU_ASK_TAGS,
    GPU_MEMORY_GB,
    GPU_MILLI,
    GPU_MODEL,
    GPUS,
    GPUS_MAX,
    GPUS_MIN,
    GPUS_STEP,
    MIN_COMPUTE_LEVEL,
    PLATFORM_TAGS,
    PREEMPTED,
    PREFIX,
    PROJECT,
    RANGE_TAGS,
    RECLAIMED_AT,
    RECLAIMS,
    REQUEST_TAGS,
    SUBMIT_TIME,
    TENANT,
    TIER,
    Lineage,
    TagProblem,
    request_tags,
)
from xirang_platform.pool.catalog import Catalog, default_catalog
from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.model import GpuRange, Request, Tier

ELASTIC_TIERS = (Tier.ONLINE_TRAINING, Tier.OFFLINE_TRAINING)  # the tiers a range may be asked on
DEFAULT_CATALOG = object()  # sentinel: check `xirang/gpu-model` against the bundled GPU catalog

_WHOLE = re.compile(r"[0-9]{1,24}")  # ASCII digits only (`\d` would take other scripts' digits)
_DECIMAL = re.compile(r"[0-9]{1,24}(\.[0-9]{1,24})?")


def ask_milli(tags: Mapping[str, str]) -> int:
    """The GPU milli the tags ask for in all (GPUs x milli per GPU); 0 when they ask for none or their
    ask does not parse."""
    try:
        gpus, milli = _gpu_ask({k: str(v) for k, v in tags.items() if str(v) != ""})
    except _Bad:
        return 0
    return gpus * milli


def expected_duration(tags: Mapping[str, str]) -> float | None:
    """The seconds a run's `xirang/expected-duration` tag says it takes; None when it has none (or a
    value the coordinator would have refused: a submitted run's tags were checked at submission)."""
    try:
        return _number({k: str(v) for k, v in tags.items() if str(v) != ""}, EXPECTED_DURATION)
    except _Bad:
        return None


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
    if any(user.get(k) for k in GPU_ASK_TAGS):
        for key in GPU_ASK_TAGS:
            if user.get(key) == "":
                del user[key]  # another spelling of an ask the platform restated (a re-execution copies both)
    for key in sorted(user):
        if not user[key].strip():
            fix = BOUNDS[key].text() if key in BOUNDS else "a value"
            raise _Bad(key, user[key], f"{key}={user[key]!r} is empty: remove the tag, or give {fix}")
    base = {k: v for k, v in request_tags(declared).items() if v != ""}
    if any(k in user for k in GPU_ASK_TAGS):
        asked = {k: v for k, v in base.items() if k not in GPU_ASK_TAGS} | user
    else:
        asked = base | user
    _not_below(base, asked, user)
    return asked


def _not_below(declared: Mapping[str, str], asked: Mapping[str, str], user: Mapping[str, str]) -> None:
    """A user's tag may raise what the assets declare, never lower it: the GPU milli and the GPU memory."""
    try:
        want_gpus, want_milli = _gpu_ask(declared, least=True)
        want_memory = _number(declared, GPU_MEMORY_GB) or 0.0
        gpus, milli = _gpu_ask(asked, least=True)
        memory = _number(asked, GPU_MEMORY_GB) or 0.0
    except _Bad:
        return  # `_parse` reports a bad value of the run's own; a bad declaration it replaces is moot
    key = next((k for k in GPU_ASK_TAGS if k in user), None)
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
    _number(tags, EXPECTED_DURATION)  # checked at submission; the queue view reads it (`expected_duration`)
    gpus, milli = _gpu_ask(tags)
    if gpus == 0:
        for key in (GPU_MEMORY_GB, MIN_COMPUTE_LEVEL, GPU_MODEL):
            if key in tags:
                raise _Bad(key, tags[key], f"{key} is set but the run asks for no GPU: add {GPUS} or {GPU_MILLI}")
        return None
    tenant = _tenant(tags, bound_tenant)
    project = _project(tags, tenant, projects)
    tier = _tier(tags)
    elastic = _elastic(tags)
    if elastic is not None and tier not in ELASTIC_TIERS:
        key = next(k for k in RANGE_TAGS if k in tags)
        raise _Bad(
            key,
            tags[key],
            f"{key}: an elastic range is for training runs, not {tier.value}: ask a fixed count with {GPUS}, "
            f"or use tier {' or '.join(t.value for t in ELASTIC_TIERS)}",
        )
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
        elastic=elastic,
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


def _gpu_ask(tags: Mapping[str, str], *, least: bool = False) -> tuple[int, int]:
    """(GPUs, milli per GPU): whole GPUs from `xirang/gpus`, a fraction of one from `xirang/gpu-milli`,
    an elastic range's largest size (`least`: its smallest) from `xirang/gpus-min`/`-max`."""
    elastic = _elastic(tags)
    if elastic is not None:
        return (elastic.min if least else elastic.max, MILLI_PER_GPU)
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


def _elastic(tags: Mapping[str, str]) -> GpuRange | None:
    """The elastic range the tags ask (None: they ask none), refused with the tag and the fix when it
    is set beside a count, has one end only, runs backwards or has a step that does not divide it."""
    given = [k for k in RANGE_TAGS if k in tags]
    if not given:
        return None
    for other in ASK_TAGS:
        if other in tags:
            raise _Bad(
                given[0],
                tags[given[0]],
                f"{given[0]} and {other} are both set: a run asks for a fixed count ({other}) or a range "
                f"({GPUS_MIN} and {GPUS_MAX}), not both; remove {other} or the range tags",
            )
    low, high = _number(tags, GPUS_MIN), _number(tags, GPUS_MAX)
    if low is None or high is None:
        missing, present = (GPUS_MIN, GPUS_MAX) if low is None else (GPUS_MAX, GPUS_MIN)
        if present not in tags:  # a step alone
            missing, present = GPUS_MIN, GPUS_STEP
        raise _Bad(
            missing,
            None,
            f"{missing} is missing: {present} is set, and an elastic range needs both {GPUS_MIN} and {GPUS_MAX} "
            f"(for a fixed count use {GPUS} alone)",
        )
    step = int(_number(tags, GPUS_STEP) or 1)
    low_n, high_n = int(low), int(high)
    if low_n > high_n:
        raise _Bad(
            GPUS_MIN,
            tags[GPUS_MIN],
            f"{GPUS_MIN}={low_n} is above {GPUS_MAX}={high_n}: the range runs from the smaller size to the larger; "
            f"swap them",
        )
    if (high_n - low_n) % step:
        fits = low_n + (high_n - low_n) // step * step
        raise _Bad(
            GPUS_STEP,
            tags[GPUS_STEP],
            f"{GPUS_STEP}={step} does not divide {GPUS_MAX} - {GPUS_MIN} = {high_n - low_n}: give a step that "
            f"divides it, or set {GPUS_MAX}={fits}",
        )
    return GpuRange(low_n, high_n, step)


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
