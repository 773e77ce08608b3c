"""What a cluster operator chooses about how admitted work becomes Kubernetes objects.

`K8sSettings` is plain data with the defaults a cluster running NVIDIA's GPU Operator gets;
`load_settings` reads the operator's file (`deploy/xirang-k8s.yaml` is the shipped example) and
refuses anything malformed with a `K8sSettingsError` naming the field and the fix.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, StringConstraints, ValidationError
from pydantic.types import Strict

from xirang_platform.base.config_model import ConfigModel, Problem, first_problem
from xirang_platform.scheduling.model import Tier
from xirang_platform.scheduling.tiers import TIERS_IN_ORDER


class FractionSharing(StrEnum):
    """How a fraction of one (non-MIG) GPU is handed to a pod."""

    TIME_SLICING = "time-slicing"  # device plugin time-slicing replicas: one shared replica per pod
    HAMI = "hami"  # HAMi: nvidia.com/gpu 1 plus nvidia.com/gpumem (MiB) and nvidia.com/gpucores (%)


class GpuRequest(StrEnum):
    """How a pod asks for its GPUs."""

    DEVICE_PLUGIN = "device-plugin"  # extended resources: nvidia.com/gpu, nvidia.com/mig-<profile>
    DRA = "dra"  # a resource.k8s.io/v1 ResourceClaimTemplate with CEL selectors (Kubernetes >= 1.34)


@dataclass(frozen=True)
class Toleration:
    """A toleration every GPU pod carries (the taints operators put on GPU nodes)."""

    key: str
    operator: str = "Exists"
    value: str | int | float = ""
    effect: str = "NoSchedule"


DEFAULT_PRIORITY_CLASSES: Mapping[Tier, str] = MappingProxyType({tier: f"xirang-{tier.value}" for tier in Tier})


@dataclass(frozen=True)
class K8sSettings:
    """How allocations are rendered: namespace, image, GPU request style, sharing, taints, priorities.

    - `gpu_request`: device-plugin extended resources, or DRA ResourceClaimTemplates.
    - `fraction_sharing`: for a fraction of a non-MIG GPU, time-slicing or HAMi.
    - `time_slicing_resource`: the resource time-slicing advertises (`nvidia.com/gpu.shared` when the
      device plugin runs with `renameByDefault: true`).
    - `priority_classes`: the PriorityClass name per tier (shipped in `deploy/priority-classes.yaml`).
    - `dra_gpu_class` / `dra_mig_class`: the DeviceClasses of NVIDIA's DRA driver.
    - `checkpoint_claim`: the PersistentVolumeClaim (ReadWriteMany) elastic training runs keep their
      checkpoints on, the same at every size (`k8s_elastic.py`).
    - `termination_grace_s`: every run pod's `terminationGracePeriodSeconds` (rounded up): the longest
      preemption grace of the platform config (`notice.PreemptionGrace.longest`), never from this file.
    """

    namespace: str = "xirang"
    image: str = "ghcr.io/xirang/xirang-platform:0.1.0"
    service_account: str = "xirang-workload"
    gpu_request: GpuRequest = GpuRequest.DEVICE_PLUGIN
    fraction_sharing: FractionSharing = FractionSharing.TIME_SLICING
    time_slicing_resource: str = "nvidia.com/gpu"
    gpu_tolerations: tuple[Toleration, ...] = (Toleration("nvidia.com/gpu"),)
    priority_classes: Mapping[Tier, str] = field(default_factory=lambda: DEFAULT_PRIORITY_CLASSES)
    dra_gpu_class: str = "gpu.nvidia.com"
    dra_mig_class: str = "mig.nvidia.com"
    rendezvous_port: int = 29500
    checkpoint_claim: str = "xirang-checkpoints"
    # Not read from the settings file: the platform config's longest preemption grace (the tick sets it).
    termination_grace_s: float = field(default_factory=lambda: max(r.preemption_grace_s for r in TIERS_IN_ORDER))

    def priority_class(self, tier: Tier) -> str:
        """The PriorityClass name of `tier`."""
        return self.priority_classes[tier]


class K8sSettingsError(ValueError):
    """A malformed settings file: names the field, the problem and the fix."""


_FROM_PLATFORM = {"termination_grace_s": "set preemption_grace_s in xirang.yaml (the platform config)"}
Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1), Strict()]


class _TolerationFile(ConfigModel):
    key: Annotated[str, Strict()]
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | int | float = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class _SettingsFile(ConfigModel):
    """The settings file's schema: `K8sSettings`'s fields but the one the platform config sets."""

    namespace: Text = K8sSettings.namespace
    image: Text = K8sSettings.image
    service_account: Text = K8sSettings.service_account
    gpu_request: GpuRequest = K8sSettings.gpu_request
    fraction_sharing: FractionSharing = K8sSettings.fraction_sharing
    time_slicing_resource: Text = K8sSettings.time_slicing_resource
    gpu_tolerations: tuple[_TolerationFile, ...] | None = None
    priority_classes: dict[Tier, Text] = {}
    dra_gpu_class: Text = K8sSettings.dra_gpu_class
    dra_mig_class: Text = K8sSettings.dra_mig_class
    rendezvous_port: Annotated[int, Field(ge=1, le=65535), Strict()] = K8sSettings.rendezvous_port
    checkpoint_claim: Text = K8sSettings.checkpoint_claim

    def settings(self) -> K8sSettings:
        values = self.model_dump(exclude={"gpu_tolerations", "priority_classes"})
        if self.gpu_tolerations is not None:
            tolerations = (t.model_dump() for t in self.gpu_tolerations)
            values["gpu_tolerations"] = tuple(Toleration(**{k: str(v) for k, v in t.items()}) for t in tolerations)
        return K8sSettings(
            **values, priority_classes=MappingProxyType({**DEFAULT_PRIORITY_CLASSES, **self.priority_classes})
        )


def _message(source: str, problem: Problem) -> str:
    """The problem in this file's words: `<file>: <field>: <problem>; <fix>`."""
    where, value = problem.where(), problem.value
    in_tolerations = problem.path[:1] == ("gpu_tolerations",)
    if problem.kind == "extra_forbidden" and in_tolerations:
        return f"{source}: {where}: is not a toleration field; use {problem.known}"
    if problem.kind == "extra_forbidden":
        if problem.key in _FROM_PLATFORM:
            return f"{source}: {where}: is not a setting; {_FROM_PLATFORM[problem.key]}"
        close = difflib.get_close_matches(problem.key, problem.known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"{source}: {where}: is not a setting; {hint}settings are {', '.join(problem.known)}"
    if problem.choices():
        fix = ", ".join(problem.choices())
        if problem.kind == "enum":
            return f"{source}: {where}: {value!r} is not a choice; use one of {fix}"
        return f"{source}: {where}: {value!r} is not valid; use {fix}"
    if in_tolerations and len(problem.path) == 1:
        return f"{source}: {where}: is not a list; list tolerations as mappings with a `key`"
    if in_tolerations:
        where = problem.where(problem.path[:2])
        return f"{source}: {where}: has no `key`; write e.g. `{{key: nvidia.com/gpu, operator: Exists}}`"
    if problem.path[:1] == ("priority_classes",):
        if len(problem.path) == 1:
            return f"{source}: {where}: is not a mapping; write one `<tier>: <PriorityClass name>` per tier"
        return f"{source}: {where}: {value!r} is not a name; give a PriorityClass name"
    if problem.key == "rendezvous_port":
        return f"{source}: {where}: {value!r} is not a port; use a number in 1..65535"
    return f"{source}: {where}: {value!r} is not a non-empty string; write {where} as text"


def settings_from_mapping(doc: Any, source: str = "settings") -> K8sSettings:
    """`K8sSettings` from a parsed mapping (the YAML file's content); K8sSettingsError if malformed."""
    if doc is None:
        return K8sSettings()
    if not isinstance(doc, Mapping):
        raise K8sSettingsError(
            f"{source}: document: is not a mapping; write `key: value` lines, e.g. `namespace: xirang`"
        )
    try:
        return _SettingsFile.model_validate(doc).settings()
    except ValidationError as exc:
        raise K8sSettingsError(_message(source, first_problem(exc, _SettingsFile))) from None


def load_settings(path: str | Path) -> K8sSettings:
    """`K8sSettings` from a YAML file (schema: the fields of `K8sSettings`)."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise K8sSettingsError(f"{path}: file: cannot be read ({exc.strerror}); check the path") from None
    except yaml.YAMLError as exc:
        raise K8sSettingsError(f"{path}: yaml: not valid YAML ({exc}); fix the YAML syntax") from None
    return settings_from_mapping(doc, str(path))


SETTINGS_ENV = "XIRANG_K8S_SETTINGS"


def settings_from_env() -> K8sSettings:
    """The settings file `$XIRANG_K8S_SETTINGS` names (read once per path), else the defaults."""
    path = os.environ.get(SETTINGS_ENV, "").strip()
    return _load_cached(path) if path else K8sSettings()


@lru_cache(maxsize=4)
def _load_cached(path: str) -> K8sSettings:
    return load_settings(path)
