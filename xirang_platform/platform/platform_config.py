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
scheduler:                  # SchedulerConfig; every key optional
  min_runtime_s: 600
  min_runtime_by_level: {P0: 0}  # per preemptor tier level, in place of min_runtime_s (replaces the default)
  starvation_wait_s: 1800
  reclaim_backoff_s: 1800   # a reclaimed borrower borrows again this long later, doubled per reclaim
  lend_after_s: 1800        # ... or sooner out of idle quota that stayed idle this long
  checkpoint_interval_s: 1800  # how often training checkpoints (victim choice; unset: since its start)
  lend_forecast_s: 7200     # lend only idle quota forecast, from this much history, to stay idle a checkpoint interval
  preemption: true
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
from typing import Any

import yaml

from xirang_platform.platform.notice import PreemptionGrace, parse_grace
from xirang_platform.platform.tenants import TenantsError, book_from_dict
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
_TOP_KEYS = (
    "pool",
    "ledger_url",
    "launcher",
    "tenants",
    "locations",
    "autoscaling",
    "tick",
    "scheduler",
    "preemption_grace_s",
)
_TICK_KEYS = ("interval_s", "location")
_SCHEDULER_KEYS = (
    "min_runtime_s",
    "min_runtime_by_level",
    "starvation_wait_s",
    "reclaim_backoff_s",
    "lend_after_s",
    "checkpoint_interval_s",
    "lend_forecast_s",
    "preemption",
    "overcommit",
    "gpu_model_order",
)
_OVERCOMMIT_KEYS = ("max_ratio", "low", "high")


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


def config_from_dict(doc: Any, base: Path = Path("."), source: str = "xirang.yaml") -> PlatformConfig:
    """The platform config of a parsed document; relative paths resolve against `base`."""
    if not isinstance(doc, dict):
        raise PlatformConfigError(f"{source}: expected a mapping with keys {', '.join(_TOP_KEYS)}")
    _known(source, doc, _TOP_KEYS)
    launcher = str(doc.get("launcher") or "local")
    if launcher not in LAUNCHERS:
        raise PlatformConfigError(f"{source}: launcher {launcher!r} is not known: use one of {', '.join(LAUNCHERS)}")
    tenants = doc.get("tenants")
    if not isinstance(tenants, dict) or not tenants:
        raise PlatformConfigError(f"{source}: `tenants:` must map tenant names to quotas (data/tenants.example.yaml)")
    locations = doc.get("locations") or {}
    if not isinstance(locations, dict):
        raise PlatformConfigError(f"{source}: `locations:` must map Dagster code location names to tenants")
    for location, tenant in locations.items():
        if tenant not in tenants:
            raise PlatformConfigError(
                f"{source}: locations.{location} names tenant {tenant!r}, which `tenants:` lacks: "
                f"use one of {', '.join(sorted(tenants))}"
            )
    tick = doc.get("tick") or {}
    _known(f"{source}: tick", tick, _TICK_KEYS)
    interval = tick.get("interval_s", DEFAULT_TICK_INTERVAL_S)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise PlatformConfigError(f"{source}: tick.interval_s must be a whole number of seconds >= 1, got {interval!r}")
    tick_location = tick.get("location")
    if tick_location is not None and tick_location not in locations:
        raise PlatformConfigError(
            f"{source}: tick.location {tick_location!r} is not under `locations:`: use one of "
            f"{', '.join(sorted(locations))}"
        )
    config = PlatformConfig(
        source=source,
        pool_path=_path(doc.get("pool"), base),
        ledger_url=_ledger_url(doc.get("ledger_url"), base),
        launcher=launcher,
        tenants_doc={"tenants": tenants},
        locations={str(k): str(v) for k, v in locations.items()},
        tick_interval_s=interval,
        tick_location=tick_location,
        scheduler=_scheduler(doc.get("scheduler") or {}, source),
        grace=_grace(doc.get("preemption_grace_s"), source),
        autoscaling_path=_path(doc.get("autoscaling"), base),
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


def _scheduler(doc: Any, source: str) -> SchedulerConfig:
    where = f"{source}: scheduler"
    if not isinstance(doc, dict):
        raise PlatformConfigError(f"{where}: expected a mapping with keys {', '.join(_SCHEDULER_KEYS)}")
    _known(where, doc, _SCHEDULER_KEYS)
    overcommit = doc.get("overcommit") or {}
    _known(f"{where}.overcommit", overcommit, _OVERCOMMIT_KEYS)
    by_level = doc.get("min_runtime_by_level")
    if by_level is not None and not isinstance(by_level, dict):
        raise PlatformConfigError(
            f"{where}.min_runtime_by_level: expected a mapping of tier level to seconds, e.g. {{P0: 0}}"
        )
    order = _gpu_model_order(doc.get("gpu_model_order"), f"{where}.gpu_model_order")
    try:
        policy = OvercommitPolicy(**{k: float(v) for k, v in overcommit.items()})
        defaults = SchedulerConfig()
        levels = defaults.min_runtime_by_level if by_level is None else tuple(sorted(by_level.items()))
        return SchedulerConfig(
            overcommit=policy,
            preemption=bool(doc.get("preemption", True)),
            min_runtime_s=float(doc.get("min_runtime_s", defaults.min_runtime_s)),
            min_runtime_by_level=tuple((str(k), float(v)) for k, v in levels),
            starvation_wait_s=float(doc.get("starvation_wait_s", defaults.starvation_wait_s)),
            reclaim_backoff_s=float(doc.get("reclaim_backoff_s", defaults.reclaim_backoff_s)),
            lend_after_s=float(doc.get("lend_after_s", defaults.lend_after_s)),
            checkpoint_interval_s=_seconds_or_none(doc, "checkpoint_interval_s", defaults.checkpoint_interval_s),
            lend_forecast_s=_seconds_or_none(doc, "lend_forecast_s", defaults.lend_forecast_s),
            gpu_model_order=order,
        )
    except (TypeError, ValueError) as e:
        raise PlatformConfigError(f"{where}: {e}") from None


def _grace(doc: Any, source: str) -> PreemptionGrace:
    try:
        return parse_grace(doc, f"{source}: preemption_grace_s")
    except ValueError as e:
        raise PlatformConfigError(str(e)) from None


def _gpu_model_order(doc: Any, where: str) -> GpuModelOrder:
    """`scheduler.gpu_model_order` (tier -> list of GPU models), with catalog aliases read as the
    catalog's names (`H100` -> `H100-SXM`); whether the models are the pool's is checked later."""
    if doc is None:
        return GpuModelOrder()
    example = "e.g. {online-training: [H100-SXM, A100-80], inference: [L40S, A10]}"
    if not isinstance(doc, dict):
        raise PlatformConfigError(f"{where}: expected a mapping of tier to a list of GPU models, {example}")
    catalog = default_catalog()
    orders: dict[str, list[str]] = {}
    for tier, models in doc.items():
        if tier not in TIER_KEYS:
            close = difflib.get_close_matches(str(tier), TIER_KEYS, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(TIER_KEYS)}"
            raise PlatformConfigError(f"{where}: unknown tier {tier!r}; {hint}")
        if isinstance(models, str):
            models = [models]
        if not isinstance(models, list) or not models:
            raise PlatformConfigError(f"{where}.{tier}: expected a non-empty list of GPU models, {example}")
        names = []
        for name in models:
            model = catalog.find(str(name))
            names.append(model.name if model is not None else str(name))
        orders[str(tier)] = names
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


def _seconds_or_none(doc: Mapping[str, Any], key: str, default: float | None) -> float | None:
    """`doc[key]` in seconds (null: None), or `default` when the key is absent."""
    if key not in doc:
        return default
    return None if doc[key] is None else float(doc[key])


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


def _known(where: str, doc: Any, allowed: tuple[str, ...]) -> None:
    if not isinstance(doc, dict):
        raise PlatformConfigError(f"{where}: expected a mapping with keys {', '.join(allowed)}")
    for key in doc:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(allowed)}"
            raise PlatformConfigError(f"{where}: unknown key {key!r}; {hint}")
