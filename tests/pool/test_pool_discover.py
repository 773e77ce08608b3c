"""Discovery through an in-memory NVML backend: the node, its labels, guards, errors, YAML round trip."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pynvml
import pytest
import yaml

from tests.pool.nvml_fake import FakeGpu, FakeNvml, a100_mig, gb200, h100, l40s
from xirang_platform.cli.pool import discovery_dict
from xirang_platform.pool.discover import (
    NO_DRIVER,
    Discovery,
    DiscoveryError,
    FabricInfo,
    PynvmlBackend,
    discover,
    discover_details,
    host_memory_mib,
    inventory_fragment,
    node_from_labels,
)
from xirang_platform.pool.yaml_inventory import parse_inventory


def found(backend: FakeNvml, **kw) -> Discovery:
    kw = {"hostname": "gpu-node-1", "cpu_count": 96, "memory_mib": 1048576} | kw
    return discover_details(backend, **kw)


def test_h100_server_becomes_one_node_of_eight_catalog_gpus():
    result = found(FakeNvml([h100(i) for i in range(8)]))
    node = result.node
    assert (node.name, node.model_name, node.model.known, node.gpus) == ("gpu-node-1", "H100-SXM", True, 8)
    assert (node.cpu_milli, node.memory_mib) == (96000, 1048576)
    assert node.gpu_uuids == tuple(f"GPU-h100-{i:04d}" for i in range(8))
    assert node.domain == "gpu-node-1"  # no multi-node fabric: the node is its own NVLink island
    assert dict(node.labels) == {
        "nvidia.com/cuda.driver-version.full": "550.107.02",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/mig.capable": "true",
        "xirang/mig.enabled": "false",
        "xirang/nvlink": "true",
    }
    assert [g.memory_mib for g in result.gpus] == [81559] * 8
    assert result.warnings == ()


def test_mig_enabled_a100_lists_its_mig_devices():
    result = found(FakeNvml([a100_mig(0, devices=7), a100_mig(1, devices=3)]))
    assert result.node.model_name == "A100-80"
    assert [(g.mig_capable, g.mig_enabled, len(g.mig_devices)) for g in result.gpus] == [
        (True, True, 7),
        (True, True, 3),
    ]
    assert result.node.labels["xirang/mig.enabled"] == "true"


@pytest.mark.parametrize(
    "missing",
    [
        pytest.param(frozenset({"mig_mode"}), id="driver without nvmlDeviceGetMigMode"),
        pytest.param(frozenset({"fabric_info"}), id="driver without fabric info"),
        pytest.param(frozenset({"nvlink_active_links"}), id="driver without NVLink state"),
        pytest.param(frozenset({"mig_mode", "fabric_info", "nvlink_active_links", "driver_version"}), id="old driver"),
    ],
)
def test_missing_nvml_functions_mean_absent_features_not_failure(missing):
    result = found(FakeNvml([h100(i) for i in range(2)], missing=missing))
    assert (result.node.model_name, result.node.gpus) == ("H100-SXM", 2)
    if "mig_mode" in missing:
        assert [g.mig_capable for g in result.gpus] == [False, False]
    if "nvlink_active_links" in missing:
        assert result.node.labels["xirang/nvlink"] == "false"
    if "driver_version" in missing:
        assert result.driver_version == ""
        assert "nvidia.com/cuda.driver-version.full" not in result.node.labels


def test_pcie_gpu_without_mig_or_nvlink_support():
    result = found(FakeNvml([l40s(i) for i in range(4)]))
    assert result.node.model_name == "L40S"
    assert [(g.mig_capable, g.nvlink_links, g.clique) for g in result.gpus] == [(False, 0, "")] * 4
    assert result.node.labels["nvidia.com/mig.capable"] == "false"


def test_fabric_clique_becomes_the_domain_and_unknown_model_is_kept_flagged():
    result = found(FakeNvml([gb200(i) for i in range(4)]))
    node = result.node
    assert node.domain == "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1"
    assert node.labels["nvidia.com/gpu.clique"] == "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1"
    assert (node.model.name, node.model.known, node.model.memory_mib) == ("NVIDIA-GB200", False, 189471)
    assert (node.model.compute_level, node.model.architecture, node.model.interconnect) == (0, "blackwell", "nvlink")
    assert len(result.warnings) == 1
    assert "not in the GPU catalog" in result.warnings[0]


@pytest.mark.parametrize(
    "fabric",
    [
        pytest.param(
            FabricInfo("7b968a6d-c8aa-45e1-9e07-e1e51be99c31", 1, pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, 0),
            id="registration still in progress",
        ),
        pytest.param(
            FabricInfo("00000000-0000-0000-0000-000000000000", 1, pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 0),
            id="completed with a zero cluster uuid",
        ),
        pytest.param(
            FabricInfo("7b968a6d-c8aa-45e1-9e07-e1e51be99c31", 1, pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, 3),
            id="completed with a failed status",
        ),
    ],
)
def test_fabric_not_attached_leaves_the_node_its_own_domain(fabric):
    gpus = [dataclasses.replace(gb200(i), fabric=fabric) for i in range(2)]
    assert found(FakeNvml(gpus)).node.domain == "gpu-node-1"


def test_gpus_in_different_cliques_leave_the_node_its_own_domain():
    result = found(FakeNvml([gb200(0, clique=1), gb200(1, clique=2)]))
    assert result.node.domain == "gpu-node-1"


def test_machine_without_gpus_is_a_cpu_only_node():
    result = found(FakeNvml([]))
    assert (result.node.model, result.node.gpus, result.node.cpu_milli) == (None, 0, 96000)
    assert result.warnings == ("NVML sees no GPU: this is a CPU-only node",)


def test_mixed_gpu_models_are_refused_with_the_fix():
    with pytest.raises(DiscoveryError, match="several models") as exc:
        found(FakeNvml([h100(0), l40s(1)]))
    assert "one node per model" in str(exc.value)


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(pynvml.NVMLError_LibraryNotFound(), id="no libnvidia-ml.so.1"),
        pytest.param(pynvml.NVMLError_DriverNotLoaded(), id="driver not loaded"),
    ],
)
def test_missing_driver_gives_the_documented_message(error):
    with pytest.raises(DiscoveryError) as exc:
        found(FakeNvml([], init_error=error))
    assert str(exc.value) == NO_DRIVER


def test_real_backend_on_a_machine_without_driver_gives_the_documented_message():
    # This CPU machine has no libnvidia-ml.so.1; on a GPU machine the node is found instead.
    try:
        node = discover(PynvmlBackend())
    except DiscoveryError as exc:
        error = str(exc)
    else:
        assert node.gpus >= 0
        return
    assert error == NO_DRIVER


def test_gpu_lost_while_reading_is_a_discovery_error_and_nvml_is_shut_down():
    backend = FakeNvml([h100(0)], failing={"uuid": pynvml.NVMLError_GpuIsLost()})
    with pytest.raises(DiscoveryError, match="check the driver with nvidia-smi"):
        found(backend)
    assert backend.shut_down


def test_discover_uses_this_hosts_cpu_count_and_meminfo():
    node = discover(FakeNvml([l40s(0)]))
    assert node.cpu_milli > 0
    assert node.memory_mib == host_memory_mib()


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("MemTotal:       131072000 kB\nMemFree: 1 kB\n", 128000, id="kB to MiB"),
        pytest.param("MemFree: 1 kB\n", 0, id="no MemTotal line"),
        pytest.param("MemTotal: lots kB\n", 0, id="garbled"),
    ],
)
def test_host_memory_from_meminfo(tmp_path, text, want):
    path = tmp_path / "meminfo"
    path.write_text(text)
    assert host_memory_mib(path) == want


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param(FakeNvml([h100(i) for i in range(8)]), id="H100 x8"),
        pytest.param(FakeNvml([a100_mig(i) for i in range(2)]), id="MIG A100"),
        pytest.param(FakeNvml([gb200(i) for i in range(4)]), id="unknown GB200 in a clique"),
        pytest.param(FakeNvml([]), id="CPU only"),
    ],
)
def test_yaml_fragment_reads_back_as_the_same_node(backend):
    result = found(backend, unit_milli=250)
    text = yaml.safe_dump(inventory_fragment(result), sort_keys=False)
    pool = parse_inventory(text, "discovered.yaml")
    assert pool.nodes == (result.node,)


def test_unit_milli_is_applied_to_the_discovered_node():
    assert found(FakeNvml([l40s(0)]), unit_milli=125).node.unit_milli == 125


def gfd(
    product: str = "NVIDIA-H100-80GB-HBM3",
    count: str = "8",
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """GFD labels of an 8-GPU H100 node, with `extra` labels added or replaced."""
    labels = {
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": count,
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "kubernetes.io/os": "linux",
    }
    return labels | (extra or {})


@pytest.mark.parametrize(
    ("labels", "model", "gpus", "domain"),
    [
        pytest.param(gfd(), "H100-SXM", 8, "k8s-node", id="H100 from its product label"),
        pytest.param(gfd("NVIDIA-L40S-SHARED", "4"), "L40S", 4, "k8s-node", id="time-sliced product suffix"),
        pytest.param(gfd(extra={"nvidia.com/gpu.clique": "uuid.3"}), "H100-SXM", 8, "uuid.3", id="NVLink clique"),
        pytest.param(
            gfd(extra={"accelerator.topograph.run/domain": "nvl-7"}),
            "H100-SXM",
            8,
            "nvl-7",
            id="Topograph accelerator domain",
        ),
        pytest.param({"kubernetes.io/os": "linux"}, "", 0, "k8s-node", id="no GPU labels: CPU-only"),
    ],
)
def test_node_from_gfd_labels(labels, model, gpus, domain):
    node = node_from_labels("k8s-node", labels, cpu_milli=64000, memory_mib=262144)
    assert (node.model_name, node.gpus, node.domain, node.cpu_milli) == (model, gpus, domain, 64000)
    assert all(key.startswith("nvidia.com/") for key in node.labels)


def test_node_from_labels_keeps_an_unknown_product_flagged():
    node = node_from_labels("n", gfd("NVIDIA-B200", extra={"nvidia.com/gpu.compute.major": "10"}), 1000, 1024)
    assert (node.model.name, node.model.known, node.model.architecture) == ("NVIDIA-B200", False, "blackwell")
    assert "reported by label nvidia.com/gpu.product" in node.model.notes


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        pytest.param(gfd("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"), "MIG 'single' strategy", id="MIG single"),
        pytest.param(gfd(count="eight"), "nvidia.com/gpu.count='eight' is not an integer", id="bad count"),
        pytest.param(gfd(count="0"), "nvidia.com/gpu.count is 0", id="zero count"),
    ],
)
def test_node_from_bad_labels_is_a_clear_error(labels, message):
    with pytest.raises(DiscoveryError) as exc:
        node_from_labels("n", labels, 1000, 1024)
    assert message in str(exc.value)
    assert str(exc.value).startswith("node n: ")


REAL_READINGS = Path(__file__).parent / "fixtures" / "real"


def h200_as_read_on_a_real_machine() -> FakeGpu:
    """The NVML answers of the H200 in `fixtures/real/` (nvidia-smi -q: MIG off, fabric N/A, no NVLink peers)."""
    return FakeGpu(
        "NVIDIA H200", "GPU-1221d9aa-2a93-7fd9-7a98-937fed9963d3", 143771 * 1024 * 1024, (9, 0), (0, 0), nvlink=0
    )


def test_real_h200_discovery_is_reproduced_from_its_nvml_answers():
    recorded = json.loads((REAL_READINGS / "h200_discover.json").read_text())
    backend = FakeNvml([h200_as_read_on_a_real_machine()], driver="580.159.04")
    result = found(backend, hostname="vm", cpu_count=16, memory_mib=128887)
    assert discovery_dict(result) == recorded


def test_real_h200_discovery_agrees_with_nvidia_smi_on_the_same_machine():
    recorded = json.loads((REAL_READINGS / "h200_discover.json").read_text())
    with (REAL_READINGS / "h200_nvidia_smi.csv").open() as f:
        (smi,) = list(csv.DictReader(f, skipinitialspace=True))
    gpu = recorded["gpus"][0]
    assert (gpu["name"], gpu["uuid"], recorded["driver_version"]) == (smi["name"], smi["uuid"], smi["driver_version"])
    assert f"{gpu['memory_mib']} MiB" == smi["memory.total [MiB]"]
    assert gpu["mig_enabled"] is (smi["mig.mode.current"] == "Enabled")
    assert (recorded["node"]["model"], recorded["node"]["model_known"]) == ("H200", True)
