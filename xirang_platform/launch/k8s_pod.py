"""The pieces every pod Xirang launches shares: names, labels, annotations, node pinning, resources.

Labels carry sanitized values (Kubernetes label syntax); annotations carry the exact ones, plus
the placement the scheduler chose as JSON. Pods are pinned with a required node affinity on
`metadata.name`; pods of a gang or a service start behind the scheduling gate `GATE` and the
launcher narrows each one to its own node before lifting the gate (`pin_pod_patch`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from xirang_platform.launch.k8s_gpu import CLAIM_NAME, NodeGpus
from xirang_platform.launch.k8s_settings import K8sSettings
from xirang_platform.scheduling.model import Allocation, GpuSlice, NodeShare, Request

PREFIX = "xirang.io"
TENANT = f"{PREFIX}/tenant"
PROJECT = f"{PREFIX}/project"
TIER = f"{PREFIX}/tier"
ALLOCATION = f"{PREFIX}/allocation"
SERVICE = f"{PREFIX}/service"
GANG = f"{PREFIX}/gang"
PLACEMENT = f"{PREFIX}/placement"
GPUS = f"{PREFIX}/gpus"
GATE = f"{PREFIX}/placement"
POD_NODES = f"{PREFIX}/pod-nodes"  # on a gang's pods: the node of each completion index, comma-separated
REPLICAS = f"{PREFIX}/replicas"  # on a service's Deployment: JSON {replica allocation id: node}
DEPLOYMENT = f"{PREFIX}/deployment"  # on a service's pods: the Deployment that owns them
MANAGED_BY = {"app.kubernetes.io/managed-by": "xirang"}
NAME_LIMIT = 63
_LABEL_VALUE_RE = re.compile(r"[^A-Za-z0-9._-]+")


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]  # noqa: S324 - a name suffix, not security


def label_value(text: str) -> str:
    """`text` as a valid label value (<= 63 chars of [A-Za-z0-9._-], alphanumeric ends); a hash keeps it unique."""
    clean = _LABEL_VALUE_RE.sub("-", text).strip("-._")
    if clean == text and len(text) <= NAME_LIMIT:
        return text
    return f"{clean[: NAME_LIMIT - 9].rstrip('-._')}-{_digest(text)}".lstrip("-")


def object_name(prefix: str, ident: str, limit: int = NAME_LIMIT) -> str:
    """A DNS-1123 label `<prefix>-<ident>` of at most `limit` characters; a hash keeps it unique."""
    clean = re.sub(r"[^a-z0-9-]+", "-", ident.lower()).strip("-")
    name = f"{prefix}-{clean}" if clean else prefix
    if clean == ident and len(name) <= limit:
        return name
    return f"{name[: limit - 9].rstrip('-')}-{_digest(ident)}"


def request_labels(request: Request) -> dict[str, str]:
    """The labels every object of this request carries: tenant, project, tier, allocation id."""
    return {
        **MANAGED_BY,
        TENANT: label_value(request.tenant),
        PROJECT: label_value(request.project),
        TIER: request.tier.value,
        ALLOCATION: label_value(request.id),
    }


def placement_json(slices: Iterable[GpuSlice], shares: Iterable[NodeShare]) -> str:
    """The placement as compact JSON: GPU slices and per-node CPU and memory, in placement order."""
    return json.dumps(
        {
            "gpus": [[s.node, s.gpu, s.milli, s.gpu_memory_mib] for s in slices],
            "shares": [[s.node, s.cpu_milli, s.memory_mib] for s in shares],
        },
        separators=(",", ":"),
    )


def request_annotations(request: Request, placement: str = "", gpus: str = "") -> dict[str, str]:
    """Annotations with the exact tenant, project, tier and allocation id, and the placement JSON."""
    out = {TENANT: request.tenant, PROJECT: request.project, TIER: request.tier.value, ALLOCATION: request.id}
    if placement:
        out[PLACEMENT] = placement
    if gpus:
        out[GPUS] = gpus
    return out


def allocation_annotations(allocation: Allocation, gpus: str = "") -> dict[str, str]:
    """`request_annotations` for an allocation, with its whole placement."""
    return request_annotations(
        allocation.request, placement_json(allocation.placement.slices, allocation.placement.shares), gpus
    )


def node_affinity(nodes: Sequence[str]) -> client.V1Affinity:
    """A required node affinity to exactly `nodes` (by node name)."""
    requirement = client.V1NodeSelectorRequirement(key="metadata.name", operator="In", values=sorted(set(nodes)))
    term = client.V1NodeSelectorTerm(match_fields=[requirement])
    return client.V1Affinity(
        node_affinity=client.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=client.V1NodeSelector(node_selector_terms=[term])
        )
    )


def termination_grace(settings: K8sSettings) -> int:
    """A run pod's `terminationGracePeriodSeconds`: the longest preemption grace, rounded up, so the
    kubelet's SIGTERM is the run's notice and its SIGKILL comes only after that grace."""
    return math.ceil(settings.termination_grace_s)


def tolerations(settings: K8sSettings) -> list[client.V1Toleration]:
    """The GPU-taint tolerations from the settings."""
    return [
        client.V1Toleration(key=t.key, operator=t.operator, value=t.value or None, effect=t.effect)
        for t in settings.gpu_tolerations
    ]


def resources(gpus: NodeGpus, cpu_milli: int, memory_mib: int) -> client.V1ResourceRequirements:
    """Container resources: GPU limits (extended resources equal their requests), CPU and memory requests."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = dict(gpus.limits)
    if cpu_milli:
        requests["cpu"] = f"{cpu_milli}m"
    if memory_mib:
        requests["memory"] = f"{memory_mib}Mi"
        limits["memory"] = f"{memory_mib}Mi"
    requests.update(gpus.limits)
    claims = [client.CoreV1ResourceClaim(name=CLAIM_NAME)] if gpus.claim is not None else None
    return client.V1ResourceRequirements(requests=requests or None, limits=limits or None, claims=claims)


def pod_claims(gpus: NodeGpus, template_name: str) -> list[client.V1PodResourceClaim] | None:
    """The pod's resource claims: one from `template_name` when the GPUs are claimed through DRA."""
    if gpus.claim is None:
        return None
    return [client.V1PodResourceClaim(name=CLAIM_NAME, resource_claim_template_name=template_name)]


def claim_template(
    name: str, namespace: str, gpus: NodeGpus, labels: Mapping[str, str]
) -> client.V1ResourceClaimTemplate | None:
    """The DRA ResourceClaimTemplate a pod's claim comes from, or None in device-plugin mode."""
    if gpus.claim is None:
        return None
    return client.V1ResourceClaimTemplate(
        api_version="resource.k8s.io/v1",
        kind="ResourceClaimTemplate",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=dict(labels)),
        spec=client.V1ResourceClaimTemplateSpec(
            metadata=client.V1ObjectMeta(labels=dict(labels)),
            spec=client.V1ResourceClaimSpec(devices=client.V1DeviceClaim(requests=[gpus.claim])),
        ),
    )


@dataclass(frozen=True)
class Workload:
    """What runs in the pods: image (the settings' when empty), command, args, env, serving port."""

    image: str = ""
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    port: int = 8000


DEFAULT_WORKLOAD = Workload()


def plain(obj: Any) -> Any:
    """A kubernetes model (or nested lists/dicts of them) as snake_case dicts without None values."""
    if hasattr(obj, "openapi_types"):
        return {k: plain(getattr(obj, k)) for k in obj.openapi_types if getattr(obj, k) is not None}
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [plain(v) for v in obj]
    return obj


def manifest(obj: Any) -> dict[str, Any]:
    """A kubernetes model as the camelCase dict the API server (and kubernetes-validate) reads."""
    return client.ApiClient().sanitize_for_serialization(obj)


def pin_pod_patch(
    node: str, annotations: Mapping[str, str], labels: Mapping[str, str], *, has_affinity: bool
) -> list[dict[str, Any]]:
    """JSON patch that narrows a gated pod to `node`, labels and annotates it, and lifts the gate.

    Kubernetes lets a gated pod's node affinity be set when it has none, or narrowed by adding a
    requirement to its existing term (`has_affinity`: the pod template pins it to a set of nodes).
    """

    def escape(key: str) -> str:
        return key.replace("~", "~0").replace("/", "~1")

    ops: list[dict[str, Any]] = [
        {"op": "add", "path": f"/metadata/annotations/{escape(k)}", "value": v} for k, v in sorted(annotations.items())
    ]
    ops += [{"op": "add", "path": f"/metadata/labels/{escape(k)}", "value": v} for k, v in sorted(labels.items())]
    if has_affinity:
        term = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0"
        requirement = {"key": "metadata.name", "operator": "In", "values": [node]}
        ops.append({"op": "add", "path": f"{term}/matchFields/-", "value": requirement})
    else:
        ops.append({"op": "add", "path": "/spec/affinity", "value": manifest(node_affinity([node]))})
    ops.append({"op": "remove", "path": "/spec/schedulingGates"})
    return ops
