"""Discovery: describe this machine's GPUs as a pool `Node`, through NVML (DESIGN.md section 3).

The NVML calls sit behind the small `NvmlBackend` protocol: `PynvmlBackend` is the real one
(package nvidia-ml-py, `import pynvml`), and tests drive the same logic through an in-memory fake
that raises pynvml's own exception classes. Following go-nvlib, a function the driver lacks
(`NVMLError_FunctionNotFound`) or a feature the GPU lacks (`NVMLError_NotSupported`) means "absent",
never an error.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import pynvml

from xirang_platform.pool.catalog import Catalog, default_catalog, gfd_product_label, model_entry
from xirang_platform.pool.model import MILLI_PER_GPU, GpuModel, Node

NO_DRIVER = "no NVIDIA driver found (libnvidia-ml.so.1): run on a GPU node, or describe the pool in a YAML inventory"
_ABSENT = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound)


class DiscoveryError(RuntimeError):
    """NVML is missing or failed, or the machine cannot be described as one node."""


@dataclass(frozen=True)
class FabricInfo:
    """What `nvmlDeviceGetGpuFabricInfoV` says about a GPU's multi-node NVLink fabric."""

    cluster_uuid: str
    clique_id: int
    state: int
    status: int

    @property
    def attached(self) -> bool:
        """True when the GPU has joined a fabric (go-nvlib's IsFabricAttached rule)."""
        return (
            self.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
            and self.status == pynvml.NVML_SUCCESS
            and self.cluster_uuid.strip("0-") != ""
        )

    @property
    def clique(self) -> str:
        """The clique id as GFD labels it: `<clusterUuid>.<cliqueId>`."""
        return f"{self.cluster_uuid}.{self.clique_id}"


class NvmlBackend(Protocol):
    """The NVML calls discovery needs, per GPU index. Methods may raise `pynvml.NVMLError` subclasses."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def device_count(self) -> int: ...
    def name(self, index: int) -> str: ...
    def uuid(self, index: int) -> str: ...
    def memory_total_bytes(self, index: int) -> int: ...
    def compute_capability(self, index: int) -> tuple[int, int]: ...
    def mig_mode(self, index: int) -> tuple[int, int]: ...
    def mig_device_uuids(self, index: int) -> list[str]: ...
    def fabric_info(self, index: int) -> FabricInfo: ...
    def nvlink_active_links(self, index: int) -> int: ...


class PynvmlBackend:
    """The real NVML, through nvidia-ml-py."""

    def init(self) -> None:
        """Load libnvidia-ml and initialise NVML."""
        pynvml.nvmlInit()

    def shutdown(self) -> None:
        """Release NVML."""
        pynvml.nvmlShutdown()

    def driver_version(self) -> str:
        """The driver version string, e.g. "550.107.02"."""
        return str(pynvml.nvmlSystemGetDriverVersion())

    def device_count(self) -> int:
        """How many GPUs NVML sees."""
        return int(pynvml.nvmlDeviceGetCount())

    def _handle(self, index: int) -> Any:
        return pynvml.nvmlDeviceGetHandleByIndex(index)

    def name(self, index: int) -> str:
        """The GPU's product name, e.g. "NVIDIA H100 80GB HBM3"."""
        return str(pynvml.nvmlDeviceGetName(self._handle(index)))

    def uuid(self, index: int) -> str:
        """The GPU's UUID ("GPU-...")."""
        return str(pynvml.nvmlDeviceGetUUID(self._handle(index)))

    def memory_total_bytes(self, index: int) -> int:
        """Total GPU memory in bytes."""
        return int(pynvml.nvmlDeviceGetMemoryInfo(self._handle(index)).total)

    def compute_capability(self, index: int) -> tuple[int, int]:
        """The CUDA compute capability (major, minor)."""
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(self._handle(index))
        return int(major), int(minor)

    def mig_mode(self, index: int) -> tuple[int, int]:
        """MIG mode (current, pending); NotSupported on GPUs without MIG."""
        current, pending = pynvml.nvmlDeviceGetMigMode(self._handle(index))
        return int(current), int(pending)

    def mig_device_uuids(self, index: int) -> list[str]:
        """UUIDs of the MIG devices present on the GPU (empty slots skipped, as go-nvlib does)."""
        handle = self._handle(index)
        out = []
        for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
                continue
            out.append(str(pynvml.nvmlDeviceGetUUID(mig)))
        return out

    def fabric_info(self, index: int) -> FabricInfo:
        """The GPU's NVLink fabric state; NotSupported before Hopper or without NVSwitch fabric."""
        handle = self._handle(index)
        try:
            info: Any = pynvml.c_nvmlGpuFabricInfo_v3_t()
            pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        except pynvml.NVMLError_FunctionNotFound:
            info = pynvml.c_nvmlGpuFabricInfo_t()
            pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
        raw = bytes(info.clusterUuid).hex()
        uuid = f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"
        return FabricInfo(uuid, int(info.cliqueId), int(info.state), int(info.status))

    def nvlink_active_links(self, index: int) -> int:
        """How many NVLink links of the GPU are up; NotSupported without NVLink."""
        handle = self._handle(index)
        active = 0
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = pynvml.nvmlDeviceGetNvLinkState(handle, link)
            except pynvml.NVMLError_InvalidArgument:
                break
            active += int(state == pynvml.NVML_FEATURE_ENABLED)
        return active


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as discovery saw it."""

    index: int
    name: str
    uuid: str
    memory_mib: int
    compute_capability: tuple[int, int]
    mig_capable: bool
    mig_enabled: bool
    mig_devices: tuple[str, ...] = ()
    nvlink_links: int = 0
    clique: str = ""


@dataclass(frozen=True)
class Discovery:
    """What discovery found: the node, its GPUs and the driver."""

    node: Node
    gpus: tuple[GpuInfo, ...]
    driver_version: str = ""
    warnings: tuple[str, ...] = field(default=())


def _optional(call: Any, *args: Any, default: Any = None, absent: Any = _ABSENT) -> Any:
    """`call(*args)`, or `default` when the driver lacks the function or the GPU the feature."""
    try:
        return call(*args)
    except absent:
        return default


def _gpu_info(backend: NvmlBackend, index: int) -> GpuInfo:
    mode = _optional(backend.mig_mode, index)
    enabled = mode is not None and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
    # Fabric and NVLink state only refine the domain: any NVML error there means "unknown", not a failure.
    fabric = _optional(backend.fabric_info, index, absent=pynvml.NVMLError)
    return GpuInfo(
        index=index,
        name=backend.name(index),
        uuid=backend.uuid(index),
        memory_mib=backend.memory_total_bytes(index) // (1024 * 1024),
        compute_capability=backend.compute_capability(index),
        mig_capable=mode is not None,
        mig_enabled=enabled,
        mig_devices=tuple(_optional(backend.mig_device_uuids, index, default=[])) if enabled else (),
        nvlink_links=_optional(backend.nvlink_active_links, index, default=0, absent=pynvml.NVMLError),
        clique=fabric.clique if fabric is not None and fabric.attached else "",
    )


def host_memory_mib(meminfo: str | Path = "/proc/meminfo") -> int:
    """The host's total memory in MiB, from /proc/meminfo's MemTotal (0 if unreadable)."""
    try:
        for line in Path(meminfo).read_text(encoding="ascii").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return 0
    return 0


def _labels(model: GpuModel, gpus: tuple[GpuInfo, ...], driver: str) -> dict[str, str]:
    first = gpus[0]
    labels = {
        "nvidia.com/gpu.product": gfd_product_label(first.name),
        "nvidia.com/gpu.memory": str(first.memory_mib),
        "nvidia.com/gpu.count": str(len(gpus)),
        "nvidia.com/gpu.family": model.architecture,
        "nvidia.com/gpu.compute.major": str(first.compute_capability[0]),
        "nvidia.com/gpu.compute.minor": str(first.compute_capability[1]),
        "nvidia.com/mig.capable": str(first.mig_capable).lower(),
        "xirang/mig.enabled": str(any(g.mig_enabled for g in gpus)).lower(),
        "xirang/nvlink": str(all(g.nvlink_links > 0 for g in gpus)).lower(),
    }
    if driver:
        labels["nvidia.com/cuda.driver-version.full"] = driver
    if first.clique:
        labels["nvidia.com/gpu.clique"] = first.clique
    return dict(sorted(labels.items()))


def discover_details(
    backend: NvmlBackend | None = None,
    catalog: Catalog | None = None,
    hostname: str | None = None,
    unit_milli: int = MILLI_PER_GPU,
    cpu_count: int | None = None,
    memory_mib: int | None = None,
) -> Discovery:
    """This machine (or the one `backend` describes) as a `Discovery`: node, GPUs, driver."""
    backend = backend or PynvmlBackend()
    catalog = catalog or default_catalog()
    try:
        backend.init()
    except (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded):
        raise DiscoveryError(NO_DRIVER) from None
    except pynvml.NVMLError as exc:
        raise DiscoveryError(f"NVML failed to start ({exc}): check the driver with nvidia-smi") from None
    try:
        driver = _optional(backend.driver_version, default="")
        gpus = tuple(_gpu_info(backend, i) for i in range(backend.device_count()))
    except pynvml.NVMLError as exc:
        raise DiscoveryError(f"NVML failed while reading the GPUs ({exc}): check the driver with nvidia-smi") from None
    finally:
        _optional(backend.shutdown)
    host = hostname or socket.gethostname()
    cpu = (cpu_count if cpu_count is not None else os.cpu_count() or 0) * 1000
    memory = memory_mib if memory_mib is not None else host_memory_mib()
    if not gpus:
        node = Node(name=host, model=None, gpus=0, cpu_milli=cpu, memory_mib=memory, domain=host)
        return Discovery(node, (), driver, ("NVML sees no GPU: this is a CPU-only node",))
    names = sorted({g.name for g in gpus})
    if len(names) > 1:
        raise DiscoveryError(
            f"this machine has GPUs of several models ({', '.join(names)}): a node holds one "
            "model, so describe it in a YAML inventory as one node per model"
        )
    first = gpus[0]
    model = catalog.from_nvml(first.name, first.memory_mib, first.compute_capability)
    warnings = []
    if not model.known:
        if all(g.nvlink_links > 0 for g in gpus):
            model = dataclasses.replace(model, interconnect="nvlink")
        warnings.append(model.notes)
    cliques = {g.clique for g in gpus}
    domain = first.clique if len(cliques) == 1 and first.clique else host
    node = Node(
        name=host,
        model=model,
        gpus=len(gpus),
        cpu_milli=cpu,
        memory_mib=memory,
        domain=domain,
        unit_milli=unit_milli,
        labels=MappingProxyType(_labels(model, gpus, driver)),
        gpu_uuids=tuple(g.uuid for g in gpus),
    )
    return Discovery(node, gpus, driver, tuple(warnings))


def discover(backend: NvmlBackend | None = None, catalog: Catalog | None = None) -> Node:
    """This machine's GPUs, CPU and memory as a pool `Node` (DiscoveryError without an NVIDIA driver)."""
    return discover_details(backend, catalog).node


def inventory_fragment(found: Discovery) -> dict[str, Any]:
    """A YAML inventory (schema_version 1) holding the discovered node; `read_inventory` accepts it."""
    node = found.node
    entry: dict[str, Any] = {"name": node.name}
    if node.model is not None:
        entry.update(model=node.model.name, gpus=node.gpus)
    entry.update(
        cpu=node.cpu_milli // 1000 if node.cpu_milli % 1000 == 0 else f"{node.cpu_milli}m",
        memory=f"{node.memory_mib}Mi",
        domain=node.domain,
    )
    if node.labels:
        entry["labels"] = dict(node.labels)
    if node.gpu_uuids:
        entry["gpu_uuids"] = list(node.gpu_uuids)
    doc: dict[str, Any] = {"schema_version": 1, "name": node.name}
    if node.model is not None:
        doc["unit_milli"] = {node.model.name: node.unit_milli}
        if not node.model.known:
            doc["models"] = [model_entry(node.model)]
    doc["nodes"] = [entry]
    return doc


# --- Kubernetes node labels (GPU Feature Discovery) ------------------------------------------------

GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_COUNT = "nvidia.com/gpu.count"
GFD_MEMORY = "nvidia.com/gpu.memory"
GFD_CLIQUE = "nvidia.com/gpu.clique"
TOPOGRAPH_DOMAIN = "accelerator.topograph.run/domain"


def node_from_labels(
    name: str,
    labels: Mapping[str, str],
    cpu_milli: int,
    memory_mib: int,
    catalog: Catalog | None = None,
    unit_milli: int = MILLI_PER_GPU,
) -> Node:
    """A pool `Node` from a Kubernetes node's GFD labels (`nvidia.com/gpu.product`, `gpu.count`, ...).

    The domain is the NVLink clique (`nvidia.com/gpu.clique`), else Topograph's accelerator domain,
    else the node itself. A node without a product label is CPU-only.
    """
    catalog = catalog or default_catalog()
    product = labels.get(GFD_PRODUCT, "")
    domain = labels.get(GFD_CLIQUE) or labels.get(TOPOGRAPH_DOMAIN) or name
    if not product:
        return Node(name=name, model=None, gpus=0, cpu_milli=cpu_milli, memory_mib=memory_mib, domain=domain)
    if "-MIG-" in product.upper():
        raise DiscoveryError(
            f"node {name}: {GFD_PRODUCT}={product} is a MIG 'single' strategy label, whose "
            f"{GFD_COUNT} counts MIG devices, not GPUs: describe this node in a YAML inventory"
        )
    values = {}
    for key in (GFD_COUNT, GFD_MEMORY, "nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor"):
        raw = labels.get(key, "0" if key != GFD_COUNT else "")
        try:
            values[key] = int(raw)
        except ValueError:
            raise DiscoveryError(
                f"node {name}: label {key}={raw!r} is not an integer: check that GPU Feature Discovery runs on the node"
            ) from None
    if values[GFD_COUNT] < 1:
        raise DiscoveryError(
            f"node {name}: {GFD_PRODUCT} is set but {GFD_COUNT} is {values[GFD_COUNT]}: "
            "check that GPU Feature Discovery runs on the node"
        )
    model = catalog.find(product) or catalog.from_nvml(
        product,
        values[GFD_MEMORY],
        (values["nvidia.com/gpu.compute.major"], values["nvidia.com/gpu.compute.minor"]),
        reported_by=f"label {GFD_PRODUCT}",
    )
    return Node(
        name=name,
        model=model,
        gpus=values[GFD_COUNT],
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        domain=domain,
        unit_milli=unit_milli,
        labels=MappingProxyType({k: labels[k] for k in sorted(labels) if k.startswith("nvidia.com/")}),
    )
