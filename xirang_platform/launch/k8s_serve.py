"""An inference service as a Deployment plus a Service; each replica is one P0 allocation.

The Deployment's pod template is the same for every replica (so scaling never rolls the running
pods): it carries the service's labels, the GPU request and the scheduling gate, no node. The
Deployment's annotation `xirang.io/replicas` names each replica allocation's node. Scaling patches
that annotation and `spec.replicas`; the launcher then binds each new (gated) pod to a replica no
pod holds yet, narrowing it to that replica's node and lifting the gate (`replica_pin_patch`). On
scale-down the leaving replica's pod gets the lowest deletion cost, so the ReplicaSet removes it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from xirang_platform.launch.k8s_gpu import LaunchError, NodeGpus, node_gpus
from xirang_platform.launch.k8s_pod import (
    ALLOCATION,
    DEFAULT_WORKLOAD,
    DEPLOYMENT,
    GATE,
    REPLICAS,
    SERVICE,
    Workload,
    claim_template,
    label_value,
    object_name,
    pin_pod_patch,
    pod_claims,
    request_annotations,
    request_labels,
    resources,
    tolerations,
)
from xirang_platform.launch.k8s_settings import K8sSettings
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.model import Allocation

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
SERVE_CONTAINER = "server"
READY_PATH = "/ready"  # the replica's readiness route (serving/replica.py): 200 serving, 503 draining
# A replica drains on SIGTERM (deregisters, answers what is in flight): give it longer than its drain.
TERMINATION_GRACE_S = 45


@dataclass(frozen=True)
class InferenceService:
    """A named service and its replicas' allocations (each a single-node P0 allocation)."""

    name: str
    replicas: tuple[Allocation, ...]

    @property
    def object_name(self) -> str:
        """The Deployment's and Service's name."""
        return object_name("xirang-serve", self.name)


def _replica_gpus(service: InferenceService, pool: Pool, settings: K8sSettings) -> NodeGpus:
    """What every replica pod asks: one Deployment template holds one shape, or LaunchError."""
    if not service.replicas:
        raise LaunchError(f"service {service.name}: no replicas; admit at least one replica before rendering")
    seen: dict[tuple, str] = {}
    first: NodeGpus | None = None
    for a in service.replicas:
        if len(a.placement.shares) != 1:
            raise LaunchError(f"service {service.name}: replica {a.id} spans several nodes; a replica is one pod")
        node_name = a.placement.shares[0].node
        try:
            node = pool.node(node_name)
        except KeyError:
            raise LaunchError(f"service {service.name}: node {node_name} is not in pool {pool.source!r}") from None
        gpus = node_gpus(a.request, node, a.placement.slices, settings)
        seen.setdefault((tuple(sorted(gpus.limits.items())), str(gpus.claim)), f"{a.id} on {node_name}")
        first = first or gpus
    if len(seen) > 1 or first is None:
        raise LaunchError(
            f"service {service.name}: replicas need different GPU requests ({'; '.join(seen.values())}); one "
            "Deployment has one pod shape: restrict the service to one GPU model (xirang/gpu-model)"
        )
    return first


def serve_objects(
    service: InferenceService, pool: Pool, settings: K8sSettings, workload: Workload = DEFAULT_WORKLOAD
) -> list[Any]:
    """The DRA claim template (DRA mode only), the Deployment and the Service of an inference service."""
    gpus = _replica_gpus(service, pool, settings)
    first = service.replicas[0]
    request = first.request
    name = service.object_name
    labels = {key: value for key, value in request_labels(request).items() if key != ALLOCATION}
    labels[SERVICE] = label_value(service.name)
    selector = {SERVICE: labels[SERVICE]}
    share = first.placement.shares[0]
    annotations = {k: v for k, v in request_annotations(request, gpus=gpus.describe).items() if k != ALLOCATION}
    annotations[SERVICE] = service.name
    pod_annotations = {**annotations, DEPLOYMENT: name}
    container = client.V1Container(
        name=SERVE_CONTAINER,
        image=workload.image or settings.image,
        command=list(workload.command) or None,
        args=list(workload.args) or None,
        env=[client.V1EnvVar(name=k, value=v) for k, v in sorted(workload.env.items())] or None,
        ports=[client.V1ContainerPort(name="http", container_port=workload.port)],
        readiness_probe=client.V1Probe(
            http_get=client.V1HTTPGetAction(path=READY_PATH, port="http"), period_seconds=2, failure_threshold=1
        ),
        resources=resources(gpus, share.cpu_milli, share.memory_mib),
    )
    deployment = client.V1Deployment(
        api_version="apps/v1",
        kind="Deployment",
        metadata=client.V1ObjectMeta(
            name=name,
            namespace=settings.namespace,
            labels=labels,
            annotations={**annotations, **replica_nodes(service)},
        ),
        spec=client.V1DeploymentSpec(
            replicas=len(service.replicas),
            selector=client.V1LabelSelector(match_labels=selector),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels, annotations=pod_annotations),
                spec=client.V1PodSpec(
                    service_account_name=settings.service_account,
                    priority_class_name=settings.priority_class(request.tier),
                    scheduling_gates=[client.V1PodSchedulingGate(name=GATE)],
                    termination_grace_period_seconds=TERMINATION_GRACE_S,
                    tolerations=tolerations(settings),
                    resource_claims=pod_claims(gpus, name),
                    containers=[container],
                ),
            ),
        ),
    )
    svc = client.V1Service(
        api_version="v1",
        kind="Service",
        metadata=client.V1ObjectMeta(name=name, namespace=settings.namespace, labels=labels),
        spec=client.V1ServiceSpec(
            selector=selector, ports=[client.V1ServicePort(name="http", port=80, target_port=workload.port)]
        ),
    )
    template = claim_template(name, settings.namespace, gpus, labels)
    return [o for o in (template, deployment, svc) if o is not None]


def replica_nodes(service: InferenceService) -> dict[str, str]:
    """The Deployment annotation naming each replica allocation's node (what gated pods are bound to)."""
    nodes = {a.id: a.placement.shares[0].node for a in service.replicas}
    return {REPLICAS: json.dumps(nodes, sort_keys=True, separators=(",", ":"))}


def scale_patch(service: InferenceService) -> dict[str, Any]:
    """The Deployment patch for the service's admitted replicas: their nodes, and the replica count.

    Only the Deployment's own metadata and `replicas` change, never the pod template: no rollout.
    """
    return {"metadata": {"annotations": replica_nodes(service)}, "spec": {"replicas": len(service.replicas)}}


def replica_pin_patch(replica_id: str, node: str) -> list[dict[str, Any]]:
    """JSON patch binding a gated replica pod to allocation `replica_id` on `node`, and lifting its gate."""
    labels = {ALLOCATION: label_value(replica_id)}
    return pin_pod_patch(node, {ALLOCATION: replica_id}, labels, has_affinity=False)


def leaving_patch() -> dict[str, Any]:
    """Pod patch marking a leaving replica's pod as the one the ReplicaSet deletes first on scale-down."""
    return {"metadata": {"annotations": {DELETION_COST: "-1000"}}}


def unbound_replicas(deployment_annotations: Mapping[str, str], bound_ids: Iterable[str]) -> list[tuple[str, str]]:
    """(replica id, node) of the replicas a Deployment names that no pod is bound to yet, by id."""
    try:
        nodes = json.loads(deployment_annotations.get(REPLICAS, "{}"))
    except ValueError:
        return []
    taken = set(bound_ids)
    return [(rid, node) for rid, node in sorted(nodes.items()) if rid not in taken]
