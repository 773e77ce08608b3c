"""The live autoscaler's service list (`autoscaling.yaml`) and its load sources. No Dagster here.

```yaml
services:
  sd:                           # the service's name (replica runs carry it as `xirang/service`)
    location: product           # the code location whose job runs one replica (its tenant pays)
    project: serving
    job: sd_replica             # the Dagster job of one replica
    replica_qps: 0.1            # QPS one replica serves
    replica_gpu_milli: 1000     # per replica: below 1000 a fraction of one GPU, else whole GPUs
    replica_memory_gb: 16       # GPU memory each of its GPUs must have
    min_replicas: 1             # optional, like max_replicas, headroom, up_cooldown_s, down_cooldown_s,
                                # down_tolerance (defaults: ServiceSpec's)
    deployed_model: true        # optional: replicas serve the tenant's deployed model (assets/serving.py):
                                # none starts before the first deployment; a new version rolls out
    load:                       # one of:
      scrape: {}                # the replicas' own /metrics, from the registry (the embedded default)
      # prometheus: {url: "http://prometheus:9090"}   # query default: sum(rate(REQUESTS{service="sd"}[1m]))
      # trace: {file: data/traces/alibaba_genai_sd_serving_2026/qps.csv, window_s: 600, start: 1764500000}
```

The file is found at `XIRANG_AUTOSCALING`, else where the platform config's `autoscaling:` says
(the bundled xirang.yaml names the bundled autoscaling.yaml), else `./autoscaling.yaml`; relative
paths in it are relative to the file. A `scrape` load reads the requests the replicas served (`load/scrape.py`); a
`prometheus` load asks the server's query API, by default for the rate of the replicas' request
counter; a `trace` load replays the file on the wall clock from `start` (unix seconds; default: when
the service is read), looped. Bad entries are an `AutoscalingConfigError` naming the file, the key
and the fix.
"""

from __future__ import annotations

import os
import time
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Annotated, Any, Protocol, get_type_hints

import yaml
from pydantic import (
    StrictBool,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from xirang_platform.base.config_model import ConfigModel, Problem, first_problem
from xirang_platform.load.prometheus import PrometheusQuery
from xirang_platform.load.scrape import REQUESTS_METRIC, ScrapeLoad
from xirang_platform.load.traces import DEFAULT_WINDOW_S, LoadError, LoadSeries, read_load
from xirang_platform.scheduling.replica_scaling import ServiceSpec

CONFIG_ENV = "XIRANG_AUTOSCALING"
DEFAULT_NAME = "autoscaling.yaml"
_TUNABLE = tuple(
    f.name for f in fields(ServiceSpec) if f.name not in ("name", "tenant", "project", "replica_gpu_memory_mib")
)


class AutoscalingConfigError(ValueError):
    """An autoscaling config that cannot be used; the message names the file, the key and the fix."""


class LiveLoad(Protocol):
    """Where a live service's QPS comes from."""

    def read(self, at: float | None = None) -> float | None:
        """The QPS at unix time `at` (None: now); None when there is no reading."""
        ...


@dataclass(frozen=True)
class TraceOnClock:
    """A load trace replayed on the wall clock: its step `t - start` (looped) at unix time `t`."""

    series: LoadSeries
    start: float

    def read(self, at: float | None = None) -> float | None:
        """The trace's QPS at unix time `at` (None: now), the trace looped over its own span."""
        t = time.time() if at is None else at
        offset = (t - self.start) % self.series.span_s if t >= self.start else -1.0
        return self.series.at(self.series.start + offset) if offset >= 0 else None


@dataclass(frozen=True)
class LiveService:
    """One autoscaled service on the platform: its policy spec, where its replicas run, its load."""

    spec: ServiceSpec
    location: str
    job: str
    load: LiveLoad | ScrapeLoad
    deployed_model: bool = False

    @property
    def load_source(self) -> str:
        """Where the load comes from: `scrape`, `prometheus` or `trace`."""
        if isinstance(self.load, ScrapeLoad):
            return "scrape"
        return "prometheus" if isinstance(self.load, PrometheusQuery) else "trace"


def config_file(path: str | Path | None = None) -> Path:
    """The autoscaling file: `XIRANG_AUTOSCALING`, else `path` (the platform config's `autoscaling:`),
    else ./autoscaling.yaml."""
    return Path(os.environ.get(CONFIG_ENV) or path or DEFAULT_NAME)


def read_services(path: str | Path, tenant_for: dict[str, str], now: float | None = None) -> list[LiveService]:
    """The services of an autoscaling file; `tenant_for` maps code locations to their tenants."""
    path = Path(path)
    if not path.is_file():
        raise AutoscalingConfigError(f"{path}: no such autoscaling file; set {CONFIG_ENV} or write {DEFAULT_NAME}")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise AutoscalingConfigError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict):
        raise AutoscalingConfigError(f"{path}: expected a top-level `services:` mapping of service names")
    try:
        services = _ServicesFile.model_validate(doc, context={"locations": tenant_for}).services
    except ValidationError as e:
        raise AutoscalingConfigError(_message(path, first_problem(e, _ServicesFile))) from None
    at = time.time() if now is None else now
    return [_service(path, name, body, tenant_for, at) for name, body in sorted(services.items())]


class _Scrape(ConfigModel):
    directory: str | None = None
    timeout_s: float = 2.0


class _Prometheus(ConfigModel):
    url: Annotated[str, StringConstraints(min_length=1)]
    query: str | None = None
    timeout_s: float = 5.0


class _Trace(ConfigModel):
    file: Annotated[str, StringConstraints(min_length=1)]
    window_s: float = DEFAULT_WINDOW_S
    start: float | None = None


class _Load(ConfigModel):
    """Exactly one of the three load sources."""

    scrape: _Scrape | None = None
    prometheus: _Prometheus | None = None
    trace: _Trace | None = None

    @model_validator(mode="after")
    def _one(self) -> _Load:
        if len(self.model_fields_set) != 1:
            raise ValueError(_ONE_LOAD)
        return self


class _ServiceBase(ConfigModel):
    location: str
    project: str = "default"
    job: str
    replica_memory_gb: float = 0
    deployed_model: StrictBool = False

    @field_validator("location")
    @classmethod
    def _a_location_of_the_platform(cls, location: str, info: ValidationInfo) -> str:
        known = (info.context or {}).get("locations", {})
        if location not in known:
            raise ValueError(
                f"{location!r} is not a code location of the platform ({', '.join(sorted(known)) or 'none'})"
            )
        return location


# A service's entry: the base keys, then ServiceSpec's tunables (as ServiceSpec declares them), then `load`.
_SPEC_TYPES = get_type_hints(ServiceSpec)
_SERVICE_FIELDS: dict[str, Any] = {
    f.name: (_SPEC_TYPES[f.name], ... if f.default is MISSING else f.default)
    for f in fields(ServiceSpec)
    if f.name in _TUNABLE
}
_ServiceFile = create_model("_ServiceFile", __base__=_ServiceBase, **_SERVICE_FIELDS, load=(_Load, ...))


class _ServicesFile(ConfigModel):
    services: dict[str, _ServiceFile]  # type: ignore[valid-type]


_ONE_LOAD = "give exactly one of scrape: {}, prometheus: {url, query} or trace: {file}"
_GIVE = {
    ("trace", "file"): "give file (a qps.csv, Azure LLM trace or t,qps CSV)",
    ("prometheus", "url"): "give url (http://host:9090) and optionally query",
}


def _message(path: Path, problem: Problem) -> str:
    """The problem in this file's words: `<file>: services.<name>[.key]: <problem and fix>`."""
    steps = problem.path
    if problem.kind == "extra_forbidden":
        return problem.unknown_key_message(str(path))
    if problem.kind == "model_type" and len(steps) == 2:
        return f"{path}: {problem.where()}: expected a mapping with location, job, replica_qps and load"
    if problem.kind == "missing" and tuple(steps[-2:]) in _GIVE:
        return f"{path}: {problem.where(steps[:-1])}: {_GIVE[steps[-2], steps[-1]]}"  # type: ignore[index]
    if problem.kind == "missing" and len(steps) == 3:
        return f"{path}: {problem.where(steps[:-1])}: {problem.key} is missing; give it (see autoscaling.yaml's header)"
    if problem.key == "load" or steps[-1:] in (("scrape",), ("prometheus",), ("trace",)):
        return f"{path}: {problem.where()}: {_ONE_LOAD}"
    if problem.key == "deployed_model":
        return f"{path}: {problem.where()}: give true or false, got {problem.value!r}"
    return f"{path}: {problem.where()}: {problem.message}"


def _service(path: Path, name: str, body: Any, tenant_for: dict[str, str], now: float) -> LiveService:
    where = f"{path}: services.{name}"
    tunables = {k: getattr(body, k) for k in _TUNABLE if k in body.model_fields_set}
    try:
        spec = ServiceSpec(
            name,
            tenant_for[body.location],
            body.project,
            replica_gpu_memory_mib=round(body.replica_memory_gb * 1024),
            replica_qps=body.replica_qps,
            **{k: v for k, v in tunables.items() if k != "replica_qps"},
        )
    except ValueError as e:
        raise AutoscalingConfigError(f"{where}: {e}") from None
    load = _load(f"{where}.load", body.load, path.parent, name, now)
    return LiveService(spec, body.location, body.job, load, body.deployed_model)


def default_query(service: str) -> str:
    """The PromQL of a service's request rate: its replicas' request counter over the last minute."""
    return f'sum(rate({REQUESTS_METRIC}{{service="{service}"}}[1m]))'


def _load(where: str, load: _Load, base: Path, service: str, now: float) -> LiveLoad | ScrapeLoad:
    if "scrape" in load.model_fields_set:
        scrape = load.scrape or _Scrape()
        folder = Path(scrape.directory) if scrape.directory else None
        if folder is not None and not folder.is_absolute():
            folder = base / folder
        return ScrapeLoad(service, folder, scrape.timeout_s)
    if load.prometheus is not None:
        query = load.prometheus.query or default_query(service)
        return PrometheusQuery(load.prometheus.url, query, service, load.prometheus.timeout_s)
    assert load.trace is not None  # _Load holds exactly one
    file = Path(load.trace.file)
    try:
        series = read_load(file if file.is_absolute() else base / file, load.trace.window_s)
    except LoadError as e:
        raise AutoscalingConfigError(f"{where}.trace: {e}") from None
    return TraceOnClock(series, now if load.trace.start is None else load.trace.start)
