"""The resource model: GPU models, nodes, compute units and the pool (DESIGN.md section 3).

Everything here is plain, immutable data. Capacity is counted in milli-GPU (1000 = one GPU), so
fractions are exact integers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from xirang_platform.base.units import MILLI_PER_GPU as MILLI_PER_GPU  # the pool's unit, read from here too


@dataclass(frozen=True)
class MigProfile:
    """One MIG profile of a GPU model, e.g. `1g.10gb`, seven of which fit on an A100-80GB."""

    name: str
    compute_slices: int
    memory_gb: int
    max_instances: int

    @property
    def milli(self) -> int:
        """The profile's share of the GPU in milli-GPU (compute slices out of seven)."""
        return self.compute_slices * MILLI_PER_GPU // 7


@dataclass(frozen=True)
class GpuModel:
    """A GPU model as the catalog knows it.

    `compute_level` is an integer, higher is faster: the dense BF16 tensor TFLOPS (FP16 where the
    GPU has no BF16), rounded. `known` is False for a model that discovery reported and the
    catalog lacks; it is kept with what NVML said, and flagged.
    """

    name: str
    memory_mib: int
    compute_level: int
    architecture: str = ""
    nvml_names: tuple[str, ...] = ()
    mig_profiles: tuple[MigProfile, ...] = ()
    interconnect: str = "pcie"
    known: bool = True
    notes: str = ""

    @property
    def memory_gb(self) -> float:
        """Memory in GiB, for display."""
        return self.memory_mib / 1024


@dataclass(frozen=True)
class Node:
    """A machine in the pool: GPUs of one model, CPU, memory and its interconnect domain.

    `model` is None for a CPU-only node (then `gpus` is 0). `unit_milli` is the pool's standard
    slice of this node's GPUs: 1000 means whole GPUs only, 125 means eighths.
    """

    name: str
    model: GpuModel | None
    gpus: int
    cpu_milli: int
    memory_mib: int
    domain: str
    unit_milli: int = MILLI_PER_GPU
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    gpu_uuids: tuple[str, ...] = ()

    @property
    def gpu_milli(self) -> int:
        """GPU capacity of the node in milli-GPU."""
        return self.gpus * MILLI_PER_GPU

    @property
    def model_name(self) -> str:
        """The GPU model's name, or an empty string for a CPU-only node."""
        return self.model.name if self.model else ""


@dataclass(frozen=True)
class ComputeUnit:
    """One standard slice of one GPU, carrying everything placement and launchers need to know."""

    node: str
    gpu_index: int
    gpu_uuid: str
    offset_milli: int
    milli: int
    model: str
    memory_mib: int
    compute_level: int
    domain: str


@dataclass(frozen=True)
class Pool:
    """Every node of the shared pool, in a fixed order (sorted by name)."""

    nodes: tuple[Node, ...]
    source: str = ""

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"pool {self.source!r} names nodes twice: {dup[:5]}; give each node a unique name")
        object.__setattr__(self, "nodes", tuple(sorted(self.nodes, key=lambda n: n.name)))

    @property
    def gpu_milli(self) -> int:
        """Total GPU capacity in milli-GPU."""
        return sum(n.gpu_milli for n in self.nodes)

    @property
    def gpus(self) -> int:
        """Total number of GPUs."""
        return sum(n.gpus for n in self.nodes)

    @property
    def models(self) -> tuple[str, ...]:
        """The GPU model names present, sorted."""
        return tuple(sorted({n.model.name for n in self.nodes if n.model}))

    @property
    def domains(self) -> tuple[str, ...]:
        """The interconnect domains present, sorted."""
        return tuple(sorted({n.domain for n in self.nodes}))

    def node(self, name: str) -> Node:
        """The node called `name` (KeyError if there is none)."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def units(self) -> Iterator[ComputeUnit]:
        """Every compute unit of the pool, in node, GPU, offset order."""
        for n in self.nodes:
            if n.model is None:
                continue
            for g in range(n.gpus):
                uuid = n.gpu_uuids[g] if g < len(n.gpu_uuids) else f"{n.name}/gpu{g}"
                for offset in range(0, MILLI_PER_GPU, n.unit_milli):
                    yield ComputeUnit(
                        node=n.name,
                        gpu_index=g,
                        gpu_uuid=uuid,
                        offset_milli=offset,
                        milli=n.unit_milli,
                        model=n.model.name,
                        memory_mib=n.model.memory_mib,
                        compute_level=n.model.compute_level,
                        domain=n.domain,
                    )
