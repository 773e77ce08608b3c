"""What a cluster operator chooses about how admitted work becomes Kubernetes objects.

`K8sSettings` is plain data with the defaults a cluster running NVIDIA's GPU Operator gets;
`load_settings` reads the operator's file (`deploy/xirang-k8s.yaml` is the shipped example) and
refuses anything malformed with a `K8sSettingsError` naming the field and the fix.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

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
    value: str = ""
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
    # Not read from the settings file: the platform config's longest preemption grace (the tick sets it).
    termination_grace_s: float = field(default_factory=lambda: max(r.preemption_grace_s for r in TIERS_IN_ORDER))

    def priority_class(self, tier: Tier) -> str:
        """The PriorityClass name of `tier`."""
        return self.priority_classes[tier]


class K8sSettingsError(ValueError):
    """A malformed settings file: names the field, the problem and the fix."""


_FROM_PLATFORM = {"termination_grace_s": "set preemption_grace_s in xirang.yaml (the platform config)"}
_FIELDS = tuple(f.name for f in fields(K8sSettings) if f.name not in _FROM_PLATFORM)
_TOLERATION_FIELDS = tuple(f.name for f in fields(Toleration))


def _fail(source: str, key: str, problem: str, fix: str) -> K8sSettingsError:
    return K8sSettingsError(f"{source}: {key}: {problem}; {fix}")


def _enum(value: Any, kind: type[StrEnum], source: str, key: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        raise _fail(source, key, f"{value!r} is not a choice", f"use one of {choices}") from None


def _tolerations(value: Any, source: str) -> tuple[Toleration, ...]:
    if not isinstance(value, list):
        raise _fail(source, "gpu_tolerations", "is not a list", "list tolerations as mappings with a `key`")
    out = []
    for i, item in enumerate(value):
        where = f"gpu_tolerations[{i}]"
        if not isinstance(item, Mapping) or not isinstance(item.get("key"), str):
            raise _fail(source, where, "has no `key`", "write e.g. `{key: nvidia.com/gpu, operator: Exists}`")
        unknown = sorted(set(item) - set(_TOLERATION_FIELDS))
        if unknown:
            raise _fail(source, f"{where}.{unknown[0]}", "is not a toleration field", f"use {_TOLERATION_FIELDS}")
        if item.get("operator", "Exists") not in ("Exists", "Equal"):
            raise _fail(source, f"{where}.operator", f"{item['operator']!r} is not valid", "use Exists or Equal")
        if item.get("effect", "NoSchedule") not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise _fail(
                source,
                f"{where}.effect",
                f"{item['effect']!r} is not valid",
                "use NoSchedule, PreferNoSchedule, NoExecute",
            )
        out.append(Toleration(**{k: str(v) for k, v in item.items()}))
    return tuple(out)


def _priority_classes(value: Any, source: str) -> Mapping[Tier, str]:
    if not isinstance(value, Mapping):
        raise _fail(source, "priority_classes", "is not a mapping", "write one `<tier>: <PriorityClass name>` per tier")
    out = dict(DEFAULT_PRIORITY_CLASSES)
    for key, name in value.items():
        tier = _enum(key, Tier, source, f"priority_classes.{key}")
        if not isinstance(name, str) or not name:
            raise _fail(source, f"priority_classes.{key}", f"{name!r} is not a name", "give a PriorityClass name")
        out[tier] = name
    return MappingProxyType(out)


def settings_from_mapping(doc: Any, source: str = "settings") -> K8sSettings:
    """`K8sSettings` from a parsed mapping (the YAML file's content); K8sSettingsError if malformed."""
    if doc is None:
        return K8sSettings()
    if not isinstance(doc, Mapping):
        raise _fail(source, "document", "is not a mapping", "write `key: value` lines, e.g. `namespace: xirang`")
    values: dict[str, Any] = {}
    for key, value in doc.items():
        if key in _FROM_PLATFORM:
            raise _fail(source, str(key), "is not a setting", _FROM_PLATFORM[str(key)])
        if key not in _FIELDS:
            close = difflib.get_close_matches(str(key), _FIELDS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise _fail(source, str(key), "is not a setting", f"{hint}settings are {', '.join(_FIELDS)}")
        if key == "gpu_request":
            values[key] = _enum(value, GpuRequest, source, key)
        elif key == "fraction_sharing":
            values[key] = _enum(value, FractionSharing, source, key)
        elif key == "gpu_tolerations":
            values[key] = _tolerations(value, source)
        elif key == "priority_classes":
            values[key] = _priority_classes(value, source)
        elif key == "rendezvous_port":
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
                raise _fail(source, key, f"{value!r} is not a port", "use a number in 1..65535")
            values[key] = value
        else:
            if not isinstance(value, str) or not value.strip():
                raise _fail(source, key, f"{value!r} is not a non-empty string", f"write {key} as text")
            values[key] = value.strip()
    return K8sSettings(**values)


def load_settings(path: str | Path) -> K8sSettings:
    """`K8sSettings` from a YAML file (schema: the fields of `K8sSettings`)."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _fail(str(path), "file", f"cannot be read ({exc.strerror})", "check the path") from None
    except yaml.YAMLError as exc:
        raise _fail(str(path), "yaml", f"not valid YAML ({exc})", "fix the YAML syntax") from None
    return settings_from_mapping(doc, str(path))


SETTINGS_ENV = "XIRANG_K8S_SETTINGS"


def settings_from_env() -> K8sSettings:
    """The settings file `$XIRANG_K8S_SETTINGS` names (read once per path), else the defaults."""
    path = os.environ.get(SETTINGS_ENV, "").strip()
    return _load_cached(path) if path else K8sSettings()


@lru_cache(maxsize=4)
def _load_cached(path: str) -> K8sSettings:
    return load_settings(path)
