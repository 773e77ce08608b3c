"""Dagster definitions: the composition root that `dagster dev` loads (workspace.yaml).

Two code locations, one per tenant, so the platform charges a run to the tenant of the location it
comes from (DESIGN.md section 7): `research` and `product` each hold their model lifecycle (dataset,
training, evaluation, deployment), its weekly retraining, its serving replicas and its offline
experiments. The platform's own pieces (the `gpu_pool` asset and its ledger check, the trace replay)
live in `research`, the location that hosts the scheduling tick. Nothing is defined here: this
module only puts the pieces of `xirang_platform.assets` together.
"""

from __future__ import annotations

from dagster import Definitions

from xirang_platform.assets.experiments import sweep_asset
from xirang_platform.assets.lifecycle import LifecycleSpec, lifecycle_assets, lifecycle_job, retraining_schedule
from xirang_platform.assets.pool import gpu_pool_spec
from xirang_platform.assets.serving import replica_job
from xirang_platform.assets.simulation import trace_replay

RESEARCH = LifecycleSpec(tenant="research", project="vision", training_gpus=4, evaluation_milli=250)
PRODUCT = LifecycleSpec(tenant="product", project="serving", training_gpus=2, evaluation_milli=250)


def tenant_definitions(spec: LifecycleSpec) -> Definitions:
    """One tenant's code location: its lifecycle, retraining schedule, serving replicas and experiments."""
    return Definitions(
        assets=[*lifecycle_assets(spec), sweep_asset(spec)],
        jobs=[lifecycle_job(spec), replica_job(spec.tenant, spec.project, spec.serving_milli)],
        schedules=[retraining_schedule(spec)],
    )


research = Definitions.merge(tenant_definitions(RESEARCH), Definitions(assets=[gpu_pool_spec, trace_replay]))
product = tenant_definitions(PRODUCT)
