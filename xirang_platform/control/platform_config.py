"""The platform config (`xirang.yaml`): what the coordinator, the tick and the resource share.

No Dagster here. One YAML file, found at `XIRANG_CONFIG` or `./xirang.yaml`; relative paths in it
are relative to the file:

```yaml
pool: null                  # inventory: YAML or openb node CSV; null = the bundled pool
ledger_url: null            # null = XIRANG_LEDGER_URL, else sqlite:///.xirang/ledger.sqlite (beside this file)
launcher: local             # local (processes, CUDA_VISIBLE_DEVICES) or k8s (dagster-k8s/config tag)
tenants:                    # the tenants file format (data/tenants.example.yaml)
  research: {quota_gpus: 64, projects: {llm: {quota_gpus: 48}, vision: {}}}
  product: {quota_gpus: 64, projects: {serving: {}, ranking: {}}}
locations:                  # Dagster code location -> the tenant its runs are charged to
  research: research
  product: product
autoscaling: autoscaling.yaml  # optional: the inference services the autoscaling sensor scales
tick:
  interval_s: 5             # the scheduling tick's minimum interval
  location: research        # the one code location whose sensors run the tick and the release
  cycle_budget_s: 15        # the cycle's wall-clock guard: requests not reached by then wait `deferred`
scheduler:                  # SchedulerConfig; every key optional
  min_runtime_s: 600
  min_runtime_by_level: {P0: 0}  # per preemptor tier level, in place of min_runtime_s (replaces the default)
  starvation_wait_s: 1800
  reclaim_backoff_s: 1800   # a reclaimed borrower borrows again this long later, doubled per reclaim
  lend_after_s: 1800        # ... or sooner out of idle quota that stayed idle this long
  checkpoint_interval_s: 1800  # how often training checkpoints (victim choice; unset: since its start)
  lend_forecast_s: 7200     # lend only idle quota forecast, from this much history, to stay idle a checkpoint interval
  elastic_grow_idle_s: 600  # elastic runs grow into units free this long (null: they never grow)
  preemption: true
  plan_steps_per_request: 1024  # the preemption search's budget, in steps (DESIGN.md 5.2)
  plan_steps_per_cycle: 200000
  overcommit: {max_ratio: 1.2, low: 0.7, high: 0.9}
  gpu_model_order:          # per tier (level or tag value), the GPU models placement tries first
    online-training: [H100-SXM, A100-80]   # models of the pool, catalog names or aliases; others after
    inference: [L40S, A10]
preemption_grace_s: {P0: 15, P1: 120}  # a victim's notice per preemptor tier (defaults: the tier table)
```
"""

from __future__ import annotations

import difflib
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field as ModelField
from pydantic import ValidationError, model_validator
from pydantic.types import Strict

from xirang_platform.base.config_model import ConfigModel, Problem, first_problem
from xirang_platform.control.notice import PreemptionGrace, parse_grace
from xirang_platform.control.tenants import TenantsError, book_from_dict
from xirang_platform.pool.catalog import default_catalog
from xirang_platform.pool.model import MILLI_PER_GPU, Pool
from xirang_platform.pool.readers import default_pool, read_pool
from xirang_platform.scheduling.preference import TIER_KEYS, GpuModelOrder
from xirang_platform.scheduling.quota import OvercommitPolicy, QuotaBook
from xirang_platform.scheduling.snapshot import SchedulerConfig

CONFIG_ENV = "XIRANG_CONFIG"
DEFAULT_CONFIG_NAME = "xirang.yaml"
LAUNCHERS = ("local", "k8s")
DEFAULT_TICK_INTERVAL_S = 5
# The cycle's wall-clock guard in the live tick: a quarter of Dagster's 60 s sensor timeout, leaving the
# rest for the ledger write and the run writes (DESIGN.md 5.6).
DEFAULT_CYCLE_BUDGET_S = 15.0


class PlatformConfigError(ValueError):
    """A platform config that cannot be used; the message names the file, the key and the fix."""


class PlatformConfigWarning(UserWarning):
    """A platform config that works but likely not as meant; the message names what and the fix."""


@dataclass(frozen=True)
class PlatformConfig:
    """The parsed platform config. `pool` and `book` are read once, on first use."""

    source: str
    pool_path: str | None
    ledger_url: str | None
    launcher: str
    tenants_doc: Mapping[str, Any]
    locations: Mapping[str, str]
    tick_interval_s: int = DEFAULT_TICK_INTERVAL_S
    tick_location: str | None = None
    tick_cycle_budget_s: float = DEFAULT_CYCLE_BUDGET_S
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    grace: PreemptionGrace = field(default_factory=PreemptionGrace)
    autoscaling_path: str | None = None

    @cached_property
    def pool(self) -> Pool:
        """The pool inventory: the named file, else the bundled pool."""
        return read_pool(self.pool_path) if self.pool_path else default_pool()

    @cached_property
    def book(self) -> QuotaBook:
        """Every tenant's and project's quota in milli-GPU."""
        try:
            return book_from_dict(dict(self.tenants_doc), self.pool.gpu_milli, self.overcommit, source=self.source)
        except TenantsError as e:
            raise PlatformConfigError(str(e)) from None

    @property
    def overcommit(self) -> OvercommitPolicy:
        """The overcommit policy shared by the cycle and the ledger."""
        return self.scheduler.overcommit

    def tenant_for(self, location: str | None) -> str | None:
        """The tenant a code location's runs are charged to (None when unmapped)."""
        return self.locations.get(location) if location is not None else None

    def projects_of(self, tenant: str) -> list[str]:
        """The projects of `tenant`, sorted."""
        return sorted(p for (t, p) in self.book.projects if t == tenant)

    def hosts_tick(self, location: str | None) -> bool:
        """Whether `location` runs the tick and release sensors (the first mapped location by default)."""
        wanted = self.tick_location or (sorted(self.locations)[0] if self.locations else None)
        return location is None or location == wanted


def config_path(path: str | Path | None = None) -> Path:
    """The platform config file: `path`, else `XIRANG_CONFIG`, else `./xirang.yaml`."""
    return Path(path or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_NAME)


def load_config(path: str | Path | None = None) -> PlatformConfig:
    """Read and check the platform config (see the module docstring for the format)."""
    file = config_path(path)
    if not file.is_file():
        raise PlatformConfigError(
            f"{file}: no platform config here: copy xirang.yaml from the repository root, or point {CONFIG_ENV} at one"
        )
    try:
        doc = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise PlatformConfigError(f"{file}: not valid YAML ({e}); see xirang.yaml at the repository root") from None
    return config_from_dict(doc or {}, base=file.parent, source=str(file))


class _Tick(ConfigModel):
    interval_s: Annotated[int, ModelField(ge=1), Strict()] = DEFAULT_TICK_INTERVAL_S
    location: str | None = None
    cycle_budget_s: Annotated[float, ModelField(gt=0, le=50)] = DEFAULT_CYCLE_BUDGET_S


class _Overcommit(ConfigModel):
    max_ratio: float | None = None
    low: float | None = None
    high: float | None = None


class _Scheduler(ConfigModel):
    min_runtime_s: float | None = None
    min_runtime_by_level: dict[str, float] | None = None
    starvation_wait_s: float | None = None
    reclaim_backoff_s: float | None = None
    lend_after_s: float | None = None
    checkpoint_interval_s: float | None = None
    lend_forecast_s: float | None = None
    elastic_grow_idle_s: float | None = None
    preemption: bool = True
    plan_steps_per_request: Annotated[int, Strict()] | None = None
    plan_steps_per_cycle: Annotated[int, Strict()] | None = None
    overcommit: _Overcommit | None = None
    gpu_model_order: dict[str, list[str] | str] | None = None


class _PlatformFile(ConfigModel):
    """The file's schema; what needs the pool or the catalog is checked after (`config_from_dict`)."""

    pool: str | None = None
    ledger_url: str | None = None
    launcher: Literal[LAUNCHERS] | None = None  # type: ignore[valid-type]
    tenants: Annotated[dict[str, Any], ModelField(min_length=1)]
    locations: dict[str, str] | None = None
    autoscaling: str | None = None
    tick: _Tick | None = None
    scheduler: _Scheduler | None = None
    preemption_grace_s: Any = None

    @model_validator(mode="after")
    def _names_known(self) -> _PlatformFile:
        for location, tenant in (self.locations or {}).items():
            if tenant not in self.tenants:
                raise ValueError(
                    f"locations.{location} names tenant {tenant!r}, which `tenants:` lacks: "
                    f"use one of {', '.join(sorted(self.tenants))}"
                )
        hosting = self.tick.location if self.tick is not None else None
        if hosting is not None and hosting not in (self.locations or {}):
            raise ValueError(
                f"tick.location {hosting!r} is not under `locations:`: use one of "
                f"{', '.join(sorted(self.locations or {}))}"
            )
        return self


_ORDER_EXAMPLE = "e.g. {online-training: [H100-SXM, A100-80], inference: [L40S, A10]}"


def _message(source: str, problem: Problem) -> str:
    """The problem in this file's words: `<file>: <key>: <problem and fix>`."""
    steps, where = problem.path, problem.where()
    if problem.kind == "extra_forbidden":
        return problem.unknown_key_message(source)
    if steps[:2] == ("scheduler", "gpu_model_order"):
        if len(steps) == 2:
            return f"{source}: {where}: expected a mapping of tier to a list of GPU models, {_ORDER_EXAMPLE}"
        return f"{source}: {problem.where(steps[:3])}: expected a non-empty list of GPU models, {_ORDER_EXAMPLE}"
    if steps == ("scheduler", "min_runtime_by_level"):
        return f"{source}: {where}: expected a mapping of tier level to seconds, e.g. {{P0: 0}}"
    if problem.kind in ("model_type", "model_attributes_type"):
        return f"{source}{': ' + where if where else ''}: expected a mapping with keys {', '.join(problem.fields)}"
    if steps == ("launcher",):
        return f"{source}: launcher {problem.value!r} is not known: use one of {', '.join(LAUNCHERS)}"
    if steps[:1] == ("tenants",):
        return f"{source}: `tenants:` must map tenant names to quotas (data/tenants.example.yaml)"
    if steps[:1] == ("locations",):
        return f"{source}: `locations:` must map Dagster code location names to tenants"
    if steps == ("tick", "interval_s"):
        return f"{source}: tick.interval_s must be a whole number of seconds >= 1, got {problem.value!r}"
    if steps == ("tick", "cycle_budget_s"):
        return (
            f"{source}: tick.cycle_budget_s must be seconds above 0 and at most 50 (well under the sensor's "
            f"60 s timeout), got {problem.value!r}"
        )
    return f"{source}{': ' + where if where else ''}: {problem.message}"


def config_from_dict(doc: Any, base: Path = Path("."), source: str = "xirang.yaml") -> PlatformConfig:
    """The platform config of a parsed document; relative paths resolve against `base`."""
    try:
        file = _PlatformFile.model_validate(doc)
    except ValidationError as e:
        raise PlatformConfigError(_message(source, first_problem(e, _PlatformFile))) from None
    tick = file.tick or _Tick()
    config = PlatformConfig(
        source=source,
        pool_path=_path(file.pool, base),
        ledger_url=_ledger_url(file.ledger_url, base),
        launcher=file.launcher or "local",
        tenants_doc={"tenants": file.tenants},
        locations=dict(file.locations or {}),
        tick_interval_s=tick.interval_s,
        tick_location=tick.location,
        tick_cycle_budget_s=tick.cycle_budget_s,
        scheduler=_scheduler(file.scheduler or _Scheduler(), source),
        grace=_grace(file.preemption_grace_s, source),
        autoscaling_path=_path(file.autoscaling, base),
    )
    config.book  # noqa: B018 -- check quotas now, not at the first tick
    _check_order_models(config)
    if (overcommitted := quota_overcommit(config)) is not None:
        warnings.warn(overcommitted, PlatformConfigWarning, stacklevel=2)
    return config


def quota_overcommit(config: PlatformConfig) -> str | None:
    """Why the tenants' quotas cannot all be used at once (they sum past the pool's GPUs), or None.
    Allowed (the design overcommits: admission past the pool waits or preempts), but said out loud."""
    total, pool = sum(config.book.tenants.values()), config.pool.gpu_milli
    if total <= pool:
        return None
    return (
        f"{config.source}: tenant quotas sum to {total / MILLI_PER_GPU:g} GPUs, "
        f"more than the pool's {pool / MILLI_PER_GPU:g}: "
        "tenants cannot all use their quota at once (past the pool, admission waits or preempts); "
        "lower a tenant's quota_gpus if that is not meant"
    )


def _scheduler(doc: _Scheduler, source: str) -> SchedulerConfig:
    """`SchedulerConfig` from the `scheduler:` section (absent keys: its defaults), which judges the values."""
    # Values given, the two that null switches off (given as null: None), then the sections.
    given = doc.model_dump(include=_GIVEN & doc.model_fields_set, exclude_none=True)
    given |= doc.model_dump(include=_NULLABLE & doc.model_fields_set)
    levels = doc.min_runtime_by_level
    overcommit = doc.overcommit.model_dump(exclude_none=True) if doc.overcommit else {}
    order = _gpu_model_order(doc.gpu_model_order, f"{source}: scheduler.gpu_model_order")
    try:
        return SchedulerConfig(
            **given,
            preemption=doc.preemption,
            overcommit=OvercommitPolicy(**overcommit),
            min_runtime_by_level=_DEFAULTS.min_runtime_by_level if levels is None else tuple(sorted(levels.items())),
            gpu_model_order=order,
        )
    except (TypeError, ValueError) as e:
        raise PlatformConfigError(f"{source}: scheduler: {e}") from None


_DEFAULTS = SchedulerConfig()
# Keys passed to `SchedulerConfig` as given (it judges them), absent ones left to its defaults.
_GIVEN = {
    "min_runtime_s",
    "starvation_wait_s",
    "reclaim_backoff_s",
    "lend_after_s",
    "plan_steps_per_request",
    "plan_steps_per_cycle",
}
_NULLABLE = {"checkpoint_interval_s", "lend_forecast_s", "elastic_grow_idle_s"}


def _grace(doc: Any, source: str) -> PreemptionGrace:
    try:
        return parse_grace(doc, f"{source}: preemption_grace_s")
    except ValueError as e:
        raise PlatformConfigError(str(e)) from None


def _gpu_model_order(doc: Mapping[str, list[str] | str] | None, where: str) -> GpuModelOrder:
    """`scheduler.gpu_model_order` (tier -> list of GPU models), with catalog aliases read as the
    catalog's names (`H100` -> `H100-SXM`); whether the models are the pool's is checked later."""
    if doc is None:
        return GpuModelOrder()
    catalog = default_catalog()
    orders: dict[str, list[str]] = {}
    for tier, models in doc.items():
        if tier not in TIER_KEYS:
            close = difflib.get_close_matches(str(tier), TIER_KEYS, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(TIER_KEYS)}"
            raise PlatformConfigError(f"{where}: unknown tier {tier!r}; {hint}")
        names = [models] if isinstance(models, str) else models
        if not names:
            raise PlatformConfigError(f"{where}.{tier}: expected a non-empty list of GPU models, {_ORDER_EXAMPLE}")
        orders[tier] = [model.name if (model := catalog.find(name)) is not None else name for name in names]
    try:
        return GpuModelOrder.of(orders)
    except ValueError as e:
        raise PlatformConfigError(f"{where}: {e}") from None


def _check_order_models(config: PlatformConfig) -> None:
    """Every model `scheduler.gpu_model_order` names is a GPU model of the pool."""
    present = config.pool.models
    for tier, models in config.scheduler.gpu_model_order.by_tier:
        for name in models:
            if name not in present:
                close = difflib.get_close_matches(name, present, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise PlatformConfigError(
                    f"{config.source}: scheduler.gpu_model_order.{tier} names GPU model {name!r}, which the pool "
                    f"lacks: {hint}list models of the pool ({', '.join(present) or 'none'})"
                )


def _path(value: Any, base: Path) -> str | None:
    if not value:
        return None
    p = Path(str(value))
    return str(p if p.is_absolute() else base / p)


def _ledger_url(value: Any, base: Path) -> str | None:
    if not value:
        return None
    url = str(value)
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url[len(prefix) :].startswith("/"):
        path = base / url[len(prefix) :]
        path.parent.mkdir(parents=True, exist_ok=True)
        return prefix + str(path)
    return url
