"""One service's scaling step over plain data: its replicas, its load and its cap in; the replicas
to start (their run tags) and to stop out. No Dagster here: the autoscaling sensor
(`sensors/autoscaling.py`) reads the runs and the load, calls `plan_service`, and submits and
cancels what it returns.

The policy is the core's (`scheduling/replica_scaling.decide`); during a rollout the core's rolling
step (`scheduling/rollout.rollout_step`) takes over from it. The autoscaler marks its runs with tags
under `autoscale/` (the `xirang/` prefix is the run contract the coordinator validates).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xirang_platform.control import run_tags as rt
from xirang_platform.control.autoscaling_config import LiveService
from xirang_platform.load.scrape import ScrapeLoad
from xirang_platform.load.traces import LoadError
from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.quota import QuotaBook, cap
from xirang_platform.scheduling.replica_scaling import (
    ScaleDecision,
    ScalerMemory,
    cap_replicas,
    decide,
    replica_id,
    replicas_to_release,
)
from xirang_platform.scheduling.rollout import Fleet, rollout_step
from xirang_platform.serving.registry import registry_dir

SERVICE_TAG = "autoscale/service"  # the service a replica run serves
REPLICA_TAG = "autoscale/replica"  # its replica id, `<service>-<index>`: the run key, so it is asked once
VERSION_TAG = "autoscale/model-version"  # the model version it is to serve (services of the deployed model)
# A scale-down asks a serving replica to stop (why), and when: it drains and ends as a normal stop.
STOP_TAG = "autoscale/stop"
STOP_AT_TAG = "autoscale/stop-at"
# A replica still live this long after its stop request has not heard it: it is terminated instead.
STOP_TIMEOUT_S = 120.0
_logger = logging.getLogger("xirang.autoscaling")


@dataclass(frozen=True)
class ReplicaRun:
    """A live replica run of the service: its id, its replica index (-1: none), and whether it still
    waits behind the closed gate (else it holds units)."""

    run_id: str
    index: int
    waiting: bool


@dataclass(frozen=True)
class ServicePlan:
    """What one evaluation does for one service: the policy's decision, the tags of each replica run
    to start, the runs to stop and why, the next free replica index, and the version rolled out to."""

    decision: ScaleDecision
    starts: tuple[dict[str, str], ...]
    stops: tuple[str, ...]
    why: str
    next_index: int
    rolling_to: str | None = None

    def memory(self, scrape: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The service's cursor entry for the next evaluation (with this scrape, for a scrape load)."""
        d = self.decision
        return {
            "last_up": d.memory.last_up,
            "recent": [list(p) for p in d.memory.recent],
            "next": self.next_index,
            "target": d.target,
            **({"scrape": dict(scrape)} if scrape is not None else {}),
        }


def stop_overdue(requested: Mapping[str, str], now: float, timeout_s: float = STOP_TIMEOUT_S) -> list[str]:
    """The replica runs (run id -> their `STOP_AT_TAG`) asked to stop more than `timeout_s` ago, sorted;
    a stop time that is not a number counts as overdue (the tag was not the autoscaler's)."""

    def asked_at(value: str) -> float:
        try:
            at = float(value)
        except ValueError:
            return -math.inf
        return at if math.isfinite(at) else -math.inf

    return sorted(run_id for run_id, at in requested.items() if now - asked_at(at) > timeout_s)


def replica_index(tags: Mapping[str, str]) -> int:
    """The replica index of a replica run's tags (`<service>-<index>`), -1 when it has none."""
    tail = tags.get(REPLICA_TAG, "").rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def replica_tags(service: LiveService, index: int, version: str | None = None) -> dict[str, str]:
    """The run tags of replica `index`: the platform's P0 request and the autoscaler's own marks
    (with the model version it is asked to serve, for a service of the deployed model)."""
    spec = service.spec
    tags = {
        rt.TIER: "inference",
        rt.PROJECT: spec.project,
        SERVICE_TAG: spec.name,
        REPLICA_TAG: replica_id(spec.name, index),
    }
    if version is not None:
        tags[VERSION_TAG] = version
    if spec.replica_gpu_milli >= MILLI_PER_GPU:
        tags[rt.GPUS] = str(spec.replica_gpus)
    else:
        tags[rt.GPU_MILLI] = str(spec.replica_gpu_milli)
    if spec.replica_gpu_memory_mib:
        tags[rt.GPU_MEMORY_GB] = f"{spec.replica_gpu_memory_mib / 1024:g}"
    return tags


def tenant_cap_replicas(book: QuotaBook, service: LiveService) -> int | None:
    """Replicas the service's tenant (and project) cap holds at ratio 1.0 (None: no such account)."""
    spec = service.spec
    if not book.knows(spec.tenant, spec.project):
        return None
    limit = min(cap(book.quota_of(k), 1.0) for k in book.keys_for(spec.tenant, spec.project))
    return cap_replicas(limit, spec.replica_gpu_milli)


def read_load(service: LiveService, memory: Mapping[str, Any], now: float) -> tuple[float | None, str | None, Any]:
    """The service's QPS now, the problem that kept it from a reading (logged) and, for a scrape
    load, this scrape for the cursor (the next reading's rate is counted from it)."""
    try:
        if isinstance(service.load, ScrapeLoad):
            qps, scraped = service.load.read_since(memory.get("scrape"), now)
            problem = f"no answer from {', '.join(scraped.failed)}" if scraped.failed else None
            if problem:
                _logger.warning("autoscaling %s: scrape: %s", service.spec.name, problem)
            return qps, problem, scraped.to_json()
        return service.load.read(now), None, None
    except LoadError as e:
        _logger.warning("autoscaling %s: %s", service.spec.name, e)
        return None, str(e), None


def service_registry(service: LiveService) -> Path:
    """Where the service's replicas register: its scrape load's folder, else the platform's registry."""
    if isinstance(service.load, ScrapeLoad) and service.load.directory is not None:
        return service.load.directory
    return registry_dir()


def plan_service(
    service: LiveService,
    replicas: Sequence[ReplicaRun],
    memory: Mapping[str, Any],
    qps: float | None,
    now: float,
    most_replicas: int | None,
    rollout: tuple[str, Fleet] | None = None,
) -> ServicePlan:
    """The service's step: `replicas` its live replica runs in index order, `memory` its cursor entry,
    `qps` its load (None: no reading), `most_replicas` what its tenant's cap holds (`tenant_cap_replicas`),
    `rollout` the deployed version and the fleet sorted by it (`serving/fleet.py`) for a service of
    the deployed model."""
    name = service.spec.name
    rolling = rollout is not None and rollout[1].rolling
    # During a rollout the surge replica is not load: the policy sees the replicas it last aimed for.
    current = min(len(replicas), int(memory.get("target", len(replicas)))) if rolling else len(replicas)
    state = ScalerMemory(memory.get("last_up"), tuple((float(t), int(w)) for t, w in memory.get("recent", ())))
    d = decide(service.spec, state, current, qps, now, most_replicas)
    version = rollout[0] if rollout is not None else None
    if rollout is not None and rolling:
        step = rollout_step(rollout[1], d.target)
        count, stops = step.start, step.stop
        why = f"autoscaler: {name} rolls out model v{version} (ready replicas stay >= {max(1, d.target)})"
    else:
        waiting = [r.run_id for r in replicas if r.waiting]
        holding = [r.run_id for r in replicas if not r.waiting]
        count = max(0, d.delta)
        stops = tuple(replicas_to_release(waiting, holding, -d.delta)) if d.delta < 0 else ()
        why = f"autoscaler: {name} scales from {d.current} to {d.target} replicas (load {d.qps})"
    start = max(int(memory.get("next", 0)), *(r.index + 1 for r in replicas), 0)
    starts = tuple(replica_tags(service, i, version) for i in range(start, start + count))
    return ServicePlan(d, starts, tuple(stops), why, start + count, version if rolling else None)
