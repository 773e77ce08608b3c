"""Dagster definitions: the composition root that `dagster dev` loads (workspace.yaml).

Two code locations, one per tenant, so the platform charges a run to the tenant of the location it
comes from (DESIGN.md section 7; `locations:` in xirang.yaml): `research` and `product` each hold
their model lifecycle (dataset, training, evaluation, deployment), its weekly retraining, its serving
replicas, an offline experiment and the `gpu_probe` job. The platform's sensors come from `sensors/`
(the location named by `tick.location` runs the scheduling tick and the release sensors; each runs
its own resumption sensors); the `gpu_pool` asset, its observer and its ledger check, and the trace
replay live in `research`. Any other tenant of the platform config gets the same lifecycle as a code
location when `workspace.yaml` names it as an attribute (`team_definitions`; docs/add-a-team.md).
Nothing is defined here: this module only puts the pieces together.
"""

from __future__ import annotations

from functools import cache

from dagster import Definitions, in_process_executor

from resources.gpu_pool import GpuPoolResource
from sensors.factory import platform_sensors
from xirang_platform.control.live_config import read_live
from xirang_platform.dagster_defs.assets.experiments import sweep_asset
from xirang_platform.dagster_defs.assets.lifecycle import (
    LifecycleSpec,
    automation_sensor,
    lifecycle_assets,
    lifecycle_job,
    retraining_schedule,
)
from xirang_platform.dagster_defs.assets.pool import gpu_pool_observer, gpu_pool_spec, ledger_balances_match_entries
from xirang_platform.dagster_defs.assets.probe import probe_job
from xirang_platform.dagster_defs.assets.serving import replica_job
from xirang_platform.dagster_defs.assets.simulation import trace_replay
from xirang_platform.dagster_defs.assets.usage import gpu_usage

RESEARCH = LifecycleSpec(tenant="research", project="vision", training_gpus=4, evaluation_milli=250)
PRODUCT = LifecycleSpec(tenant="product", project="serving", training_gpus=2, evaluation_milli=250)


def tenant_definitions(spec: LifecycleSpec) -> Definitions:
    """One tenant's code location: its lifecycle, retraining, serving replicas, experiment and the platform sensors."""
    op_jobs = [replica_job(spec.tenant, spec.project, spec.serving_milli), probe_job()]
    return Definitions(
        assets=[*lifecycle_assets(spec), sweep_asset(spec)],
        jobs=[lifecycle_job(spec), *op_jobs],
        schedules=[retraining_schedule(spec)],
        sensors=[*platform_sensors(spec.tenant, jobs=op_jobs), automation_sensor()],
        resources={"gpu_pool": GpuPoolResource()},
        # One process per run: the run's steps share the allocation it was admitted with (and a
        # preempted run is one process to stop).
        executor=in_process_executor,
    )


research = Definitions.merge(
    tenant_definitions(RESEARCH),
    Definitions(
        assets=[gpu_pool_spec, trace_replay, gpu_usage],
        asset_checks=[ledger_balances_match_entries],
        sensors=[gpu_pool_observer],
    ),
)
product = tenant_definitions(PRODUCT)


@cache
def team_definitions(tenant: str) -> Definitions:
    """The code location of `tenant`, a tenant of the platform config with at least one project: the
    platform's lifecycle (its first project pays), retraining, serving replicas, experiment and sensors."""
    platform = read_live().config
    if tenant not in platform.book.tenants:
        raise AttributeError(
            f"no tenant {tenant!r} in {platform.source}: add it under `tenants:` and map its code location "
            f"under `locations:` (docs/add-a-team.md)"
        )
    projects = platform.projects_of(tenant)
    if not projects:
        raise AttributeError(f"tenant {tenant!r} of {platform.source} has no project: give it one under `projects:`")
    return tenant_definitions(LifecycleSpec(tenant=tenant, project=projects[0]))


def __getattr__(name: str) -> Definitions:
    """`workspace.yaml`'s `attribute: NAME` for a tenant NAME that has no definitions of its own here."""
    if name.startswith("__"):
        raise AttributeError(name)
    return team_definitions(name)
