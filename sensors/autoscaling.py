"""The autoscaling sensor: per inference service, read its load, run the policy, scale its replicas.

Each evaluation, for every service of `autoscaling.yaml` (`xirang_platform/control/autoscaling_config.py`)
that runs in this code location:
1. its live replicas are the runs tagged `autoscale/service=<name>` that have not ended; the ones still
   behind the closed gate are waiting, the others hold units. A service whose job the location lacks,
   or (`deployed_model`) whose tenant has deployed no model yet, is held with its problem logged.
   Registry entries of runs that ended without deregistering (a replica killed with its host) are
   removed, so neither the scrape nor a router keeps trying them; entries that name no run of this
   instance (`xirang serve` by hand) are left alone;
2. the load source gives the QPS: the replicas' own `/metrics` scraped (the rate since the previous
   scrape, kept in the cursor), Prometheus's query API, or a trace on the wall clock; a source that
   fails is logged and counts as no reading (the policy keeps what runs);
3. `decide` (the core's pure policy, `scheduling/replica_scaling.py`) with the tenant's cap at ratio 1.0
   from the ledger's quota book;
4. scale-up: one `RunRequest` per new replica, with the P0 run tags (`xirang/tier=inference`, its
   GPUs and GPU memory, its project, the model version it is to serve) and a run key that is the
   replica's id, so a replica is never asked twice. The runs go through the platform's own path: the
   coordinator gates them, the scheduling tick admits them first (tier P0) and, when the pool is
   full, preempts P2 work and reclaims units lent to other tenants; the ledger records every reserve,
   preempt, borrow and return;
5. scale-down: the chosen replicas (waiting first, then the newest) stop as a normal stop, with no
   error-level event: one still queued is cancelled from the queue with the reason; a started one is
   asked to stop (`autoscale/stop`, the reason): it drains (leaves the registry, answers what it
   holds) and its run succeeds, logging "scaled down". A replica asked to stop is no longer counted;
   one still live `STOP_TIMEOUT_S` after the request is terminated. The release sensor frees their
   units, which the next tick gives to training;
6. rollout: while some live replica serves an older model version than the deployed one, steps 4-5
   give way to the core's rolling step (`scheduling/rollout.py`): new replicas start (one surge),
   an old one is cancelled only while the ready replicas stay at the target;
7. an `AssetObservation` on the `inference_service` asset (the key is a parameter) carries the
   decision and the pool's borrowed GPUs as metadata; the policy's memory goes in the cursor.

Tags are under `autoscale/`: the `xirang/` prefix is the run contract the coordinator validates.
"""

from __future__ import annotations

import difflib
import json
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    AssetKey,
    AssetObservation,
    DagsterEvent,
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from resources.gpu_pool import GpuPoolResource
from sensors.cadence import minimum_interval
from xirang_platform.control import run_tags as rt
from xirang_platform.control.autoscaling_config import AutoscalingConfigError, LiveService, config_file, read_services
from xirang_platform.control.service_scaling import (
    REPLICA_TAG,
    SERVICE_TAG,
    STOP_AT_TAG,
    STOP_TAG,
    STOP_TIMEOUT_S,
    VERSION_TAG,
    ReplicaRun,
    ServicePlan,
    plan_service,
    read_load,
    replica_index,
    service_registry,
    stop_overdue,
    tenant_cap_replicas,
)
from xirang_platform.dagster_defs.assets.serving import current_service
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.scheduling.replica_scaling import ScaleDecision
from xirang_platform.scheduling.rollout import Fleet
from xirang_platform.serving.fleet import LiveReplica, sort_fleet
from xirang_platform.serving.registry import endpoints, prune

SENSOR_NAME = "xirang_autoscaling"
DEFAULT_ASSET = "inference_service"
LIVE = [DagsterRunStatus.NOT_STARTED, DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]
_logger = logging.getLogger("xirang.autoscaling")


@dataclass
class ServiceTick:
    """What one evaluation did for one service: its plan, the runs it asked for and stopped, the
    problem that kept it from a load reading, and this scrape (for a scrape load's cursor)."""

    plan: ServicePlan
    requests: list[RunRequest] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    problem: str | None = None
    scrape: dict[str, Any] | None = None
    load_source: str = ""
    pruned: list[str] = field(default_factory=list)  # runs whose stale registry entries were removed

    @property
    def decision(self) -> ScaleDecision:
        """The policy's decision."""
        return self.plan.decision

    def memory(self) -> dict[str, Any]:
        """The service's cursor entry for the next evaluation."""
        return self.plan.memory(self.scrape)

    def metadata(self, borrowed_gpus: float) -> dict[str, Any]:
        """Flat values for the service's asset observation."""
        d = self.decision
        out: dict[str, Any] = {
            "service": d.service,
            "qps": -1.0 if d.qps is None else float(d.qps),
            "replicas": d.current,
            "wanted_replicas": d.wanted,
            "target_replicas": d.target,
            "action": d.action.value,
            "capped_by_quota": d.capped,
            "unserved_qps": float(d.unserved_qps),
            "scale_up_runs": len(self.requests),
            "scale_down_runs": len(self.stopped),
            "pool_borrowed_gpus": float(borrowed_gpus),
            "load_source": self.load_source,
            "rolling_out_version": self.plan.rolling_to or "",
            "stale_replicas_removed": len(self.pruned),
        }
        if self.problem:
            out["load_problem"] = self.problem
        return out


def service_problem(instance: DagsterInstance, service: LiveService, known_jobs: Collection[str] | None) -> str | None:
    """Why the service cannot be scaled now (logged; its replicas are kept as they are), or None.
    `known_jobs` are the jobs of the sensor's code location (None: not checked)."""
    spec = service.spec
    problem = None
    if known_jobs is not None and service.job not in known_jobs:
        close = difflib.get_close_matches(service.job, sorted(known_jobs), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"its jobs: {', '.join(sorted(known_jobs)) or 'none'}"
        problem = (
            f"service {spec.name}: job {service.job!r} is not a job of code location {service.location} ({hint}); "
            f"fix `job:` in {config_file()}"
        )
        _logger.error("autoscaling %s", problem)
    elif service.deployed_model and current_service(instance.storage_directory(), spec.tenant) is None:
        problem = f"service {spec.name}: no model deployed yet; materialize {spec.tenant}/inference_service"
    return problem


def autoscale_service(
    instance: DagsterInstance,
    service: LiveService,
    book: QuotaBook,
    memory: Mapping[str, Any],
    now: float,
    known_jobs: Collection[str] | None = None,
) -> ServiceTick:
    """Read, decide (`plan_service`) and act for one service (module docstring, steps 1-5); `memory`
    is its cursor entry."""
    live = instance.get_runs(RunsFilter(tags={SERVICE_TAG: service.spec.name}, statuses=LIVE))
    runs = sorted((r for r in live if STOP_TAG not in r.tags), key=lambda r: replica_index(r.tags))
    terminate_overdue(instance, service.spec.name, [r for r in live if STOP_TAG in r.tags], now)
    replicas = [ReplicaRun(r.run_id, replica_index(r.tags), rt.is_closed(r.tags.get(rt.GATE))) for r in runs]
    ended = ended_run(instance, {r.run_id for r in runs})
    pruned = [e.run_id for e in prune(service_registry(service), service.spec.name, ended)]
    for run_id in pruned:
        _logger.warning("autoscaling %s: run %s ended without leaving the registry; removed", service.spec.name, run_id)
    problem = service_problem(instance, service, known_jobs)
    qps, scraped, rollout = None, None, None
    if problem is None:
        qps, problem, scraped = read_load(service, memory, now)
        rollout = deployed_fleet(instance, service, runs, {r.run_id for r in replicas if r.waiting})
    plan = plan_service(service, replicas, memory, qps, now, tenant_cap_replicas(book, service), rollout)
    requests = [RunRequest(run_key=tags[REPLICA_TAG], job_name=service.job, tags=tags) for tags in plan.starts]
    tick = ServiceTick(plan, requests, problem=problem, scrape=scraped, load_source=service.load_source, pruned=pruned)
    by_id = {r.run_id: r for r in runs}
    for run_id in plan.stops:
        stop_replica(instance, by_id[run_id], plan.why, now)
        tick.stopped.append(run_id)
    return tick


def stop_replica(instance: DagsterInstance, run: DagsterRun, why: str, now: float) -> None:
    """End a replica run as a normal stop, with no error-level event: still queued, it is cancelled
    from the queue with `why`; started, it is asked to stop (its op drains and returns)."""
    if run.status in (DagsterRunStatus.NOT_STARTED, DagsterRunStatus.QUEUED):
        message = f"scaled down before it started: {why}"
        instance.report_run_canceling(run, message=message)
        canceled = DagsterEvent(DagsterEventType.RUN_CANCELED.value, job_name=run.job_name, message=message)
        instance.report_dagster_event(canceled, run_id=run.run_id, log_level=logging.INFO)
        return
    instance.add_run_tags(run.run_id, {STOP_TAG: why, STOP_AT_TAG: f"{now:.3f}"})
    instance.report_engine_event(f"scaled down: {why}; the replica drains and ends", run)


def terminate_overdue(instance: DagsterInstance, service: str, leaving: Sequence[DagsterRun], now: float) -> list[str]:
    """Terminate the replicas asked to stop more than `STOP_TIMEOUT_S` ago that still run; their ids."""
    overdue = stop_overdue({r.run_id: r.tags.get(STOP_AT_TAG, "") for r in leaving}, now)
    for run_id in overdue:
        late = f"run {run_id} did not stop within {STOP_TIMEOUT_S:.0f} s of its scale-down; terminating it"
        _logger.warning("autoscaling %s: %s", service, late)
        instance.run_coordinator.cancel_run(run_id)
    return overdue


def ended_run(instance: DagsterInstance, live: Collection[str]) -> Callable[[str], bool]:
    """Whether a registry entry's run is a run of `instance` that has ended (not one it does not
    know); `live`: runs already read as live, not read again."""

    def ended(run_id: str) -> bool:
        if run_id in live:
            return False
        run = instance.get_run_by_id(run_id)
        return run is not None and run.status not in LIVE

    return ended


def deployed_fleet(
    instance: DagsterInstance, service: LiveService, runs: Sequence[DagsterRun], waiting: Collection[str]
) -> tuple[str, Fleet] | None:
    """For a service of the deployed model: the deployed version and its live replicas sorted by
    version and readiness (`serving/fleet.py`); None for other services, or before a deployment."""
    if not service.deployed_model:
        return None
    deployed = current_service(instance.storage_directory(), service.spec.tenant)
    if deployed is None:
        return None
    version = str(deployed.version)
    replicas = [LiveReplica(r.run_id, r.run_id in waiting, r.tags.get(VERSION_TAG, "")) for r in runs]
    return version, sort_fleet(replicas, endpoints(service_registry(service), service.spec.name), version)


def evaluate(
    instance: DagsterInstance,
    gpu_pool: GpuPoolResource,
    services: Sequence[LiveService],
    cursor: str | None,
    now: float,
    asset_key: str = DEFAULT_ASSET,
    known_jobs: Collection[str] | None = None,
) -> tuple[list[ServiceTick], SensorResult]:
    """One evaluation over `services`; the ticks and the sensor result (run requests, observations, cursor).
    `known_jobs`: the jobs of the code location (a service naming another is held with a clear problem)."""
    memory: dict[str, Any] = json.loads(cursor) if cursor else {}
    book = gpu_pool.ledger().quota_book()
    ticks = [autoscale_service(instance, s, book, memory.get(s.spec.name, {}), now, known_jobs) for s in services]
    by_name = {s.spec.name: s for s in services}
    borrowed = gpu_pool.pool_state().borrowed_gpus
    observations = []
    for t in ticks:
        d = t.decision
        memory[d.service] = t.memory()
        observations.append(
            AssetObservation(asset_key=observed_asset(by_name[d.service], asset_key), metadata=t.metadata(borrowed))
        )
    requests = [r for t in ticks for r in t.requests]
    return ticks, SensorResult(run_requests=requests, asset_events=observations, cursor=json.dumps(memory))


def observed_asset(service: LiveService, asset_key: str) -> AssetKey:
    """The asset a service's decisions are observed on: the tenant's `inference_service` for a service
    of the deployed model (the lifecycle's asset), else `asset_key`."""
    return AssetKey([service.spec.tenant, DEFAULT_ASSET]) if service.deployed_model else AssetKey(asset_key)


def build_autoscaling_sensor(
    location: str,
    services: Iterable[LiveService] | None = None,
    interval_s: int = 30,
    asset_key: str = DEFAULT_ASSET,
    jobs: Sequence[JobDefinition] = (),
) -> SensorDefinition:
    """The sensor for the services that run in code location `location` (all of `autoscaling.yaml`'s
    when `services` is None, read at each evaluation so an edit applies without a restart)."""
    given = list(services) if services is not None else None

    @sensor(
        name=SENSOR_NAME,
        minimum_interval_seconds=minimum_interval(interval_s),
        jobs=list(jobs) or None,
        default_status=DefaultSensorStatus.RUNNING,
    )
    def xirang_autoscaling(context: SensorEvaluationContext, gpu_pool: GpuPoolResource) -> SensorResult | SkipReason:
        import time

        now = time.time()
        try:
            configured = given if given is not None else _configured(gpu_pool, now)
        except AutoscalingConfigError as e:
            context.log.error(str(e))
            return SkipReason(str(e))
        mine = [s for s in configured if s.location == location]
        repository = context.repository_def
        known = {j.name for j in jobs} if jobs else None
        if known is None and repository is not None:
            known = {j.name for j in repository.get_all_jobs()}
        ticks, result = evaluate(context.instance, gpu_pool, mine, context.cursor, now, asset_key, known)
        for t in ticks:
            d = t.decision
            line = f"{d.service}: {d.action.value} {d.current} -> {d.target} replicas at {d.qps} QPS ({t.load_source})"
            context.log.info(line + (f"; {t.problem}" if t.problem else ""))
        return result

    return xirang_autoscaling


def _configured(gpu_pool: GpuPoolResource, now: float) -> list[LiveService]:
    platform = gpu_pool.platform()
    return read_services(config_file(platform.autoscaling_path), dict(platform.locations), now)
