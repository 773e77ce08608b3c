"""Admitted allocations as Kubernetes objects: the `dagster-k8s/config` tag and the run's Job.

The scheduling tick writes `dagster_k8s_config(...)` (JSON) as the run's `dagster-k8s/config` tag;
Dagster's `K8sRunLauncher` then builds the run-worker Job from it (`k8s_run_worker.run_worker_job`
asks dagster-k8s for the same Job, for reading and validation). The tag's keys and their merge rules are dagster-k8s's
(`USER_DEFINED_K8S_JOB_CONFIG_SCHEMA` in `dagster_k8s/job.py`): `container_config`,
`pod_spec_config`, `pod_template_spec_metadata`, `job_metadata`, `job_spec_config`, all snake_case.

A single-node allocation puts its GPUs on the run-worker pod, pinned to its node. A multi-node
gang runs as an Indexed Job (`k8s_gang.py`); its run worker is a CPU pod that carries the gang's
labels and priority, not its GPUs. In DRA mode the pod claims its GPUs from a
ResourceClaimTemplate that must exist before the launch: `run_objects` lists it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from xirang_platform.launch.k8s_elastic import checkpoint_mount
from xirang_platform.launch.k8s_gpu import LaunchError, NodeGpus, node_gpus
from xirang_platform.launch.k8s_pod import (
    GANG,
    allocation_annotations,
    claim_template,
    object_name,
    plain,
    pod_claims,
    request_labels,
    resources,
    termination_grace,
    tolerations,
)
from xirang_platform.launch.k8s_pod import node_affinity as pin_to_nodes
from xirang_platform.launch.k8s_settings import K8sSettings, settings_from_env
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.model import Allocation

DAGSTER_K8S_CONFIG_TAG = "dagster-k8s/config"


def is_gang(allocation: Allocation) -> bool:
    """True when the allocation spans more than one node (it runs as an Indexed Job)."""
    return len(allocation.placement.shares) > 1


def claim_template_name(allocation: Allocation) -> str:
    """The name of the ResourceClaimTemplate of a single-node allocation in DRA mode."""
    return object_name("xirang-gpus", allocation.id)


def gang_job_name(allocation: Allocation) -> str:
    """The name of a gang's Indexed Job and headless Service (short: pod hostnames add `-<index>`)."""
    return object_name("xirang-gang", allocation.id, limit=52)


def _single_node_gpus(allocation: Allocation, pool: Pool, settings: K8sSettings) -> tuple[str, NodeGpus]:
    (share,) = allocation.placement.shares
    try:
        node = pool.node(share.node)
    except KeyError:
        raise LaunchError(
            f"allocation {allocation.id}: node {share.node} is not in pool {pool.source!r}; "
            "render with the pool the scheduler placed it on"
        ) from None
    return node.name, node_gpus(allocation.request, node, allocation.placement.slices, settings)


@dataclass(frozen=True)
class RunPod:
    """The run-worker pod's placement pieces, as kubernetes models (None: not set)."""

    labels: dict[str, str]
    annotations: dict[str, str]
    priority_class_name: str
    resources: client.V1ResourceRequirements | None = None
    affinity: client.V1Affinity | None = None
    tolerations: list[client.V1Toleration] | None = None
    resource_claims: list[client.V1PodResourceClaim] | None = None
    termination_grace_s: int | None = None


def run_pod(allocation: Allocation, pool: Pool, settings: K8sSettings) -> RunPod:
    """The run-worker pod's pieces for an admitted allocation (see `dagster_k8s_config`)."""
    request = allocation.request
    labels = request_labels(request)
    priority = settings.priority_class(request.tier)
    grace = termination_grace(settings)
    if is_gang(allocation):
        annotations = {**allocation_annotations(allocation), GANG: gang_job_name(allocation)}
        return RunPod(labels, annotations, priority, termination_grace_s=grace)
    node, gpus = _single_node_gpus(allocation, pool, settings)
    (share,) = allocation.placement.shares
    return RunPod(
        labels=labels,
        annotations={**allocation_annotations(allocation, gpus.describe), **gpus.annotations},
        priority_class_name=priority,
        resources=resources(gpus, share.cpu_milli, share.memory_mib),
        affinity=pin_to_nodes([node]),
        tolerations=tolerations(settings) if allocation.placement.slices else None,
        resource_claims=pod_claims(gpus, claim_template_name(allocation)),
        termination_grace_s=grace,
    )


def dagster_k8s_config(allocation: Allocation, pool: Pool, settings: K8sSettings | None = None) -> str:
    """The `dagster-k8s/config` tag value (JSON text) the scheduling tick writes on an admitted run.

    `settings` are the operator's (`load_settings("deploy/xirang-k8s.yaml")`); None means the file
    `$XIRANG_K8S_SETTINGS` names (read once), else the defaults of `K8sSettings`. What the tag
    holds: `dagster_k8s_config_dict`.
    """
    config = dagster_k8s_config_dict(allocation, pool, settings or settings_from_env())
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def dagster_k8s_config_dict(allocation: Allocation, pool: Pool, settings: K8sSettings) -> dict[str, Any]:
    """The `dagster-k8s/config` tag as a dict (snake_case keys, as dagster-k8s reads them).

    Pure: reads only its arguments. For a single-node allocation the run-worker pod gets the GPUs
    (device-plugin limits, a MIG resource, a time-slicing replica or HAMi limits, or a DRA claim as
    `settings` says), the CPU and memory the scheduler reserved, a required node affinity to its
    node, the GPU tolerations, the tier's PriorityClass, and labels and annotations with tenant,
    project, tier and allocation id. For a gang (several nodes) the run-worker pod gets labels,
    annotations (naming the gang's Indexed Job) and the PriorityClass only; the GPUs are the gang
    Job's (`k8s_gang.gang_objects`). An elastic run's pod at a single-node size mounts the run's
    checkpoint volume (`k8s_elastic.py`), as its gang's pods do at a larger size. In DRA mode create
    `run_objects(...)` before the launch. Raises `LaunchError` (a message naming the fix) when the
    allocation cannot be expressed.
    """
    pod = run_pod(allocation, pool, settings)
    pod_spec = plain(
        {
            "priority_class_name": pod.priority_class_name,
            "affinity": pod.affinity,
            "tolerations": pod.tolerations,
            "resource_claims": pod.resource_claims,
            "termination_grace_period_seconds": pod.termination_grace_s,
        }
    )
    config: dict[str, Any] = {
        "pod_spec_config": pod_spec,
        "pod_template_spec_metadata": {"labels": pod.labels, "annotations": pod.annotations},
        "job_metadata": {"labels": pod.labels, "annotations": pod.annotations},
        "job_spec_config": {"backoff_limit": 0},
    }
    if pod.resources is not None:
        config["container_config"] = {"resources": plain(pod.resources)}
    checkpoints = None if is_gang(allocation) else checkpoint_mount(allocation.request, settings)
    if checkpoints is not None:  # an elastic run at a single-node size: the gang's volume, on the run worker
        pod_spec["volumes"] = [plain(checkpoints.volume)]
        container = config.setdefault("container_config", {})
        container["volume_mounts"] = [plain(checkpoints.mount)]
        container["env"] = [plain(checkpoints.env)]
    return config


def run_objects(allocation: Allocation, pool: Pool, settings: K8sSettings) -> list[Any]:
    """Objects that must exist before the run worker launches: its DRA ResourceClaimTemplate, if any."""
    if is_gang(allocation):
        return []
    _, gpus = _single_node_gpus(allocation, pool, settings)
    template = claim_template(
        claim_template_name(allocation), settings.namespace, gpus, request_labels(allocation.request)
    )
    return [template] if template is not None else []
