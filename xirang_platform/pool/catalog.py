"""The GPU catalog: known GPU models as data, one canonical name each (DESIGN.md section 3).

The models live in `data/gpu_catalog.yaml` (its header documents the schema). `Catalog.lookup`
turns any accepted spelling (canonical name, alias, NVML name, GFD product label, the openb trace's
codes) into the catalog's `GpuModel`; `Catalog.from_nvml` does the same for what discovery reports
and keeps a model the catalog lacks, flagged `known=False`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator, Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from xirang_platform.pool.model import GpuModel, MigProfile

SCHEMA_VERSION = 1

_ENTRY_FIELDS = {
    "name",
    "aliases",
    "nvml_names",
    "architecture",
    "compute_capability",
    "memory_mib",
    "compute_level",
    "interconnect",
    "mig",
    "source",
    "notes",
    "known",
}
_INTERCONNECTS = ("nvlink", "pcie")
_MIG_RE = re.compile(r"^(?P<name>(?P<slices>[1-7])g\.(?P<gb>\d+)gb(?:\+me)?):(?P<count>[1-7])$")
# GFD appends these to `nvidia.com/gpu.product` under MIG "single" and time-slicing / MPS sharing.
_GFD_SUFFIX_RE = re.compile(r"(-MIG-.*|-SHARED)+$", re.IGNORECASE)


class CatalogError(ValueError):
    """A GPU model name the catalog does not know, or a malformed catalog entry."""

    def __init__(
        self, message: str, suggestions: tuple[str, ...] = (), name: str = "", known: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.suggestions = suggestions
        self.name = name
        self.known = known


def normalize(name: str) -> str:
    """The lookup key of a model name: lower case, without spaces, '-' and '_'."""
    return re.sub(r"[\s_\-]+", "", name).lower()


def architecture_from_cc(major: int, minor: int) -> str:
    """The GPU architecture family for a CUDA compute capability, as GFD names it."""
    if major == 6:
        return "pascal"
    if major == 7:
        return "turing" if minor == 5 else "volta"
    if major == 8:
        return "ada-lovelace" if minor == 9 else "ampere"
    if major == 9:
        return "hopper"
    if major in (10, 12):
        return "blackwell"
    if major == 13:
        return "rubin"
    return "unknown"


def gfd_product_label(nvml_name: str) -> str:
    """The `nvidia.com/gpu.product` label GFD derives from an NVML name (spaces become '-')."""
    cleaned = re.sub(r"[^A-Za-z0-9\-_. ]", "", nvml_name)
    return cleaned.strip().replace(" ", "-")


class Catalog:
    """A set of GPU models with their accepted spellings, in catalog file order."""

    def __init__(
        self, models: Iterable[GpuModel], aliases: Mapping[str, Iterable[str]] | None = None, source: str = ""
    ) -> None:
        self.source = source
        self._models: dict[str, GpuModel] = {}
        self._keys: dict[str, str] = {}
        aliases = aliases or {}
        prefix = f"{source}: " if source else ""
        for model in models:
            if model.name in self._models:
                raise CatalogError(f"{prefix}model {model.name!r} is defined twice; keep one entry")
            self._models[model.name] = model
            for spelling in (model.name, *aliases.get(model.name, ()), *model.nvml_names):
                key = normalize(spelling)
                owner = self._keys.setdefault(key, model.name)
                if owner != model.name:
                    raise CatalogError(
                        f"{prefix}{spelling!r} of model {model.name!r} also names {owner!r}; "
                        "an alias must name one model only"
                    )

    @classmethod
    def from_file(cls, path: str | Path) -> Catalog:
        """Load a catalog from a YAML file in the `gpu_catalog.yaml` schema."""
        path = Path(path)
        return cls.from_text(path.read_text(encoding="utf-8"), str(path))

    @classmethod
    def from_text(cls, text: str, source: str) -> Catalog:
        """Load a catalog from YAML text; `source` names it in error messages."""
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise CatalogError(f"{source}: not valid YAML: {exc}") from exc
        if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
            raise CatalogError(f"{source}: expected a mapping with a `models` list; see gpu_catalog.yaml")
        version = doc.get("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise CatalogError(f"{source}: schema_version {version!r} is not supported; use {SCHEMA_VERSION}")
        models, aliases = [], {}
        for i, entry in enumerate(doc["models"]):
            model, names = parse_model_entry(entry, f"{source}: models[{i}]")
            models.append(model)
            aliases[model.name] = names
        return cls(models, aliases, source)

    def __iter__(self) -> Iterator[GpuModel]:
        return iter(self._models.values())

    def __len__(self) -> int:
        return len(self._models)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.find(name) is not None

    @property
    def names(self) -> tuple[str, ...]:
        """The canonical model names, in catalog order."""
        return tuple(self._models)

    def find(self, name: str) -> GpuModel | None:
        """The model `name` stands for (any accepted spelling), or None."""
        owner = self._keys.get(normalize(name))
        if owner is None:
            stripped = _GFD_SUFFIX_RE.sub("", name.strip())
            owner = self._keys.get(normalize(stripped))
        return self._models[owner] if owner else None

    def lookup(self, name: str) -> GpuModel:
        """The model `name` stands for; CatalogError with "did you mean" suggestions if unknown."""
        model = self.find(name)
        if model is not None:
            return model
        suggestions = self.suggest(name)
        hint = f"did you mean {', '.join(suggestions)}? " if suggestions else ""
        raise CatalogError(
            f"unknown GPU model {name!r}: {hint}known models: {', '.join(self.names)} (or add it to gpu_catalog.yaml)",
            suggestions,
            name,
            self.names,
        )

    def suggest(self, name: str, n: int = 3) -> tuple[str, ...]:
        """Up to `n` canonical names that look like `name`, closest first."""
        close = difflib.get_close_matches(normalize(name), list(self._keys), n=n * 3, cutoff=0.5)
        out: list[str] = []
        for key in close:
            owner = self._keys[key]
            if owner not in out:
                out.append(owner)
        return tuple(out[:n])

    def from_nvml(
        self, name: str, memory_mib: int, compute_capability: tuple[int, int], reported_by: str = "NVML"
    ) -> GpuModel:
        """The catalog model NVML's `name` stands for, or an unknown model built from what NVML said.

        An unknown model is named after its GFD product label, has compute level 0 (unknown: it never
        meets a minimum compute level) and `known=False`.
        """
        model = self.find(name)
        if model is not None:
            return model
        major, minor = compute_capability
        return GpuModel(
            name=gfd_product_label(name) or "unknown-gpu",
            memory_mib=memory_mib,
            compute_level=0,
            architecture=architecture_from_cc(major, minor),
            nvml_names=(name,),
            known=False,
            notes=f"not in the GPU catalog: reported by {reported_by} as {name!r}, compute capability "
            f"{major}.{minor}; add it to gpu_catalog.yaml to give it a compute level",
        )

    def extended(self, models: Iterable[tuple[GpuModel, list[str]]], source: str = "") -> Catalog:
        """A new catalog with extra models (each with its aliases) after this one's."""
        all_models = list(self)
        aliases = {m.name: self._aliases_of(m.name) for m in all_models}
        for model, names in models:
            all_models.append(model)
            aliases[model.name] = names
        return Catalog(all_models, aliases, source)

    def _aliases_of(self, name: str) -> list[str]:
        return [k for k, owner in self._keys.items() if owner == name]


def parse_model_entry(entry: Any, where: str) -> tuple[GpuModel, list[str]]:
    """One catalog entry as a `GpuModel` and its aliases; CatalogError naming `where` if malformed."""
    if not isinstance(entry, Mapping):
        raise CatalogError(f"{where}: expected a mapping with name, memory_mib, compute_level")
    unknown = sorted(set(entry) - _ENTRY_FIELDS)
    if unknown:
        raise CatalogError(f"{where}: unknown field {unknown[0]!r}; allowed: {', '.join(sorted(_ENTRY_FIELDS))}")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise CatalogError(f"{where}: `name` is missing; give the model a canonical name")
    where = f"{where} ({name})"
    for field in ("memory_mib", "compute_level"):
        value = entry.get(field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CatalogError(f"{where}: `{field}` must be a non-negative integer, got {value!r}")
    interconnect = entry.get("interconnect", "pcie")
    if interconnect not in _INTERCONNECTS:
        raise CatalogError(f"{where}: `interconnect` must be one of {', '.join(_INTERCONNECTS)}, got {interconnect!r}")
    lists = {}
    for field in ("aliases", "nvml_names", "mig"):
        value = entry.get(field) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise CatalogError(f"{where}: `{field}` must be a list of strings")
        lists[field] = value
    profiles = []
    for spec in lists["mig"]:
        m = _MIG_RE.match(spec)
        if not m:
            raise CatalogError(
                f"{where}: MIG profile {spec!r} is not '<slices>g.<gb>gb[+me]:<count>', e.g. '1g.10gb:7'"
            )
        profiles.append(MigProfile(m["name"], int(m["slices"]), int(m["gb"]), int(m["count"])))
    model = GpuModel(
        name=name.strip(),
        memory_mib=entry["memory_mib"],
        compute_level=entry["compute_level"],
        architecture=str(entry.get("architecture", "")),
        nvml_names=tuple(lists["nvml_names"]),
        mig_profiles=tuple(profiles),
        interconnect=interconnect,
        known=bool(entry.get("known", True)),
        notes=str(entry.get("notes", "")),
    )
    return model, lists["aliases"]


def model_entry(model: GpuModel) -> dict[str, Any]:
    """A catalog entry (the YAML schema) describing `model`; `parse_model_entry` reads it back."""
    entry: dict[str, Any] = {
        "name": model.name,
        "nvml_names": list(model.nvml_names),
        "architecture": model.architecture,
        "memory_mib": model.memory_mib,
        "compute_level": model.compute_level,
        "interconnect": model.interconnect,
    }
    if model.mig_profiles:
        entry["mig"] = [f"{p.name}:{p.max_instances}" for p in model.mig_profiles]
    if not model.known:
        entry["known"] = False
    if model.notes:
        entry["notes"] = model.notes
    return entry


@lru_cache(maxsize=1)
def default_catalog() -> Catalog:
    """The bundled catalog (`data/gpu_catalog.yaml`), loaded once."""
    text = resources.files("xirang_platform.pool").joinpath("data/gpu_catalog.yaml").read_text(encoding="utf-8")
    return Catalog.from_text(text, "gpu_catalog.yaml")
