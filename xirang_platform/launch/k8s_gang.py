"""A multi-node gang as an Indexed Job plus a headless Service for its rendezvous.

Every pod of an Indexed Job has the same shape, so the gang is cut into pods of `g` GPUs, `g` the
greatest common divisor of the GPUs it holds per node: an even split (8 + 8) is one pod per node,
an uneven one (8 + 4) two pods of 4 on the first node and one on the second. Pods start behind the
scheduling gate; the launcher narrows pod `i` to its node (`pin_plan`) and lifts the gate, so each
index lands on the node the scheduler chose. `RANK` is the completion index, `WORLD_SIZE` the pod
count, `MASTER_ADDR` pod 0's stable name through the headless Service. An elastic run's pods mount its
checkpoint volume (`k8s_elastic.py`): a resize replaces the Job with one of the new size over it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import reduce
from typing import Any

from kubernetes import client

from xirang_platform.launch.k8s import gang_job_name
from xirang_platform.launch.k8s_elastic import checkpoint_mount
from xirang_platform.launch.k8s_gpu import LaunchError, NodeGpus, node_gpus
from xirang_platform.launch.k8s_pod import (
    ALLOCATION,
    DEFAULT_WORKLOAD,
    GANG,
    GATE,
    POD_NODES,
    Workload,
    allocation_annotations,
    claim_template,
    label_value,
    node_affinity,
    pin_pod_patch,
    pod_claims,
    request_labels,
    resources,
    termination_grace,
    tolerations,
)
from xirang_platform.launch.k8s_settings import K8sSettings
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.model import Allocation

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
TRAINER_CONTAINER = "trainer"


@dataclass(frozen=True)
class GangObjects:
    """A gang's objects: headless Service, Indexed Job, DRA claim template (or None), and pod `i`'s node."""

    service: client.V1Service
    job: client.V1Job
    claim_template: client.V1ResourceClaimTemplate | None
    pod_nodes: tuple[str, ...]

    def objects(self) -> list[Any]:
        """Every object to create, in creation order."""
        return [o for o in (self.claim_template, self.service, self.job) if o is not None]


def _pod_gpus(allocation: Allocation, pool: Pool, settings: K8sSettings, per_pod: int) -> NodeGpus:
    """What each pod asks; the same on every node, or LaunchError (one pod template serves them all)."""
    asks: dict[tuple, list[str]] = {}
    first: NodeGpus | None = None
    for share in allocation.placement.shares:
        try:
            node = pool.node(share.node)
        except KeyError:
            raise LaunchError(f"gang {allocation.id}: node {share.node} is not in pool {pool.source!r}") from None
        slices = [s for s in allocation.placement.slices if s.node == share.node][:per_pod]
        # GPUs are pinned per node by the gate; inside a node the device plugin or DRA picks them.
        gpus = node_gpus(allocation.request, dataclasses.replace(node, gpu_uuids=()), slices, settings)
        key = (tuple(sorted(gpus.limits.items())), str(gpus.claim))
        asks.setdefault(key, []).append(node.name)
        first = first or gpus
    if len(asks) > 1 or first is None:
        kinds = "; ".join(f"{', '.join(nodes)}: {dict(key[0]) or 'DRA claim'}" for key, nodes in asks.items())
        raise LaunchError(
            f"gang {allocation.id}: its nodes need different GPU requests ({kinds}); one Indexed Job has one "
            "pod shape: restrict the run to one GPU model (xirang/gpu-model)"
        )
    return first


def pods_per_node(allocation: Allocation) -> tuple[int, tuple[str, ...]]:
    """GPUs per pod, and the node of each pod index in placement order (a node with k*g GPUs gets k pods)."""
    counts = {share.node: 0 for share in allocation.placement.shares}
    for s in allocation.placement.slices:
        counts[s.node] += 1
    if any(c == 0 for c in counts.values()):
        empty = [n for n, c in counts.items() if c == 0]
        raise LaunchError(f"gang {allocation.id}: nodes {empty} hold no GPU of it; a gang pod needs GPUs on its node")
    per_pod = reduce(math.gcd, counts.values())
    return per_pod, tuple(node for node, c in counts.items() for _ in range(c // per_pod))


def gang_objects(
    allocation: Allocation, pool: Pool, settings: K8sSettings, workload: Workload = DEFAULT_WORKLOAD
) -> GangObjects:
    """The headless Service and the Indexed Job (and DRA claim template) that run a multi-node gang."""
    request = allocation.request
    name = gang_job_name(allocation)
    per_pod, nodes = pods_per_node(allocation)
    pods = len(nodes)
    gpus = _pod_gpus(allocation, pool, settings, per_pod)
    share = allocation.placement.shares[0]
    on_first = nodes.count(share.node)
    cpu, memory = -(-share.cpu_milli // on_first), -(-share.memory_mib // on_first)
    labels = {**request_labels(request), GANG: name}
    annotations = allocation_annotations(allocation, f"{pods} pods x {gpus.describe}")
    annotations[POD_NODES] = ",".join(nodes)  # what the launcher pins each gated pod by
    selector = {ALLOCATION: label_value(request.id), GANG: name}
    checkpoints = checkpoint_mount(request, settings)
    env = [
        client.V1EnvVar(name="MASTER_ADDR", value=f"{name}-0.{name}"),
        client.V1EnvVar(name="MASTER_PORT", value=str(settings.rendezvous_port)),
        client.V1EnvVar(name="WORLD_SIZE", value=str(pods)),
        client.V1EnvVar(name="NNODES", value=str(pods)),
        client.V1EnvVar(name="NPROC_PER_NODE", value=str(per_pod)),
        client.V1EnvVar(
            name="RANK",
            value_from=client.V1EnvVarSource(
                field_ref=client.V1ObjectFieldSelector(field_path=f"metadata.annotations['{COMPLETION_INDEX}']")
            ),
        ),
        *([checkpoints.env] if checkpoints is not None else []),
        *(client.V1EnvVar(name=k, value=v) for k, v in sorted(workload.env.items())),
    ]
    container = client.V1Container(
        name=TRAINER_CONTAINER,
        image=workload.image or settings.image,
        command=list(workload.command) or None,
        args=list(workload.args) or None,
        env=env,
        ports=[client.V1ContainerPort(name="rendezvous", container_port=settings.rendezvous_port)],
        resources=resources(gpus, cpu, memory),
        volume_mounts=[checkpoints.mount] if checkpoints is not None else None,
    )
    template = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels=labels, annotations=annotations),
        spec=client.V1PodSpec(
            subdomain=name,
            restart_policy="Never",
            service_account_name=settings.service_account,
            priority_class_name=settings.priority_class(request.tier),
            scheduling_gates=[client.V1PodSchedulingGate(name=GATE)],
            affinity=node_affinity(nodes),
            tolerations=tolerations(settings),
            resource_claims=pod_claims(gpus, name),
            termination_grace_period_seconds=termination_grace(settings),
            containers=[container],
            volumes=[checkpoints.volume] if checkpoints is not None else None,
        ),
    )
    job = client.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=client.V1ObjectMeta(name=name, namespace=settings.namespace, labels=labels, annotations=annotations),
        spec=client.V1JobSpec(
            completion_mode="Indexed",
            completions=pods,
            parallelism=pods,
            backoff_limit=0,
            template=template,
        ),
    )
    service = client.V1Service(
        api_version="v1",
        kind="Service",
        metadata=client.V1ObjectMeta(name=name, namespace=settings.namespace, labels=labels),
        spec=client.V1ServiceSpec(
            cluster_ip="None",
            publish_not_ready_addresses=True,
            selector=selector,
            ports=[client.V1ServicePort(name="rendezvous", port=settings.rendezvous_port)],
        ),
    )
    return GangObjects(service, job, claim_template(name, settings.namespace, gpus, labels), nodes)


def pin_plan(objects: GangObjects) -> dict[int, list[dict[str, Any]]]:
    """Per completion index, the JSON patch that pins that pod to its node and lifts the gate."""
    return {index: pin_pod_patch(node, {}, {}, has_affinity=True) for index, node in enumerate(objects.pod_nodes)}


def gang_pod_node(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str | None:
    """The node a gang pod belongs on, from its completion index and its `xirang.io/pod-nodes`; None if unknown."""
    index = labels.get(COMPLETION_INDEX) or annotations.get(COMPLETION_INDEX, "")
    nodes = [n for n in annotations.get(POD_NODES, "").split(",") if n]
    return nodes[int(index)] if index.isdigit() and int(index) < len(nodes) else None
