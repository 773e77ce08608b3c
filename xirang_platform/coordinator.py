"""The run coordinator: every Dagster run passes here on submission (DESIGN.md section 7).

`XirangRunCoordinator` subclasses Dagster's `QueuedRunCoordinator`, so Dagster's own queue daemon
launches the runs; what this class adds happens before a run is queued:

1. the run's request is read from its `xirang/*` tags, or, when it has none, from what its selected
   assets declare with the same tags (`declared_request_tags`), so a click, a schedule, a sensor and
   declarative automation are admitted alike;
2. the tenant is bound from the run's code location (`locations:` in the platform config): a tag
   naming another tenant fails the run;
3. `dagster/priority` is set from the tier, a user-written `dagster-k8s/config` is blanked (Dagster
   tags cannot be deleted; an empty config adds nothing to the pod), platform tags inherited from a
   parent run (an open gate, an allocation) are reset;
4. a run asking for GPUs is queued behind the closed gate (`xirang/gate=closed`, held at limit 0 by
   `get_run_queue_config`) with its hold reason; the scheduling tick opens the gate. A run asking
   for no GPU is queued with `xirang/gate=none` and launches as Dagster would launch it.

A run whose tags are bad fails at submission: an engine event names the tag and the fix, the run
is marked failed, nothing is reserved (the coordinator never writes to the ledger).

This module must import in the webserver and in the daemon (both call `submit_run`; the daemon
calls `get_run_queue_config` every dequeue iteration): it imports only Dagster, the platform config
and the tag parser.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from dagster import AssetKey, Field, StringSource
from dagster._core.run_coordinator import QueuedRunCoordinator, SubmitRunContext
from dagster._core.run_coordinator.queued_run_coordinator import RunQueueConfig
from dagster._core.storage.dagster_run import DagsterRun
from dagster._serdes.config_class import ConfigurableClassData

from xirang_platform import run_tags as rt
from xirang_platform.platform_config import PlatformConfig, PlatformConfigError, load_config
from xirang_platform.scheduling.model import Request, Tier

_logger = logging.getLogger("xirang.coordinator")

WAITING_FOR_TICK = "queued: waiting for the next scheduling tick"
GATE_LIMIT = {"key": rt.GATE, "value": rt.GATE_CLOSED, "limit": 0}


class XirangRunCoordinator(QueuedRunCoordinator):
    """A `QueuedRunCoordinator` that admits runs through the platform's tags and gate.

    Config (dagster.yaml `run_coordinator.config`): `platform_config`, the path of `xirang.yaml`
    (default `XIRANG_CONFIG`, else `./xirang.yaml`), plus every `QueuedRunCoordinator` option.
    """

    def __init__(self, platform_config: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._platform_path = platform_config
        self._platform: PlatformConfig | None = None

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        """`QueuedRunCoordinator`'s options plus `platform_config`."""
        base: Any = super().config_type()
        return {
            **base,
            "platform_config": Field(
                StringSource,
                is_required=False,
                description="Path of the platform config (xirang.yaml); default XIRANG_CONFIG, else ./xirang.yaml.",
            ),
        }

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]
    ) -> XirangRunCoordinator:
        """Build from dagster.yaml: our key, then the rest as `QueuedRunCoordinator` takes it."""
        values = dict(config_value)
        path = values.pop("platform_config", None)
        return cls(platform_config=path, inst_data=inst_data, **values)

    @property
    def platform(self) -> PlatformConfig:
        """The platform config, read on first use."""
        if self._platform is None:
            self._platform = load_config(self._platform_path)
        return self._platform

    def get_run_queue_config(self) -> RunQueueConfig:
        """Dagster's queue config plus the gate: a run tagged `xirang/gate=closed` never dequeues."""
        config = super().get_run_queue_config()
        return config._replace(tag_concurrency_limits=[*config.tag_concurrency_limits, GATE_LIMIT])

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        """Read the run's request, bind its tenant, tag it, and queue it (behind the gate if it asks for GPUs)."""
        run = context.dagster_run
        start = time.perf_counter()
        tags = dict(run.tags)
        if not rt.request_tags(tags):
            tags.update(declared_request_tags(run, self._instance, context.workspace))
        location = run.remote_job_origin.location_name if run.remote_job_origin else None
        try:
            decision = admission_tags(tags, location, self.platform, run.run_id, time.time())
        except PlatformConfigError as e:
            decision = rt.TagProblem("platform config", None, str(e))
        if isinstance(decision, rt.TagProblem):
            return self._fail(run, decision)
        self._instance.add_run_tags(run.run_id, decision)
        queued = super().submit_run(context)
        _logger.info(
            "submitted run %s (location %s, gate %s) in %.1f ms",
            run.run_id,
            location,
            decision[rt.GATE],
            (time.perf_counter() - start) * 1000,
        )
        return queued

    def _fail(self, run: DagsterRun, problem: rt.TagProblem) -> DagsterRun:
        message = f"run not admitted: {problem.message}"
        self._instance.report_engine_event(message, run, cls=self.__class__)
        self._instance.report_run_failed(run, message)
        _logger.info("refused run %s: %s", run.run_id, problem.message)
        return self._instance.get_run_by_id(run.run_id) or run


def admission_tags(
    tags: Mapping[str, str], location: str | None, platform: PlatformConfig, run_id: str, now: float
) -> dict[str, str] | rt.TagProblem:
    """The tags the coordinator writes on a run before queueing it, or the problem that fails it."""
    tenant = platform.tenant_for(location)
    projects = platform.projects_of(tenant) if tenant is not None else None
    parsed = rt.parse(tags, tenant, run_id=run_id, submit_time=now, projects=projects)
    if isinstance(parsed, rt.TagProblem):
        return parsed
    out = {rt.ALLOCATION: "", rt.ENV: "", rt.PREEMPTED_BY: "", rt.RESUME: ""}
    out = {k: v for k, v in out.items() if k in tags}  # reset only what a parent run left behind
    if rt.K8S_CONFIG in tags:
        out[rt.K8S_CONFIG] = "{}"  # the platform writes this tag; a user's is never honoured
    if parsed is None:
        out[rt.GATE] = rt.GATE_NONE
        return out
    stated = request_run_tags(parsed)
    # The ask is restated in one key; a user's other spelling of it is blanked (`gpu-milli: 1000` is `gpus: 1`).
    blanked = {
        k: "" for k in (rt.GPUS, rt.GPU_MILLI, rt.GPU_MEMORY_GB, rt.MIN_COMPUTE_LEVEL, rt.GPU_MODEL) if k in tags
    }
    return out | blanked | stated | {rt.GATE: rt.GATE_CLOSED, rt.HOLD_REASON: WAITING_FOR_TICK}


def request_run_tags(request: Request) -> dict[str, str]:
    """The run tags that state `request` in full (what the tick parses back, tenant bound)."""
    out = {
        rt.TENANT: request.tenant,
        rt.PROJECT: request.project,
        rt.TIER: request.tier.value,
        rt.PRIORITY: str(rt.priority_for(request.tier)),
        rt.SUBMIT_TIME: f"{request.submit_time:.3f}",
    }
    if request.whole_gpus:
        out[rt.GPUS] = str(request.gpus)
    else:
        out[rt.GPU_MILLI] = str(request.milli_per_gpu)
    if request.gpu_memory_mib:
        out[rt.GPU_MEMORY_GB] = f"{request.gpu_memory_mib / 1024:g}"
    if request.min_compute_level:
        out[rt.MIN_COMPUTE_LEVEL] = str(request.min_compute_level)
    if request.gpu_models:
        out[rt.GPU_MODEL] = "|".join(sorted(request.gpu_models))
    return out


def declared_request_tags(run: DagsterRun, instance: Any, workspace: Any) -> dict[str, str]:
    """The `xirang/*` tags the assets a run will materialize declare; {} when none do.

    Read from the run's execution plan (the steps it executes, their asset outputs) and the
    workspace's asset graph: `run.asset_selection` misses re-executions and check-only runs. When
    several assets declare different needs, the run holds the largest (the most GPU milli, then the
    higher tier), since its steps run one after another inside that one allocation.
    """
    if workspace is None or not run.execution_plan_snapshot_id:
        return {}
    try:
        keys = planned_assets(instance, run)
        graph = workspace.asset_graph
    except Exception:  # a run without a plan or a workspace without an asset graph declares nothing
        _logger.exception("could not read the assets of run %s", run.run_id)
        return {}
    declarations = [rt.request_tags(graph.get(key).tags or {}) for key in sorted(keys) if graph.has(key)]
    declarations = [d for d in declarations if d]
    return max(declarations, key=_need, default={})


def planned_assets(instance: Any, run: DagsterRun) -> set[AssetKey]:
    """The assets `run` will materialize: the asset outputs of the steps it executes (its
    `step_keys_to_execute`, else every step of its execution plan)."""
    if not run.execution_plan_snapshot_id:
        return set()
    plan = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
    wanted = set(run.step_keys_to_execute or [s.key for s in plan.steps])
    return {
        o.properties.asset_key
        for s in plan.steps
        if s.key in wanted
        for o in s.outputs
        if o.properties is not None and o.properties.is_asset and o.properties.asset_key is not None
    }


def _need(tags: Mapping[str, str]) -> tuple[int, int]:
    """How much a declaration asks: GPU milli, then tier (P0 highest); unparsable values count 0."""
    try:
        milli = int(tags.get(rt.GPUS, 0)) * 1000 + int(tags.get(rt.GPU_MILLI, 0))
    except ValueError:
        milli = 0
    try:
        rank = -Tier(tags.get(rt.TIER, "")).rank
    except ValueError:
        rank = -len(Tier)
    return (milli, rank)
