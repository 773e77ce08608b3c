"""Strict schema validation of Kubernetes objects with kubernetes-validate (offline, bundled schemas).

kubernetes-validate 1.37.0 bundles schemas up to Kubernetes 1.37, so both versions the project
supports are checked for real: 1.33 (the oldest supported) and 1.37 (the newest).
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate

VERSIONS = ("1.33.0", "1.37.0")
DRA_VERSIONS = ("1.34.0", "1.37.0")  # resource.k8s.io/v1 is GA from 1.34


def validate_strictly(doc: dict[str, Any], versions: tuple[str, ...] = VERSIONS) -> None:
    """Raise kubernetes_validate.ValidationError if `doc` is not a valid object in every version."""
    for version in versions:
        kubernetes_validate.validate(doc, version, strict=True)


def versions_for(doc: dict[str, Any]) -> tuple[str, ...]:
    """The versions a rendered object must validate against (DRA objects exist from 1.34)."""
    return DRA_VERSIONS if doc["apiVersion"].startswith("resource.k8s.io/") else VERSIONS


def pod_facts(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """A pod spec's placement fields: GPU limits, pinned nodes, tolerations, priority, claims."""
    container = pod_spec["containers"][0]
    limits = container.get("resources", {}).get("limits", {})
    terms = pod_spec.get("affinity", {}).get("nodeAffinity", {})
    terms = terms.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
    return {
        "gpu": {k: v for k, v in limits.items() if k.startswith("nvidia.com/")},
        "nodes": [v for t in terms for f in t.get("matchFields", []) for v in f["values"]],
        "tolerates_gpu": any(t["key"] == "nvidia.com/gpu" for t in pod_spec.get("tolerations", [])),
        "priority": pod_spec.get("priorityClassName"),
        "claims": [c["resourceClaimTemplateName"] for c in pod_spec.get("resourceClaims", [])],
        "gated": bool(pod_spec.get("schedulingGates")),
    }
