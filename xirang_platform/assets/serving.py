"""The inference service of the embedded default: a deployed model version and the replicas serving it.

`deploy` writes the model and a `service.json` (version, model run, replica count) under the
instance's storage; each serving replica is one run of the `inference_replica` job (tier `inference`,
a fraction of a GPU), which answers prediction requests with the deployed version for a while. The
autoscaler (or `xirang demo`) scales the service by submitting and ending replica runs.
"""

# No `from __future__ import annotations`: Dagster reads the config and context annotations at runtime.

import json
import os
import pickle
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from dagster import Config, JobDefinition, OpExecutionContext, job, op

from xirang_platform.assets.admission import gpu_tags

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


class ReplicaConfig(Config):
    """How long one replica serves and how many requests a second it answers."""

    serve_seconds: float = 10.0
    requests_per_second: float = 20.0


def replica_job(tenant: str, project: str, serving_milli: int) -> JobDefinition:
    """One serving replica of `tenant`'s service: tier `inference`, `serving_milli` of one GPU."""

    @op(name="serve")
    def serve(context: OpExecutionContext, config: ReplicaConfig) -> dict:
        """Answer digit predictions with the deployed model for `serve_seconds`."""
        storage = context.instance.storage_directory()
        service = current_service(storage, tenant)
        if service is None:
            raise ValueError(f"tenant {tenant} has no deployed model: materialize {tenant}/inference_service first")
        with service.model_path.open("rb") as f:
            model = pickle.load(f)  # noqa: S301 - written by `deploy` under the instance's own storage
        from sklearn.datasets import load_digits

        images = (load_digits().data / 16.0).astype(np.float32)
        served, latencies = 0, []
        end = time.monotonic() + config.serve_seconds
        while time.monotonic() < end:
            start = time.perf_counter()
            model.predict(images[served % len(images)].reshape(1, -1))
            latencies.append(time.perf_counter() - start)
            served += 1
            time.sleep(1.0 / config.requests_per_second)
        p99 = float(np.percentile(latencies, 99)) if latencies else 0.0
        context.log.info(f"served {served} requests with model v{service.version}, p99 {p99 * 1000:.2f} ms")
        return {"version": service.version, "served": served, "p99_ms": p99 * 1000}

    @job(
        name="inference_replica",
        tags=gpu_tags("inference", project, milli=serving_milli),
        description=f"one serving replica of {tenant}'s inference service",
    )
    def inference_replica() -> None:
        serve()

    return inference_replica
