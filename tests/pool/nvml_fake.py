"""An in-memory NVML backend for discovery tests: GPUs as data, errors as pynvml's own classes."""

from __future__ import annotations

from dataclasses import dataclass, field

import pynvml

from xirang_platform.pool.discover import FabricInfo

GIB = 1024**3


@dataclass
class FakeGpu:
    """One fake GPU; None for mig / nvlink / fabric means the GPU does not support it."""

    name: str
    uuid: str
    memory_bytes: int
    cc: tuple[int, int]
    mig: tuple[int, int] | None = None
    mig_devices: list[str] = field(default_factory=list)
    nvlink: int | None = None
    fabric: FabricInfo | None = None


class FakeNvml:
    """Implements `NvmlBackend`; `missing` names methods whose NVML symbol the driver lacks."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        driver: str = "550.107.02",
        missing: frozenset[str] = frozenset(),
        init_error: pynvml.NVMLError | None = None,
        failing: dict[str, pynvml.NVMLError] | None = None,
    ):
        self.gpus = gpus
        self.driver = driver
        self.missing = missing
        self.init_error = init_error
        self.failing = failing or {}
        self.initialised = False
        self.shut_down = False

    def _check(self, call: str) -> None:
        if call in self.missing:
            raise pynvml.NVMLError_FunctionNotFound()
        if call in self.failing:
            raise self.failing[call]

    def init(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.initialised = True

    def shutdown(self) -> None:
        self.shut_down = True

    def driver_version(self) -> str:
        self._check("driver_version")
        return self.driver

    def device_count(self) -> int:
        self._check("device_count")
        return len(self.gpus)

    def name(self, index: int) -> str:
        self._check("name")
        return self.gpus[index].name

    def uuid(self, index: int) -> str:
        self._check("uuid")
        return self.gpus[index].uuid

    def memory_total_bytes(self, index: int) -> int:
        self._check("memory_total_bytes")
        return self.gpus[index].memory_bytes

    def compute_capability(self, index: int) -> tuple[int, int]:
        self._check("compute_capability")
        return self.gpus[index].cc

    def mig_mode(self, index: int) -> tuple[int, int]:
        self._check("mig_mode")
        if self.gpus[index].mig is None:
            raise pynvml.NVMLError_NotSupported()
        return self.gpus[index].mig

    def mig_device_uuids(self, index: int) -> list[str]:
        self._check("mig_device_uuids")
        return list(self.gpus[index].mig_devices)

    def fabric_info(self, index: int) -> FabricInfo:
        self._check("fabric_info")
        if self.gpus[index].fabric is None:
            raise pynvml.NVMLError_NotSupported()
        return self.gpus[index].fabric

    def nvlink_active_links(self, index: int) -> int:
        self._check("nvlink_active_links")
        if self.gpus[index].nvlink is None:
            raise pynvml.NVMLError_NotSupported()
        return self.gpus[index].nvlink


# --- builders --------------------------------------------------------------------------------------


def h100(i: int) -> FakeGpu:
    """An HGX H100 80GB GPU: MIG capable but off, 18 NVLinks, no multi-node fabric."""
    return FakeGpu(
        "NVIDIA H100 80GB HBM3",
        f"GPU-h100-{i:04d}",
        81559 * 1024 * 1024,
        (9, 0),
        mig=(0, 0),
        nvlink=18,
        fabric=FabricInfo("00000000-0000-0000-0000-000000000000", 0, pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, 0),
    )


def a100_mig(i: int, devices: int = 7) -> FakeGpu:
    """An A100 80GB GPU with MIG enabled and `devices` 1g.10gb instances."""
    return FakeGpu(
        "NVIDIA A100-SXM4-80GB",
        f"GPU-a100-{i:04d}",
        81920 * 1024 * 1024,
        (8, 0),
        mig=(1, 1),
        mig_devices=[f"MIG-a100-{i:04d}-{d}" for d in range(devices)],
        nvlink=12,
    )


def l40s(i: int) -> FakeGpu:
    """A PCIe L40S: no MIG, no NVLink."""
    return FakeGpu("NVIDIA L40S", f"GPU-l40s-{i:04d}", 46068 * 1024 * 1024, (8, 9))


def gb200(i: int, clique: int = 1) -> FakeGpu:
    """A GB200 GPU (not in the catalog) attached to an NVL72 fabric clique."""
    return FakeGpu(
        "NVIDIA GB200",
        f"GPU-gb200-{i:04d}",
        189471 * 1024 * 1024,
        (10, 0),
        mig=(0, 0),
        nvlink=18,
        fabric=FabricInfo(
            "7b968a6d-c8aa-45e1-9e07-e1e51be99c31", clique, pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS
        ),
    )
