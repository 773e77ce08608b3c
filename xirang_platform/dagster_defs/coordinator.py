"""The run coordinator: every Dagster run passes here on submission (DESIGN.md section 7).

`XirangRunCoordinator` subclasses Dagster's `QueuedRunCoordinator`, so Dagster's own queue daemon
launches the runs; what this class adds happens before a run is queued:

1. the run's request is its `xirang/*` request tags over what its selected assets declare with the
   same tags (`declared_request_tags`), field by field, so a click, a schedule, a sensor and
   declarative automation are admitted alike; a tag cannot ask for less than the assets declare;
2. the tenant is bound from the run's code location (`locations:` in the platform config): a tag
   naming another tenant fails the run, with or without GPUs;
3. platform tags are the platform's alone: every `xirang/*` platform tag the run carries (a user's,
   or a parent run's copied by a re-execution) is blanked (Dagster tags cannot be deleted) or
   overwritten, `dagster/priority` is set from the tier (0 for a run without GPUs), a user-written
   `dagster-k8s/config` is blanked (an empty config adds nothing to the pod);
4. a run is a resumption only when the ledger recorded its `xirang/parent-run` as preempted, that
   victim belongs to this run's tenant and code location, still waits for its resumption, and the
   run is the first to claim it in the ledger (`verified_resumption`; the claim is one INSERT, so
   two runs submitted at once cannot both win): then it inherits the victim's submit time,
   preemptions and reclaims from the ledger's record, and the victim is marked
   `xirang/resume=requested`; the resumption of a resized elastic run also takes over the allocation
   of its new size (the claim hands it over) and carries the run's `xirang/size-history`;
5. a run asking for GPUs is queued behind a closed gate (`xirang/gate=queued`: each closed value
   says why the run waits, and each is held at limit 0 by `get_run_queue_config`, which also lists
   the held runs' queue tags so that Dagster's queue-criteria dialog explains the wait:
   `queue_criteria.py`) with its hold reason; the scheduling tick opens the gate. A run asking for
   no GPU is queued with `xirang/gate=none` and launches as Dagster would launch it.

A run whose tags are bad fails at submission: an engine event names the tag and the fix, the run
is marked failed, nothing is reserved (the coordinator never writes to the ledger; it reads the
ledger's preemption records only for a run that claims a parent).

This module must import in the webserver and in the daemon (both call `submit_run`; the daemon
calls `get_run_queue_config` every dequeue iteration): it imports only Dagster, the platform config,
the tag parser, the queue criteria and the ledger's read of preemptions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dagster import AssetKey, DagsterInstance, DagsterRun, Field, QueuedRunCoordinator, StringSource, SubmitRunContext

from xirang_platform.control import run_tags as rt
from xirang_platform.control import tag_parsing
from xirang_platform.control.live_config import read_live
from xirang_platform.control.platform_config import PlatformConfig, PlatformConfigError
from xirang_platform.control.resize import inherited_history
from xirang_platform.dagster_compat import BaseWorkspaceRequestContext, ConfigurableClassData, RunQueueConfig
from xirang_platform.dagster_defs.queue_criteria import gate_limits, queue_limits
from xirang_platform.ledger.db import ledger_url, make_engine
from xirang_platform.ledger.errors import LedgerError
from xirang_platform.ledger.preemptions import claim_resumption, preemption_records
from xirang_platform.scheduling.model import Request, Tier

_logger = logging.getLogger("xirang.coordinator")

WAITING_FOR_TICK = "queued: waiting for the next scheduling tick"


class XirangRunCoordinator(QueuedRunCoordinator):
    """A `QueuedRunCoordinator` that admits runs through the platform's tags and gate.

    Config (dagster.yaml `run_coordinator.config`): `platform_config`, the path of `xirang.yaml`
    (default `XIRANG_CONFIG`, else `./xirang.yaml`), plus every `QueuedRunCoordinator` option.
    """

    def __init__(self, platform_config: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._platform_path = platform_config
        self._ledger_engine: Any = None  # opened for the first run that claims a parent

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
        """The platform config in force (an edit applies; while it is bad, the last good one: `live_config`)."""
        return read_live(self._platform_path).config

    def get_run_queue_config(self) -> RunQueueConfig:
        """Dagster's queue config plus the gate (a run behind any closed value never dequeues) and the
        held runs' queue tags, which explain the wait in the queue-criteria dialog (`queue_criteria.py`)."""
        config = super().get_run_queue_config()
        explained = queue_limits(self._instance) if self.has_instance else []
        return config._replace(tag_concurrency_limits=[*config.tag_concurrency_limits, *gate_limits(), *explained])

    def submit_run(self, context: SubmitRunContext) -> DagsterRun:
        """Read the run's request, bind its tenant, tag it, and queue it (behind the gate if it asks for GPUs)."""
        run = context.dagster_run
        start = time.perf_counter()
        tags = dict(run.tags)
        declared = declared_request_tags(run, self._instance, context.workspace)
        location = run_location(run)
        try:
            resumes = self._resumption(run, location)
            decision = admission_tags(
                tags, location, self.platform, run.run_id, time.time(), declared=declared, resumes=resumes
            )
        except PlatformConfigError as e:
            resumes, decision = None, rt.TagProblem("platform config", None, str(e))
        if not isinstance(decision, rt.TagProblem):
            decision = rt.platform_settings_problem(run.run_config) or decision
        if resumes is not None:  # its victim's resumption is this run, admitted or refused
            self._instance.add_run_tags(resumes.parent, {rt.RESUME: rt.RESUME_REQUESTED})
        if isinstance(decision, rt.TagProblem):
            if blanks := platform_blanks(tags):
                self._instance.add_run_tags(run.run_id, blanks)
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

    def _resumption(self, run: DagsterRun, location: str | None) -> Resumption | None:
        parent = run.tags.get(rt.PARENT_RUN)
        if not parent:
            return None
        if self._ledger_engine is None:
            self._ledger_engine = make_engine(ledger_url(self.platform.ledger_url or None))
        return verified_resumption(
            self._instance, self._ledger_engine, parent, location, self.platform, run.run_id, time.time()
        )

    def _fail(self, run: DagsterRun, problem: rt.TagProblem) -> DagsterRun:
        message = f"run not admitted: {problem.message}"
        self._instance.report_engine_event(message, run, cls=self.__class__)
        self._instance.report_run_failed(run, message)
        _logger.info("refused run %s: %s", run.run_id, problem.message)
        return self._instance.get_run_by_id(run.run_id) or run


@dataclass(frozen=True)
class Resumption:
    """A run the platform accepts as the resumption of preempted run `parent`, and what it inherits:
    its lineage and, of a resized elastic run, its size history (`carried`: platform tags)."""

    parent: str
    lineage: rt.Lineage
    carried: Mapping[str, str] = field(default_factory=dict)


def verified_resumption(
    instance: DagsterInstance,
    ledger: Any,
    parent: str,
    location: str | None,
    platform: PlatformConfig,
    run_id: str,
    now: float,
) -> Resumption | None:
    """The resumption run `run_id` of `location` claiming `xirang/parent-run=parent` is, or None when
    the claim does not hold: the parent must be a run of the same code location still waiting for its
    resumption (`xirang/resume=pending`, written by the tick), the ledger (`ledger`, an engine) must
    have recorded it preempted, charged to this location's tenant, and this run must be the first to
    claim that preemption there (`claim_resumption`). The lineage comes from that record, never from
    a tag."""
    tenant = platform.tenant_for(location)
    victim = instance.get_run_by_id(parent)
    if tenant is None or victim is None or run_location(victim) != location:
        return None
    if victim.tags.get(rt.RESUME) != rt.RESUME_PENDING:
        return None  # resumed already (a re-execution of a resumption copies its parent tag)
    try:
        record = preemption_records(ledger, [parent]).get(parent)
        if record is None or record.request.tenant != tenant:
            return None
        if not claim_resumption(ledger, parent, record, run_id, now):
            _logger.info("run %s claims preempted run %s, which another run resumes already", run_id, parent)
            return None
    except LedgerError:
        _logger.exception("could not read or claim the ledger's record of preempted run %s", parent)
        return None
    return Resumption(parent, rt.Lineage.of(record.resumed()), inherited_history(victim.tags))


def run_location(run: DagsterRun) -> str | None:
    """The code location a run belongs to (None for a run without a remote origin)."""
    return run.remote_job_origin.location_name if run.remote_job_origin else None


def platform_blanks(tags: Mapping[str, str]) -> dict[str, str]:
    """What resets the platform tags a run carries before the platform writes its own: each
    `xirang/*` platform tag blanked, a `dagster-k8s/config` emptied."""
    out = {k: "" for k in rt.PLATFORM_TAGS if k in tags}
    if rt.K8S_CONFIG in tags:
        out[rt.K8S_CONFIG] = "{}"  # the platform writes this tag; a user's is never honoured
    return out


def admission_tags(
    tags: Mapping[str, str],
    location: str | None,
    platform: PlatformConfig,
    run_id: str,
    now: float,
    *,
    declared: Mapping[str, str] | None = None,
    resumes: Resumption | None = None,
) -> dict[str, str] | rt.TagProblem:
    """The tags the coordinator writes on a run before queueing it, or the problem that fails it.
    `declared`: what the run's assets declare; `resumes`: the verified resumption it is, if any."""
    tenant = platform.tenant_for(location)
    projects = platform.projects_of(tenant) if tenant is not None else None
    lineage = resumes.lineage if resumes is not None else rt.Lineage(now)
    parsed = tag_parsing.parse_submission(
        tags, declared or {}, tenant, run_id=run_id, lineage=lineage, projects=projects
    )
    if isinstance(parsed, rt.TagProblem):
        return parsed
    out = platform_blanks(tags) | {rt.PRIORITY: str(rt.NO_GPU_PRIORITY)}
    if resumes is not None:
        out[rt.PARENT_RUN] = resumes.parent
        out |= resumes.carried
    if parsed is None:
        return out | {rt.GATE: rt.GATE_NONE}
    # The expected duration its assets declare, on the run where the queue view reads it (checked above).
    duration = {**(declared or {}), **tags}.get(rt.EXPECTED_DURATION)
    if duration:
        out[rt.EXPECTED_DURATION] = str(duration)
    # The request restated in full: a blank other spelling of the ask (a re-execution's copy) stays blank.
    return (
        out | request_run_tags(parsed) | {rt.GATE: rt.closed_gate(WAITING_FOR_TICK), rt.HOLD_REASON: WAITING_FOR_TICK}
    )


def request_run_tags(request: Request) -> dict[str, str]:
    """The run tags that state `request` in full, its lineage included (what the tick parses back,
    tenant bound)."""
    out = {
        rt.TENANT: request.tenant,
        rt.PROJECT: request.project,
        rt.TIER: request.tier.value,
        rt.PRIORITY: str(rt.priority_for(request.tier)),
        **rt.lineage_tags(rt.Lineage.of(request)),
    }
    if request.elastic is not None:
        out[rt.GPUS_MIN], out[rt.GPUS_MAX] = str(request.elastic.min), str(request.elastic.max)
        if request.elastic.step != 1:
            out[rt.GPUS_STEP] = str(request.elastic.step)
    elif request.whole_gpus:
        out[rt.GPUS] = str(request.gpus)
    else:
        out[rt.GPU_MILLI] = str(request.milli_per_gpu)
    if request.gpu_memory_mib:
        out[rt.GPU_MEMORY_GB] = rt.gb_text(request.gpu_memory_mib)
    if request.min_compute_level:
        out[rt.MIN_COMPUTE_LEVEL] = str(request.min_compute_level)
    if request.gpu_models:
        out[rt.GPU_MODEL] = "|".join(sorted(request.gpu_models))
    return out


def declared_request_tags(
    run: DagsterRun, instance: DagsterInstance, workspace: BaseWorkspaceRequestContext | None
) -> dict[str, str]:
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


def planned_assets(instance: DagsterInstance, run: DagsterRun) -> set[AssetKey]:
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
        rank = -Tier(tags.get(rt.TIER, "")).rank
    except ValueError:
        rank = -len(Tier)
    return (tag_parsing.ask_milli(tags), rank)
