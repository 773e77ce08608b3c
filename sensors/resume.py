"""Resumption of preempted runs: each code location requeues its own victims' remaining work.

The tick terminates a victim and tags it `xirang/resume=pending`. A sensor can only request runs
of its own code location, so every location runs the resumption sensors (`xirang_resume_preempted` for asset runs,
`xirang_resume_preempted_jobs` for op jobs), which
turns each of its canceled, pending victims into one run request:

- **asset runs** (any run whose plan materializes assets): a run of the assets the victim had not
  materialized yet, read from its plan and its `ASSET_MATERIALIZATION` events, so completed work is
  not redone; the training asset's own checkpoint carries its steps forward.
- **op jobs**: a re-execution from failure needs a workspace (`instance.create_reexecuted_run` takes
  a `CodeLocation` and a `RemoteJob`), which a sensor does not have (notes/dagster.md section 9.2).
  The path taken is a new run of the same job with the victim's run config; its ops resume from
  their own checkpoints. The job must be one of the `jobs` given to `build_resume_sensors`.

The resumption carries `xirang/parent-run` and the victim's request tags and run config (for asset
runs, the config of the remaining assets' ops: Dagster refuses config for ops outside a selection).
What it inherits (the original submit time, one more preemption, its reclaims) is not written here:
the coordinator reads it from the ledger's record of the preemption and marks the victim
`xirang/resume=requested` when it accepts the run as its resumption. The sensor acts only on runs
the ledger recorded as preempted; the run key (`resume:<victim>`) makes the request happen once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagster import (
    AssetKey,
    AssetSelection,
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
from sensors.cadence import SENSOR_LOOP_S, minimum_interval
from xirang_platform.control import run_tags as rt
from xirang_platform.dagster_defs.coordinator import planned_assets, run_location
from xirang_platform.ledger.preemptions import preemption_records

RESUME_SENSOR_NAME = "xirang_resume_preempted"


def materialized_assets(instance: DagsterInstance, run_id: str) -> set[AssetKey]:
    """The assets run `run_id` materialized before it stopped."""
    events = instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
    keys = (e.dagster_event.asset_key for e in events if e.dagster_event is not None)
    return {key for key in keys if key is not None}


def resumption_tags(victim: DagsterRun) -> dict[str, str]:
    """The tags of the run that continues `victim`: its request and its parent (the coordinator
    checks the claim against the ledger and adds the lineage)."""
    return rt.request_tags(victim.tags) | {rt.PARENT_RUN: victim.run_id}


def resumption_config(instance: DagsterInstance, victim: DagsterRun, remaining: Sequence[AssetKey]) -> dict[str, Any]:
    """`victim`'s run config for a run of the `remaining` assets: the config of their ops only
    (the step keys that output them; a graph asset's config sits under its graph's name), the rest
    (resources, execution, loggers) as it was."""
    config = dict(victim.run_config or {})
    ops = config.get("ops")
    if not isinstance(ops, Mapping) or not victim.execution_plan_snapshot_id:
        return config
    plan = instance.get_execution_plan_snapshot(victim.execution_plan_snapshot_id)
    wanted = set(remaining)
    kept = {
        step.key.split(".", 1)[0]
        for step in plan.steps
        for o in step.outputs
        if o.properties is not None and o.properties.is_asset and o.properties.asset_key in wanted
    }
    config["ops"] = {name: value for name, value in ops.items() if name in kept}
    if not config["ops"]:
        del config["ops"]
    return config


def resumption_request(
    instance: DagsterInstance, victim: DagsterRun, job_names: Sequence[str]
) -> RunRequest | SkipReason:
    """The run request that continues `victim`, or why there is none."""
    planned = planned_assets(instance, victim)
    tags = resumption_tags(victim)
    key = f"resume:{victim.run_id}"
    if planned:
        remaining = sorted(planned - materialized_assets(instance, victim.run_id), key=lambda k: k.to_user_string())
        if not remaining:
            return SkipReason(f"run {victim.run_id} had materialized all its assets: nothing to resume")
        config = resumption_config(instance, victim, remaining)
        return RunRequest(run_key=key, asset_selection=remaining, run_config=config, tags=tags)
    if victim.job_name in job_names:
        return RunRequest(run_key=key, job_name=victim.job_name, run_config=victim.run_config, tags=tags)
    return SkipReason(
        f"run {victim.run_id} of op job {victim.job_name} cannot be resumed by a sensor: add the job to the "
        f"resume sensor's jobs, or re-execute it from failure in the UI"
    )


# A victim terminated while it was still starting ends FAILURE, not CANCELED: it is a victim all the same.
VICTIM_END_STATUSES = [DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE]


def pending_victims(instance: DagsterInstance, location: str | None, ledger: Any) -> list[DagsterRun]:
    """Preempted runs of `location` (ended canceled, or failed while being terminated as they started)
    whose resumption is still pending and that the ledger (`ledger`, an engine) recorded as
    preempted, oldest first. A run's own tags cannot make it a victim."""
    runs = instance.get_runs(
        RunsFilter(statuses=VICTIM_END_STATUSES, tags={rt.RESUME: rt.RESUME_PENDING}), ascending=True
    )
    here = [r for r in runs if location is None or run_location(r) == location]
    recorded = preemption_records(ledger, [r.run_id for r in here]) if here else {}
    return [r for r in here if r.run_id in recorded]


def build_resume_sensors(location: str | None = None, jobs: Sequence[JobDefinition] = ()) -> list[SensorDefinition]:
    """The resumption sensors of one code location (`location` None: read from the sensor context):
    `xirang_resume_preempted` for asset runs (targets every asset of the location) and, when op
    `jobs` are given, `xirang_resume_preempted_jobs` for runs of those jobs (a Dagster sensor targets
    assets or jobs, not both)."""
    out = [_resume_sensor(RESUME_SENSOR_NAME, location, assets=True, jobs=())]
    if jobs:
        out.append(_resume_sensor(f"{RESUME_SENSOR_NAME}_jobs", location, assets=False, jobs=jobs))
    return out


def _resume_sensor(name: str, location: str | None, assets: bool, jobs: Sequence[JobDefinition]) -> SensorDefinition:
    job_names = [j.name for j in jobs]

    @sensor(
        name=name,
        minimum_interval_seconds=minimum_interval(SENSOR_LOOP_S),
        default_status=DefaultSensorStatus.RUNNING,
        asset_selection=AssetSelection.all() if assets else None,
        jobs=list(jobs) or None,
        description="Requeues the remaining work of this location's preempted runs (DESIGN.md section 7).",
    )
    def resume_preempted(context: SensorEvaluationContext, gpu_pool: GpuPoolResource) -> SensorResult:
        here = location or (context.code_location_origin.location_name if context.code_location_origin else None)
        requests: list[RunRequest] = []
        skipped: list[str] = []
        for victim in pending_victims(context.instance, here, gpu_pool.ledger().engine):
            if bool(planned_assets(context.instance, victim)) != assets:
                continue  # the other resumption sensor's
            answer = resumption_request(context.instance, victim, job_names)
            if isinstance(answer, RunRequest):
                requests.append(answer)
            else:
                context.instance.add_run_tags(victim.run_id, {rt.RESUME: rt.RESUME_REQUESTED})
                context.instance.report_engine_event(str(answer.skip_message), victim)
                skipped.append(answer.skip_message or "")
        if requests:
            return SensorResult(run_requests=requests)
        return SensorResult(skip_reason="; ".join(skipped) or "no preempted run to resume")

    return resume_preempted
