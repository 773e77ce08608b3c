"""The serving side of `xirang demo`: product's autoscaled service, its load, and what it measured.

The demo platform's `autoscaling.yaml` (`DEMO_SERVICES`) scales product's deployed model from the
replicas' own `/metrics` (no Prometheus server), one evaluation per scheduling tick. `ServingWatch`
replays a step load (`LOAD_STEPS`: low, a burst that needs four replicas, low again) with
`run_load` in a thread and, at every step of the embedded platform, counts the replicas the registry
lists as ready (and, while a rollout is under way, the fewest). `figures` is the demo's `serving`
object (requests, latency, scale-ups, scale-downs, rollouts, ready replicas, the load source).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from dagster import AssetKey, DagsterEventType, DagsterInstance

from xirang_platform.dagster_defs.assets.serving import current_service
from xirang_platform.load.generator import LoadReport, plan_load, run_load
from xirang_platform.serving.registry import endpoints, registry_dir

SERVICE = "product"
DEMO_SERVICES = {
    "services": {
        SERVICE: {
            "location": "product",
            "project": "serving",
            "job": "inference_replica",
            "deployed_model": True,
            "replica_qps": 2,
            "replica_gpu_milli": 250,
            "min_replicas": 1,
            "max_replicas": 4,
            "headroom": 0.0,
            "up_cooldown_s": 0,
            "down_cooldown_s": 15,
            "down_tolerance": 0.0,
            "load": {"scrape": {}},
        }
    }
}
# (wall second, QPS): 8 QPS asks for four replicas; beside the retraining only one GPU is free, so the
# scale-up preempts offline work; then 1 QPS.
LOAD_STEPS = ((0, 8.0), (90, 1.0), (200, 1.0))


def write_services(root: Path, services: dict[str, Any] | None = None) -> Path:
    """Write the demo's autoscaling file (`DEMO_SERVICES`, or `services`) under `root`."""
    path = root / "autoscaling.yaml"
    path.write_text(yaml.safe_dump(services if services is not None else DEMO_SERVICES, sort_keys=False))
    return path


@dataclass
class ServingWatch:
    """The demo's load on product's service and the ready replicas seen while it ran."""

    instance: DagsterInstance
    root: Path
    report: LoadReport | None = None
    max_ready: int = 0
    min_ready_in_rollout: int | None = None
    _thread: threading.Thread | None = None
    _problem: list[BaseException] = field(default_factory=list)

    def ready(self) -> list[str]:
        """Model versions of the service's registered (ready) replicas."""
        return [e.model_version for e in endpoints(registry_dir(), SERVICE)]

    def deployed_version(self) -> str | None:
        """The service's deployed model version (None before the first deployment)."""
        deployed = current_service(self.instance.storage_directory(), SERVICE)
        return str(deployed.version) if deployed else None

    def rolling(self) -> bool:
        """Whether some ready replica serves an older version than the deployed one."""
        version = self.deployed_version()
        return any(v != version for v in self.ready())

    def observe(self) -> None:
        """Count the ready replicas now (called at every step of the embedded platform)."""
        ready = self.ready()
        self.max_ready = max(self.max_ready, len(ready))
        if self.rolling():
            low = self.min_ready_in_rollout
            self.min_ready_in_rollout = len(ready) if low is None else min(low, len(ready))

    def start_load(self) -> None:
        """Replay `LOAD_STEPS` against the service in a thread."""
        trace = self.root / "demo_load.csv"
        trace.write_text("t,qps\n" + "".join(f"{t},{q}\n" for t, q in LOAD_STEPS), encoding="utf-8")
        plan = plan_load(trace, speed=1.0, duration_s=float(LOAD_STEPS[-1][0]))

        def send() -> None:
            try:
                self.report = run_load(SERVICE, plan, wait_ready_s=60.0)
            except BaseException as e:  # noqa: BLE001 - handed to the scenario, which reports it
                self._problem.append(e)

        self._thread = threading.Thread(target=send, name="demo-load", daemon=True)
        self._thread.start()

    def load_done(self) -> bool:
        """Whether the load thread has ended (its problem, if any, is raised here)."""
        if self._problem:
            raise self._problem[0]
        return self._thread is not None and not self._thread.is_alive()

    def figures(self) -> dict[str, Any]:
        """The demo's `serving` object."""
        decisions = [m.get("action") for m in self._observations()]
        versions = {m.get("rolling_out_version") for m in self._observations()} - {"", None}
        report = self.report.to_dict() if self.report is not None else {}
        return {
            "requests_ok": report.get("requests_ok", 0),
            "requests_failed": report.get("requests_failed", 0),
            "errors_by_reason": report.get("errors_by_reason", {}),
            "latency_p50_ms": report.get("latency_p50_ms"),
            "latency_p99_ms": report.get("latency_p99_ms"),
            "scale_ups": decisions.count("scale-up"),
            "scale_downs": decisions.count("scale-down"),
            "rollouts": len(versions),
            "max_ready_replicas": self.max_ready,
            "min_ready_replicas_during_rollout": self.min_ready_in_rollout,
            "load_source": "scrape",
        }

    def _observations(self) -> Iterable[dict[str, Any]]:
        records = self.instance.fetch_observations(AssetKey([SERVICE, "inference_service"]), limit=10_000).records
        for record in sorted(records, key=lambda r: r.storage_id):
            event = record.event_log_entry.dagster_event
            if event is None or event.event_type != DagsterEventType.ASSET_OBSERVATION:
                continue
            metadata = event.event_specific_data.asset_observation.metadata  # type: ignore[union-attr]
            yield {k: v.value for k, v in metadata.items()}
