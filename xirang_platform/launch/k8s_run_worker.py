"""The run-worker Job of an admitted run, as Dagster's `K8sRunLauncher` will create it.

dagster-k8s builds it (`construct_dagster_k8s_job`, the call `K8sRunLauncher` makes) from the
launcher's settings and the run's `dagster-k8s/config` tag, which carries the placement
(`k8s.dagster_k8s_config_dict`): so what `xirang k8s render` shows and the tests validate is the Job
the cluster gets, not a copy of it. The one module of this package that imports a Dagster library
(the import contracts in pyproject.toml name it).
"""

from __future__ import annotations

from dagster_k8s.job import (
    DagsterK8sJobConfig,
    UserDefinedDagsterK8sConfig,
    construct_dagster_k8s_job,
    get_job_name_from_run_id,
)
from kubernetes import client

from xirang_platform.launch.k8s import dagster_k8s_config_dict
from xirang_platform.launch.k8s_settings import K8sSettings
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.model import Allocation

RUN_WORKER_ARGS = ("dagster", "api", "execute_run")  # K8sRunLauncher appends the run's serialized arguments


def run_worker_job(
    allocation: Allocation, pool: Pool, settings: K8sSettings, run_id: str, job_name: str = "dagster"
) -> client.V1Job:
    """The run-worker Job `K8sRunLauncher` creates for run `run_id` of Dagster job `job_name`: the
    launcher's labels, image, service account and environment, with the placement of the tag the tick
    writes, in the settings' namespace (the launcher's `job_namespace`)."""
    name = get_job_name_from_run_id(run_id)
    job = construct_dagster_k8s_job(
        job_config=DagsterK8sJobConfig(job_image=settings.image, service_account_name=settings.service_account),
        args=list(RUN_WORKER_ARGS),
        job_name=name,
        pod_name=name,
        component="run_worker",
        user_defined_k8s_config=UserDefinedDagsterK8sConfig.from_dict(
            dagster_k8s_config_dict(allocation, pool, settings)
        ),
        labels={"dagster/job": job_name, "dagster/run-id": run_id},
        env_vars=[{"name": "DAGSTER_RUN_JOB_NAME", "value": job_name}],
    )
    job.metadata.namespace = settings.namespace
    return job
