"""The pool from a live cluster: nodes' GPU Feature Discovery labels into the same `Pool` as a YAML inventory.

GFD (NVIDIA's gpu-feature-discovery, part of the GPU Operator) labels every GPU node with
`nvidia.com/gpu.product` (the NVML name with spaces as '-'), `nvidia.com/gpu.count`,
`nvidia.com/gpu.memory` (MiB), `nvidia.com/gpu.clique` (multi-node NVLink partition) and, with MIG,
`nvidia.com/mig.strategy` and `nvidia.com/mig-<profile>.count` (notes/gpu.md section 2).

- The model is the catalog's entry for the product label (any alias, NVML name or GFD spelling;
  `-MIG-...` and `-SHARED` suffixes are ignored). An unknown product fails with the node, the label
  and the fix, and no pool is returned.
- GPUs: `nvidia.com/gpu.count`; under the MIG `single` strategy it counts MIG devices, so the GPUs
  are that count over the profile's instances per GPU.
- Domain: the first of `domain_labels` the node carries (`nvidia.com/gpu.clique` by default), else the
  node is its own domain; CPU-only nodes share the domain `cpu`.
- CPU and memory: the node's allocatable amounts. Every label is kept on the node (launchers read
  the MIG labels from there).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from types import MappingProxyType
from typing import Any

from xirang_platform.pool.catalog import Catalog, default_catalog
from xirang_platform.pool.model import MILLI_PER_GPU, Node, Pool
from xirang_platform.pool.openb_csv import CPU_ONLY_DOMAIN

PRODUCT = "nvidia.com/gpu.product"
COUNT = "nvidia.com/gpu.count"
MEMORY = "nvidia.com/gpu.memory"
CLIQUE = "nvidia.com/gpu.clique"
MIG_STRATEGY = "nvidia.com/mig.strategy"
DEFAULT_DOMAIN_LABELS = (CLIQUE,)
_QUANTITY_RE = re.compile(r"^([0-9.]+(?:[eE][-+]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX: dict[str | None, Decimal] = {
    None: Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    **{s: Decimal(1000) ** (i + 1) for i, s in enumerate("kMGTPE")},
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes resource quantity ("191450m", "2045765836Ki", "64") as a number; ValueError if malformed.

    (The pool layer does not import the kubernetes client; this is its quantity grammar.)
    """
    m = _QUANTITY_RE.match(str(text).strip())
    if not m:
        raise ValueError(f"{text!r} is not a quantity")
    try:
        return Decimal(m[1]) * _SUFFIX[m[2]]
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a quantity") from None


def single_strategy_profile(product: str) -> str:
    """The MIG profile a `nvidia.com/gpu.product` label names under the MIG "single" strategy, or ""."""
    if "-MIG-" not in product:
        return ""
    return product.split("-MIG-", 1)[1].removesuffix("-SHARED").replace(".me", "+me")


class LabelError(ValueError):
    """A node whose labels cannot be read into the pool: names the node, the label and the fix."""


def _int_label(name: str, labels: Mapping[str, str], key: str) -> int:
    value = labels.get(key, "")
    if not value.isdigit():
        raise LabelError(
            f"node {name}: label {key}={value!r} is not a count; GPU Feature Discovery writes it: check that "
            "gpu-feature-discovery runs on the node (kubectl -n gpu-operator get pods -o wide)"
        )
    return int(value)


def _gpus(name: str, labels: Mapping[str, str], model_mig: dict[str, int]) -> int:
    count = _int_label(name, labels, COUNT)
    product = labels[PRODUCT]
    profile = single_strategy_profile(product)
    if labels.get(MIG_STRATEGY) == "single" and profile:
        per_gpu = model_mig.get(profile)
        if per_gpu is None:
            raise LabelError(
                f"node {name}: {PRODUCT}={product!r} names MIG profile {profile!r}, which the catalog's model "
                "does not list; add the profile to the model's `mig` list in gpu_catalog.yaml"
            )
        return math.ceil(count / per_gpu)
    return count


def node_from_labels(
    node: Any,
    catalog: Catalog | None = None,
    unit_milli: Mapping[str, int] | None = None,
    domain_labels: Sequence[str] = DEFAULT_DOMAIN_LABELS,
) -> Node:
    """One `V1Node` (as `list_node` returns it) as a pool `Node`; LabelError naming the label and fix."""
    catalog = catalog or default_catalog()
    name = node.metadata.name
    labels = {str(k): str(v) for k, v in sorted((node.metadata.labels or {}).items())}
    allocatable = (node.status.allocatable or {}) if node.status else {}
    try:
        cpu_milli = int(parse_quantity(allocatable.get("cpu", "0")) * 1000)
        memory_mib = int(parse_quantity(allocatable.get("memory", "0")) / (1024 * 1024))
    except ValueError as exc:
        raise LabelError(
            f"node {name}: allocatable cpu/memory cannot be read ({exc}); check `kubectl get node {name}`"
        ) from None
    product = labels.get(PRODUCT, "")
    if not product or labels.get(COUNT) == "0":
        return Node(name, None, 0, cpu_milli, memory_mib, CPU_ONLY_DOMAIN, labels=MappingProxyType(labels))
    model = catalog.find(product)
    if model is None:
        suggestions = catalog.suggest(product)
        hint = f" (did you mean {', '.join(suggestions)}?)" if suggestions else ""
        raise LabelError(
            f"node {name}: label {PRODUCT}={product!r} is not a GPU model the catalog knows{hint}; add "
            f"{product!r} to the `aliases` of its model in gpu_catalog.yaml, or add a model entry for it"
        )
    gpus = _gpus(name, labels, {p.name: p.max_instances for p in model.mig_profiles})
    domain = next((labels[key] for key in domain_labels if labels.get(key)), name)
    unit = (unit_milli or {}).get(model.name, MILLI_PER_GPU)
    return Node(name, model, gpus, cpu_milli, memory_mib, domain, unit, MappingProxyType(labels))


def pool_from_nodes(
    nodes: Iterable[Any],
    catalog: Catalog | None = None,
    unit_milli: Mapping[str, int] | None = None,
    domain_labels: Sequence[str] = DEFAULT_DOMAIN_LABELS,
    source: str = "cluster",
) -> Pool:
    """A pool from `V1Node` objects; LabelError on the first node that cannot be read."""
    built = [node_from_labels(n, catalog, unit_milli, domain_labels) for n in nodes]
    if not built:
        raise LabelError(
            f"{source}: no nodes listed; check the label selector and that the kubeconfig names the cluster"
        )
    return Pool(tuple(built), source=source)


def read_cluster_pool(
    core_api: Any,
    label_selector: str = "",
    catalog: Catalog | None = None,
    unit_milli: Mapping[str, int] | None = None,
    domain_labels: Sequence[str] = DEFAULT_DOMAIN_LABELS,
) -> Pool:
    """The pool from the cluster behind `core_api` (a `CoreV1Api`): every node `label_selector` matches."""
    listed = core_api.list_node(label_selector=label_selector or None)
    source = f"cluster ({label_selector})" if label_selector else "cluster"
    return pool_from_nodes(listed.items, catalog, unit_milli, domain_labels, source)


def inventory_doc(pool: Pool, name: str = "cluster") -> dict[str, Any]:
    """The pool as a YAML inventory document (schema_version 1) that `parse_inventory` reads back."""
    units = {n.model.name: n.unit_milli for n in pool.nodes if n.model and n.unit_milli != MILLI_PER_GPU}
    doc: dict[str, Any] = {"schema_version": 1, "name": name}
    if units:
        doc["unit_milli"] = dict(sorted(units.items()))
    doc["nodes"] = [
        {
            "name": n.name,
            **({"model": n.model.name, "gpus": n.gpus} if n.model else {}),
            "cpu": f"{n.cpu_milli}m",
            "memory": n.memory_mib,
            "domain": n.domain,
            **({"labels": dict(n.labels)} if n.labels else {}),
        }
        for n in pool.nodes
    ]
    return doc
