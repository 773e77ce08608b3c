"""How the GPUs an allocation holds on one node are asked of Kubernetes.

Whole GPUs are `nvidia.com/gpu` (or a DRA claim for `count` GPUs). A fraction of a GPU on a node
whose GPUs run MIG becomes the smallest MIG profile that gives what was asked within what was
reserved (`nvidia.com/mig-1g.10gb`, or a DRA claim on the MIG DeviceClass); elsewhere it goes
through the operator's sharing mechanism (time-slicing replicas, or HAMi's memory and core limits).
Facts: notes/gpu.md sections 2 and 3.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kubernetes import client

from xirang_platform.launch.k8s_settings import FractionSharing, GpuRequest, K8sSettings
from xirang_platform.pool.labels import MIG_STRATEGY, PRODUCT, single_strategy_profile
from xirang_platform.pool.model import MILLI_PER_GPU, GpuModel, MigProfile, Node
from xirang_platform.scheduling.model import GpuSlice, Request

MIG_CAPABLE_LABEL = "nvidia.com/mig.capable"
HAMI_MEMORY = "nvidia.com/gpumem"
HAMI_CORES = "nvidia.com/gpucores"
HAMI_UUID_ANNOTATION = "nvidia.com/use-gpuuuid"
GPU_RESOURCE = "nvidia.com/gpu"
CLAIM_NAME = "gpus"


class LaunchError(ValueError):
    """An allocation that cannot be expressed as Kubernetes objects; the message names the fix."""


@dataclass(frozen=True)
class MigLayout:
    """How a node's GPUs are partitioned: the GFD MIG strategy and the profiles its GPUs offer."""

    strategy: str  # "single" or "mixed"
    profiles: tuple[MigProfile, ...]


def mig_resource_name(profile: MigProfile) -> str:
    """The device plugin's resource for a MIG profile under the mixed strategy (`+` becomes `.`)."""
    return f"nvidia.com/mig-{profile.name.replace('+', '.')}"


def mig_layout(node: Node) -> MigLayout | None:
    """The node's MIG layout from its GFD labels, or None when its GPUs do not run MIG.

    A node runs MIG when `nvidia.com/mig.strategy` is `single` or `mixed` and its model has MIG
    profiles. Under `mixed` the profiles offered are those with a positive
    `nvidia.com/mig-<profile>.count` label (GFD writes none while MIG mode is off: then the node
    does not run MIG); under `single`, the one profile the `nvidia.com/gpu.product` label names.
    """
    strategy = node.labels.get(MIG_STRATEGY, "none")
    if strategy not in ("single", "mixed") or node.model is None or not node.model.mig_profiles:
        return None
    if node.labels.get(MIG_CAPABLE_LABEL, "true") == "false":
        return None
    if strategy == "single":
        # Under "single" every MIG device of the node is one profile, named in the product label.
        named = single_strategy_profile(node.labels.get(PRODUCT, ""))
        return MigLayout(strategy, tuple(p for p in node.model.mig_profiles if p.name == named))

    def offered(profile: MigProfile) -> bool:
        count = node.labels.get(f"{mig_resource_name(profile)}.count", "")
        return count.isdigit() and int(count) > 0

    counted = tuple(p for p in node.model.mig_profiles if offered(p))
    return MigLayout(strategy, counted) if counted else None


def matching_mig_profile(layout: MigLayout, request: Request, reserved_milli: int) -> MigProfile | None:
    """The smallest offered profile that gives `request` its compute and GPU memory and fits the reservation."""
    fitting = [
        p
        for p in layout.profiles
        if p.compute_slices * MILLI_PER_GPU >= 7 * request.milli_per_gpu
        and p.milli <= reserved_milli
        and p.memory_gb * 1024 >= request.gpu_memory_mib
    ]
    if not fitting:
        return None
    return min(fitting, key=lambda p: (p.compute_slices, p.memory_gb, p.name))


@dataclass(frozen=True)
class NodeGpus:
    """What a pod on one node asks for its GPUs.

    `limits`: extended resources (device-plugin mode). `claim`: the DRA device request (DRA mode).
    `annotations`: pod annotations the sharing mechanism reads. `describe`: a short human summary.
    """

    limits: Mapping[str, str] = field(default_factory=dict)
    claim: client.V1DeviceRequest | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)
    describe: str = ""


def _cel_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


DRA_DOMAIN = "gpu.nvidia.com"  # NVIDIA's DRA driver qualifies its attributes and capacities with its name


def _dra_selectors(model: GpuModel, node: Node, gpus: Sequence[int], memory_mib: int, uuid_attribute: str) -> list[str]:
    """CEL expressions pinning a DRA request to the model, enough memory and (when known) the GPUs."""
    exprs = []
    if model.nvml_names:
        names = ", ".join(_cel_quote(n) for n in model.nvml_names)
        exprs.append(f"device.attributes['{DRA_DOMAIN}'].productName in [{names}]")
    if memory_mib:
        exprs.append(f"device.capacity['{DRA_DOMAIN}'].memory.compareTo(quantity('{memory_mib}Mi')) >= 0")
    uuids = [node.gpu_uuids[g] for g in gpus if g < len(node.gpu_uuids)]
    if uuids and len(uuids) == len(gpus):
        exprs.append(
            f"device.attributes['{DRA_DOMAIN}'].{uuid_attribute} in [{', '.join(_cel_quote(u) for u in uuids)}]"
        )
    return exprs


def _device_request(device_class: str, count: int, selectors: list[str]) -> client.V1DeviceRequest:
    return client.V1DeviceRequest(
        name=CLAIM_NAME,
        exactly=client.V1ExactDeviceRequest(
            device_class_name=device_class,
            allocation_mode="ExactCount",
            count=count,
            selectors=[client.V1DeviceSelector(cel=client.V1CELDeviceSelector(expression=e)) for e in selectors]
            or None,
        ),
    )


def node_gpus(request: Request, node: Node, slices: Sequence[GpuSlice], settings: K8sSettings) -> NodeGpus:
    """How a pod holding `slices` (all on `node`) asks for them under `settings`; LaunchError if it cannot."""
    if not slices:
        return NodeGpus(describe="no GPU")
    model = node.model
    if model is None:
        raise LaunchError(
            f"allocation {request.id}: node {node.name} has no GPUs but holds GPU slices; re-read the pool"
        )
    gpus = [s.gpu for s in slices]
    dra = settings.gpu_request is GpuRequest.DRA
    # The GPU memory the run needs per GPU: what the slice holds, else what the request asked.
    memory_mib = max([s.gpu_memory_mib for s in slices] + [request.gpu_memory_mib])
    if all(s.milli == MILLI_PER_GPU for s in slices) and request.whole_gpus:
        n = len(slices)
        if dra:
            selectors = _dra_selectors(model, node, gpus, memory_mib, "uuid")
            return NodeGpus(claim=_device_request(settings.dra_gpu_class, n, selectors), describe=f"{n} x {model.name}")
        return NodeGpus(limits={GPU_RESOURCE: str(n)}, describe=f"{n} x {model.name}")
    if len(slices) != 1:
        raise LaunchError(
            f"allocation {request.id}: {len(slices)} partial GPUs on {node.name}; a fraction is asked on one GPU only"
        )
    (piece,) = slices
    layout = mig_layout(node)
    if layout is not None:
        profile = matching_mig_profile(layout, request, piece.milli)
        if profile is None:
            offered = ", ".join(p.name for p in layout.profiles) or "none"
            raise LaunchError(
                f"allocation {request.id}: {request.milli_per_gpu} milli-GPU with {request.gpu_memory_mib} MiB on "
                f"MIG node {node.name} matches no MIG profile it offers ({offered}); ask for a profile's size "
                f"(compute slices/7 of a GPU and its memory), or take the node out of MIG mode"
            )
        describe = f"MIG {profile.name} of {model.name} GPU {piece.gpu}"
        if dra:
            selectors = [f"device.attributes['{DRA_DOMAIN}'].profile == {_cel_quote(profile.name)}"]
            selectors += _dra_selectors(model, node, gpus, 0, "parentUUID")
            return NodeGpus(claim=_device_request(settings.dra_mig_class, 1, selectors), describe=describe)
        resource = mig_resource_name(profile) if layout.strategy == "mixed" else GPU_RESOURCE
        return NodeGpus(limits={resource: "1"}, describe=describe)
    if dra:
        raise LaunchError(
            f"allocation {request.id}: a fraction ({piece.milli} milli) of a non-MIG {model.name} GPU on {node.name} "
            "cannot be claimed through DRA (a claimed device is exclusive); set gpu_request: device-plugin with "
            "time-slicing or HAMi, or enable MIG on the node"
        )
    describe = f"{piece.milli}/1000 of {model.name} GPU {piece.gpu}"
    if settings.fraction_sharing is FractionSharing.HAMI:
        share_mib = memory_mib or model.memory_mib * piece.milli // MILLI_PER_GPU
        cores = -(-piece.milli // 10)  # HAMi counts cores in percent of the GPU
        annotations = {HAMI_UUID_ANNOTATION: node.gpu_uuids[piece.gpu]} if piece.gpu < len(node.gpu_uuids) else {}
        limits = {GPU_RESOURCE: "1", HAMI_MEMORY: str(share_mib), HAMI_CORES: str(cores)}
        return NodeGpus(limits=limits, annotations=annotations, describe=describe)
    return NodeGpus(limits={settings.time_slicing_resource: "1"}, describe=describe + " (time-sliced)")
