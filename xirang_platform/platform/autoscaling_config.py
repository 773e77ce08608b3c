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

import difflib
import os
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import yaml

from xirang_platform.load.prometheus import PrometheusQuery
from xirang_platform.load.scrape import REQUESTS_METRIC, ScrapeLoad
from xirang_platform.load.traces import DEFAULT_WINDOW_S, LoadError, LoadSeries, read_load
from xirang_platform.scheduling.replica_scaling import ServiceSpec

CONFIG_ENV = "XIRANG_AUTOSCALING"
DEFAULT_NAME = "autoscaling.yaml"
_TUNABLE = tuple(
    f.name for f in fields(ServiceSpec) if f.name not in ("name", "tenant", "project", "replica_gpu_memory_mib")
)
_SERVICE_KEYS = ("location", "project", "job", "replica_memory_gb", "deployed_model", "load", *_TUNABLE)
LOAD_KINDS = ("scrape", "prometheus", "trace")


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
    _known(str(path), doc, ("services",))
    return [
        _service(path, str(name), body, tenant_for, time.time() if now is None else now)
        for name, body in sorted(doc["services"].items())
    ]


def _service(path: Path, name: str, body: Any, tenant_for: dict[str, str], now: float) -> LiveService:
    where = f"{path}: services.{name}"
    if not isinstance(body, dict):
        raise AutoscalingConfigError(f"{where}: expected a mapping with location, job, replica_qps and load")
    _known(where, body, _SERVICE_KEYS)
    for key in ("location", "job", "replica_qps", "load"):
        if key not in body:
            raise AutoscalingConfigError(f"{where}: {key} is missing; give it (see autoscaling.yaml's header)")
    location = str(body["location"])
    if location not in tenant_for:
        known = ", ".join(sorted(tenant_for)) or "none"
        raise AutoscalingConfigError(f"{where}.location: {location!r} is not a code location of the platform ({known})")
    tunables = {k: body[k] for k in _TUNABLE if k in body}
    try:
        spec = ServiceSpec(
            name,
            tenant_for[location],
            str(body.get("project", "default")),
            replica_gpu_memory_mib=round(float(body.get("replica_memory_gb", 0)) * 1024),
            **tunables,
        )
    except (TypeError, ValueError) as e:
        raise AutoscalingConfigError(f"{where}: {e}") from None
    deployed = body.get("deployed_model", False)
    if not isinstance(deployed, bool):
        raise AutoscalingConfigError(f"{where}.deployed_model: give true or false, got {deployed!r}")
    load = _load(f"{where}.load", body["load"], path.parent, name, now)
    return LiveService(spec, location, str(body["job"]), load, deployed)


def default_query(service: str) -> str:
    """The PromQL of a service's request rate: its replicas' request counter over the last minute."""
    return f'sum(rate({REQUESTS_METRIC}{{service="{service}"}}[1m]))'


def _load(where: str, doc: Any, base: Path, service: str, now: float) -> LiveLoad | ScrapeLoad:
    if not isinstance(doc, dict) or len(doc) != 1 or next(iter(doc)) not in LOAD_KINDS:
        raise AutoscalingConfigError(
            f"{where}: give exactly one of scrape: {{}}, prometheus: {{url, query}} or trace: {{file}}"
        )
    kind, spec = next(iter(doc.items()))
    if kind == "scrape":
        spec = spec or {}
        if not isinstance(spec, dict):
            raise AutoscalingConfigError(f"{where}.scrape: give a mapping ({{}} or {{directory, timeout_s}})")
        _known(f"{where}.scrape", spec, ("directory", "timeout_s"))
        folder = Path(spec["directory"]) if spec.get("directory") else None
        if folder is not None and not folder.is_absolute():
            folder = base / folder
        return ScrapeLoad(service, folder, float(spec.get("timeout_s", 2.0)))
    if kind == "prometheus":
        if not isinstance(spec, dict) or not spec.get("url"):
            raise AutoscalingConfigError(f"{where}.prometheus: give url (http://host:9090) and optionally query")
        _known(f"{where}.prometheus", spec, ("url", "query", "timeout_s"))
        query = str(spec.get("query") or default_query(service))
        return PrometheusQuery(str(spec["url"]), query, service, float(spec.get("timeout_s", 5.0)))
    if not isinstance(spec, dict) or not spec.get("file"):
        raise AutoscalingConfigError(f"{where}.trace: give file (a qps.csv, Azure LLM trace or t,qps CSV)")
    _known(f"{where}.trace", spec, ("file", "window_s", "start"))
    file = Path(spec["file"])
    try:
        series = read_load(file if file.is_absolute() else base / file, float(spec.get("window_s", DEFAULT_WINDOW_S)))
    except LoadError as e:
        raise AutoscalingConfigError(f"{where}.trace: {e}") from None
    return TraceOnClock(series, float(spec.get("start", now)))


def _known(where: str, doc: dict, allowed: tuple[str, ...]) -> None:
    for key in doc:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(allowed)}"
            raise AutoscalingConfigError(f"{where}: unknown key {key!r}; {hint}")
