"""The inference service of the embedded default: a deployed model version and the replicas serving it.

`deploy` writes the model and a `service.json` (version, model run, replica count) under the
instance's storage; each serving replica is one run of the `inference_replica` job (tier `inference`,
a fraction of a GPU): an HTTP server (`xirang_platform/serving/replica.py`) answering predictions
with the deployed version, registered in the serving registry while ready, until a scale-down asks
it to stop (the run's `autoscale/stop` tag: it drains, logs "scaled down" and the run succeeds) or
the run is cancelled (it drains and the run ends canceled). The autoscaler (or `xirang demo`) scales
the service by submitting replica runs and stopping them. docs/serving.md tells the whole path.
"""

# No `from __future__ import annotations`: Dagster reads the config and context annotations at runtime.

import json
import math
import os
import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from dagster import Config, DagsterInstance, JobDefinition, OpExecutionContext, job, op

from xirang_platform.control.service_scaling import SERVICE_TAG, STOP_TAG
from xirang_platform.dagster_defs.assets.admission import gpu_tags
from xirang_platform.serving.registry import registry_dir
from xirang_platform.serving.replica import DRAIN_GRACE_S, DRAIN_TIMEOUT_S, Replica, serve_for

SERVING_DIR = "xirang-serving"


@dataclass(frozen=True)
class Service:
    """A deployed version of a tenant's model."""

    version: int
    model_run_id: str
    replicas: int
    model_path: Path


def service_dir(storage: str, tenant: str) -> Path:
    """Where a tenant's service lives under the instance's storage directory."""
    return Path(storage) / SERVING_DIR / tenant


def current_service(storage: str, tenant: str) -> Service | None:
    """The deployed version, or None before the first deployment."""
    path = service_dir(storage, tenant) / "service.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return Service(data["version"], data["model_run_id"], data["replicas"], Path(data["model_path"]))


def deploy(storage: str, tenant: str, model: object, model_run_id: str, replicas: int | None = None) -> Service:
    """Write the model as the next version and point the service at it (keeps the replica count)."""
    previous = current_service(storage, tenant)
    version = previous.version + 1 if previous else 1
    keep = previous.replicas if previous else 1
    folder = service_dir(storage, tenant)
    folder.mkdir(parents=True, exist_ok=True)
    model_path = folder / f"model-v{version}.pkl"
    with model_path.open("wb") as f:
        pickle.dump(model, f)
    service = Service(version, model_run_id, replicas if replicas is not None else keep, model_path)
    tmp = folder / "service.json.tmp"
    tmp.write_text(
        json.dumps(
            {
                "version": version,
                "model_run_id": model_run_id,
                "replicas": service.replicas,
                "model_path": str(model_path),
            }
        )
    )
    os.replace(tmp, folder / "service.json")
    return service


class StopRequest:
    """Whether a scale-down asked this replica's run to stop (its `autoscale/stop` tag: the reason),
    read from the run's tags at most once every `every_s`."""

    def __init__(self, instance: DagsterInstance, run_id: str, every_s: float = 1.0) -> None:
        self.instance, self.run_id, self.every_s = instance, run_id, every_s
        self.read_at = -math.inf

    def __call__(self) -> str | None:
        now = time.monotonic()
        if now - self.read_at < self.every_s:
            return None
        self.read_at = now
        run = self.instance.get_run_by_id(self.run_id)
        return run.tags.get(STOP_TAG) if run is not None else None


class ReplicaConfig(Config):
    """Where one replica listens and how long it serves.

    `serve_seconds` None (the default) serves until the run is cancelled (a scale-down); a number
    serves that long and ends successfully (a bounded demo). `port` 0 takes a free port from the
    kernel; `service` empty takes the run's `autoscale/service` tag, else the tenant's name.
    """

    serve_seconds: Optional[float] = None  # noqa: UP045 - Dagster's Config needs Optional at runtime
    host: str = "127.0.0.1"
    port: int = 0
    service: str = ""
    drain_grace_s: float = DRAIN_GRACE_S
    drain_timeout_s: float = DRAIN_TIMEOUT_S


def replica_job(tenant: str, project: str, serving_milli: int) -> JobDefinition:
    """One serving replica of `tenant`'s service: tier `inference`, `serving_milli` of one GPU."""

    @op(name="serve")
    def serve(context: OpExecutionContext, config: ReplicaConfig) -> dict:
        """Serve HTTP predictions with the deployed model until cancelled (or `serve_seconds`), then drain."""
        storage = context.instance.storage_directory()
        service = current_service(storage, tenant)
        if service is None:
            raise ValueError(f"tenant {tenant} has no deployed model: materialize {tenant}/inference_service first")
        with service.model_path.open("rb") as f:
            model = pickle.load(f)  # noqa: S301 - written by `deploy` under the instance's own storage
        name = config.service or context.run.tags.get(SERVICE_TAG) or tenant
        replica = Replica(
            name,
            model,
            service.version,
            context.run_id,
            registry_dir(),
            host=config.host,
            port=config.port,
            drain_grace_s=config.drain_grace_s,
            drain_timeout_s=config.drain_timeout_s,
        )
        endpoint = replica.start()
        context.log.info(
            f"serving {name} with model v{service.version} at {endpoint.url} (registered in {replica.directory})"
        )
        stopped = None
        try:
            stopped = serve_for(replica, config.serve_seconds, stop=StopRequest(context.instance, context.run_id))
        finally:
            answered = replica.answered()
            context.log.info(f"drained {endpoint.url}: answered {answered} prediction requests")
        if stopped is not None:
            context.log.info(f"scaled down ({stopped}): the replica drained and stops")
        return {"version": service.version, "served": answered, "url": endpoint.url, "scaled_down": stopped or ""}

    @job(
        name="inference_replica",
        tags=gpu_tags("inference", project, milli=serving_milli),
        description=f"one serving replica of {tenant}'s inference service (HTTP, until cancelled)",
    )
    def inference_replica() -> None:
        serve()

    return inference_replica
