"""The checkpoint volume of an elastic training run on Kubernetes (DESIGN.md section 11).

A resize ends the run's pods and starts a resumption at the new size: a gang's Indexed Job is
deleted with its run (`K8sCluster.stop`) and its resumption's Job, of the new size, is created at
its launch; a single-node size is the run-worker pod itself. Every size mounts the same directory of
one shared volume: the operator's PersistentVolumeClaim (`K8sSettings.checkpoint_claim`, ReadWriteMany),
at the sub-path of the work's lineage, which a resumption keeps (its tenant, project and original
submit time, inherited from the ledger's record). The training code finds it in `XIRANG_CHECKPOINT_DIR`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes import client

from xirang_platform.launch.k8s_settings import K8sSettings
from xirang_platform.scheduling.model import Request

CHECKPOINT_VOLUME = "checkpoints"
CHECKPOINT_MOUNT = "/checkpoints"
CHECKPOINT_ENV = "XIRANG_CHECKPOINT_DIR"


@dataclass(frozen=True)
class CheckpointMount:
    """The volume, the container's mount of it and the environment variable naming the mount."""

    volume: client.V1Volume
    mount: client.V1VolumeMount
    env: client.V1EnvVar


def lineage_path(request: Request) -> str:
    """The sub-path of the request's work on the checkpoint volume: the same for every size and every
    resumption of it (`<tenant>/<project>/<original submit time in ms>`)."""
    return f"{request.tenant}/{request.project}/{round(request.submit_time * 1000)}"


def checkpoint_mount(request: Request, settings: K8sSettings) -> CheckpointMount | None:
    """The checkpoint volume an elastic request's pods mount (None for a fixed request)."""
    if request.elastic is None:
        return None
    return CheckpointMount(
        client.V1Volume(
            name=CHECKPOINT_VOLUME,
            persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(claim_name=settings.checkpoint_claim),
        ),
        client.V1VolumeMount(name=CHECKPOINT_VOLUME, mount_path=CHECKPOINT_MOUNT, sub_path=lineage_path(request)),
        client.V1EnvVar(name=CHECKPOINT_ENV, value=CHECKPOINT_MOUNT),
    )
