"""Small builders for launch tests: a pool with every GPU case, and allocations placed on it.

alloc("a").gpus("h100-0", 0, 1, 2, 3).build()
alloc("m").fraction("a100-mig", gpu=0, milli=250, asked=142, memory=9856).build()
"""

from __future__ import annotations

from dataclasses import replace

from xirang_platform.pool.model import MILLI_PER_GPU, Pool
from xirang_platform.pool.yaml_inventory import parse_inventory
from xirang_platform.scheduling.model import Allocation, GpuSlice, NodeShare, Placement, Request, Tier

POOL_YAML = """
schema_version: 1
name: launch-tests
unit_milli: {L40S: 125, A100-80: 125}
nodes:
  - name: h100-{index}
    count: 3
    model: H100-SXM
    gpus: 8
    cpu: 224
    memory: 2Ti
    domain: island
    labels: {nvidia.com/gpu.clique: 7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1}
  - name: a100-mig
    model: A100-80
    gpus: 8
    cpu: 256
    memory: 1Ti
    labels: {nvidia.com/mig.strategy: mixed, nvidia.com/mig-1g.10gb.count: "28", nvidia.com/mig-3g.40gb.count: "8"}
  - name: a100-single
    model: A100-80
    gpus: 8
    cpu: 256
    memory: 1Ti
    labels: {nvidia.com/mig.strategy: single, nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB-MIG-1g.10gb}
  - name: l40s-0
    model: L40S
    gpus: 2
    cpu: 64
    memory: 512Gi
    gpu_uuids: [GPU-5a1e2c3b-0000-4000-8000-000000000000, GPU-5a1e2c3b-0000-4000-8000-000000000001]
  - name: l40s-1
    model: L40S
    gpus: 4
    cpu: 64
    memory: 512Gi
"""


def launch_pool() -> Pool:
    """Three H100 nodes in one NVLink domain, a MIG mixed and a MIG single A100 node, two L40S nodes."""
    return parse_inventory(POOL_YAML, "launch-tests")


class AllocationBuilder:
    """Fluent builder of an admitted `Allocation`; CPU 8 cores and 64 GiB per node unless told."""

    def __init__(self, rid: str) -> None:
        self._request = Request(rid, "vision", "detector", Tier.OFFLINE_TRAINING, 0.0, gpus=0)
        self._slices: list[GpuSlice] = []
        self._nodes: list[str] = []
        self._cpu, self._mem = 8000, 65536

    def tier(self, tier: Tier) -> AllocationBuilder:
        self._request = replace(self._request, tier=tier)
        return self

    def owner(self, tenant: str, project: str) -> AllocationBuilder:
        self._request = replace(self._request, tenant=tenant, project=project)
        return self

    def gpus(self, node: str, *indices: int) -> AllocationBuilder:
        """Whole GPUs `indices` of `node` (call again for another node of a gang)."""
        self._slices += [GpuSlice(node, g, MILLI_PER_GPU) for g in indices]
        self._nodes.append(node)
        self._request = replace(self._request, gpus=len(self._slices))
        return self

    def fraction(self, node: str, gpu: int, milli: int, asked: int | None = None, memory: int = 0) -> AllocationBuilder:
        """`milli` of one GPU reserved (`asked`: what the request asked, before unit rounding)."""
        self._slices = [GpuSlice(node, gpu, milli)]
        self._nodes = [node]
        self._request = replace(self._request, gpus=1, milli_per_gpu=asked or milli, gpu_memory_mib=memory)
        return self

    def build(self) -> Allocation:
        shares = tuple(NodeShare(n, self._cpu, self._mem) for n in self._nodes)
        return Allocation(self._request, Placement(tuple(self._slices), shares), start=0.0)


def alloc(rid: str) -> AllocationBuilder:
    """An allocation builder."""
    return AllocationBuilder(rid)
