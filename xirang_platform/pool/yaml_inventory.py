"""A pool from a YAML inventory (DESIGN.md section 3).

YAML inventory (schema_version 1; the bundled `data/default_pool.yaml` is an example)::

    schema_version: 1
    name: my-pool                 # optional, shown by `xirang pool show`
    unit_milli:                   # the pool's standard GPU slice per model; 1000 (whole GPUs) if absent
      L40S: 125
    models: []                    # optional extra GPU models, in the gpu_catalog.yaml entry schema
    nodes:
      - name: h100-{index:02d}    # with count > 1 the name must contain {index} (a format field)
        count: 8                  # optional, default 1; index runs from `start` (default 0)
        start: 0
        model: H100-SXM           # catalog name or alias; omit (with gpus 0) for a CPU-only node
        gpus: 8
        cpu: 192                  # cores (a number) or milli-cores as a string "96000m"
        memory: 2Ti               # MiB (an integer) or a quantity with Mi, Gi or Ti
        domain: h100-a            # optional; a node is its own domain if absent
        labels: {zone: a}         # optional, string values
        gpu_uuids: [...]          # optional, only for a single node (count 1)

Any malformed input raises `InventoryError` naming the file, the line, the field and the fix, and
nothing is returned.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BeforeValidator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    StringConstraints,
    ValidationError,
)
from pydantic.types import Strict

from xirang_platform.base.config_model import ConfigModel, Problem, first_problem
from xirang_platform.pool.catalog import Catalog, CatalogError, default_catalog, parse_model_entry
from xirang_platform.pool.inventory_error import InventoryError, check_unit_milli, read_text, unknown_model
from xirang_platform.pool.model import MILLI_PER_GPU, GpuModel, Node, Pool

SCHEMA_VERSION = 1
_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(Mi|Gi|Ti|MiB|GiB|TiB)?\s*$")
_MEMORY_FACTOR = {None: 1, "Mi": 1, "MiB": 1, "Gi": 1024, "GiB": 1024, "Ti": 1024**2, "TiB": 1024**2}


class _Mapping(dict):
    """A YAML mapping that remembers its line and the line of each key (1-based)."""

    line: int = 0
    key_lines: dict[Any, int]

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.line)


class _Sequence(list):
    """A YAML sequence that remembers the line of each item (1-based)."""

    lines: list[int]


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


class _Loader(yaml.SafeLoader):
    """A safe loader whose mappings carry line numbers and that refuses duplicate keys."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> _Mapping:
    key_lines: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if isinstance(key, (str, int)) and key in key_lines:
            raise _DuplicateKey(key, line, key_lines[key])
        if isinstance(key, (str, int)):
            key_lines[key] = line
    mapping = _Mapping(loader.construct_mapping(node, deep=True))
    mapping.line = node.start_mark.line + 1
    mapping.key_lines = key_lines
    return mapping


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> _Sequence:
    items = _Sequence(loader.construct_sequence(node, deep=True))
    items.lines = [item.start_mark.line + 1 for item in node.value]
    return items


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def _did_you_mean(word: str, options: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(str(word), options, n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def parse_cpu(value: Any) -> int:
    """Milli-cores from a core count (number or numeric string) or a "<n>m" string; ValueError if not."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, str) and value.strip().endswith("m"):
        milli = int(value.strip()[:-1])
    else:
        cores = float(value)
        milli = round(cores * 1000)
        if abs(cores * 1000 - milli) > 1e-6:
            raise ValueError(value)
    if milli < 0:
        raise ValueError(value)
    return milli


def parse_memory(value: Any) -> int:
    """MiB from an integer (MiB) or a quantity string with Mi, Gi or Ti; ValueError if not exact."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        if value < 0:
            raise ValueError(value)
        return value
    m = _MEMORY_RE.match(str(value))
    if not m:
        raise ValueError(value)
    mib = float(m[1]) * _MEMORY_FACTOR[m[2]]
    if mib != int(mib):
        raise ValueError(value)
    return int(mib)


def _read_unit_milli(doc: _Mapping, catalog: Catalog, path: str) -> dict[str, int]:
    raw = doc.get("unit_milli")
    if raw is None:
        return {}
    out: dict[str, int] = {}
    for key, value in raw.items():
        line = raw.line_of(key)
        try:
            model = catalog.lookup(str(key))
        except CatalogError as exc:
            raise unknown_model(path, line, f"unit_milli.{key}", exc) from None
        out[model.name] = check_unit_milli(value, path, line, f"unit_milli.{key}")
    return out


def _label_value(value: Any) -> str:
    # YAML reads `true` as a bool; Kubernetes label values are the strings "true" / "false".
    return str(value).lower() if isinstance(value, bool) else str(value)


NonNegative = Annotated[int, Strict(), Field(ge=0)]
Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
PlainValue = StrictStr | StrictInt | StrictFloat | StrictBool


class _NodeEntry(ConfigModel):
    """One node (group) entry; what depends on the catalog or on other fields is checked in `_expand_group`."""

    name: Any = None
    count: NonNegative = 1
    start: NonNegative = 0
    model: Any = None
    gpus: NonNegative | None = None
    cpu: Annotated[int, BeforeValidator(parse_cpu)]
    memory: Annotated[int, BeforeValidator(parse_memory)]
    domain: Name | StrictInt | None = None
    labels: dict[Any, PlainValue] | None = None
    gpu_uuids: list[StrictStr] | None = None


class _InventoryFile(ConfigModel):
    schema_version: Literal[1] = 1
    name: Any = None
    unit_milli: dict[Any, Any] | None = None
    models: list[Any] | None = None
    nodes: Annotated[list[_NodeEntry], Field(min_length=1)]


# field -> (problem, fix) when the model refuses its value; `{value}`: the value, `{gpus}`: the entry's GPUs.
_WHOLE = ("{value!r} is not an integer", "write {key} as a whole number")
_REFUSED = {
    "count": _WHOLE,
    "start": _WHOLE,
    "gpus": _WHOLE,
    "cpu": ("{value!r} is not a CPU amount", 'write cores as a number (e.g. 96) or milli-cores as "96000m"'),
    "memory": ("{value!r} is not a memory amount", "write MiB as an integer (e.g. 262144) or a quantity like 256Gi"),
    "domain": ("{value!r} is not a name", "write the domain as a name, or drop it (a node is then its own domain)"),
    "labels": ("is not a mapping of plain values", "write labels as `key: value` lines"),
    "gpu_uuids": ("expected {gpus} strings", "list one UUID per GPU, or drop gpu_uuids"),
    "schema_version": ("{value!r} is not supported", f"write schema_version: {SCHEMA_VERSION}"),
    "unit_milli": ("is not a mapping", "write one `MODEL: milli` line per model, e.g. `L40S: 125`"),
    "models": ("is not a list", "list extra models in the gpu_catalog.yaml entry schema"),
    "nodes": ("no nodes are listed", "add a `nodes:` list with at least one node"),
}
_NOT_A_NODE = ("is not a mapping", "write each node (group) as a mapping with name, model, gpus, cpu, memory")


def _refused(doc: _Mapping, problem: Problem, source: str) -> InventoryError:
    """The model's first problem as an `InventoryError` at the line of the key it is about."""
    steps = problem.path
    in_node = steps[:1] == ("nodes",) and len(steps) >= 2 and isinstance(steps[1], int)
    field_at = 2 if in_node else 0
    mapping: Any = doc["nodes"][steps[1]] if in_node else doc
    if in_node and len(steps) == 2:
        return InventoryError(source, doc["nodes"].lines[steps[1]], f"nodes[{steps[1]}]", *_NOT_A_NODE)
    key = str(steps[field_at])
    line = mapping.line_of(key) if key in mapping else mapping.line
    if problem.kind == "extra_forbidden":
        what = f"nodes[{steps[1]}]" if in_node else "the inventory"
        fix = f"{_did_you_mean(key, problem.known)}allowed fields: {', '.join(problem.known)}"
        return InventoryError(source, line, key, f"unknown field in {what}", fix)
    if problem.kind == "missing" and key != "nodes":
        return InventoryError(source, line, key, "is missing", f"add `{key}:` to the node entry")
    if problem.kind == "greater_than_equal":
        return InventoryError(source, line, key, f"{problem.value} is negative", f"write {key} as 0 or more")
    value = mapping.get(key)
    problem_text, fix = _REFUSED[key]
    gpus = mapping.get("gpus")
    return InventoryError(source, line, key, problem_text.format(value=value, gpus=gpus), fix.format(key=key))


def _expand_group(
    entry: _NodeEntry, raw: _Mapping, index: int, catalog: Catalog, unit_milli: dict[str, int], path: str
) -> list[tuple[Node, int]]:
    pattern, count = entry.name, entry.count
    if not isinstance(pattern, str) or not pattern.strip():
        raise InventoryError(
            path,
            raw.line,
            "name",
            "the node name is missing",
            "give the node (group) a `name`, with {index} when count > 1",
        )
    if count < 1:
        raise InventoryError(path, raw.line_of("count"), "count", "is 0", "set count to 1 or more, or drop the entry")
    if count > 1 and "{index" not in pattern:
        raise InventoryError(
            path,
            raw.line_of("name"),
            "name",
            f"{pattern!r} has no {{index}} but count is {count}",
            "put {index} (or e.g. {index:02d}) in the name so every node gets its own",
        )
    model: GpuModel | None = None
    if entry.model not in (None, ""):
        try:
            model = catalog.lookup(str(entry.model))
        except CatalogError as exc:
            extra = ", or describe the model under `models`"
            raise unknown_model(path, raw.line_of("model"), "model", exc, extra) from None
    if model is not None and entry.gpus is None:
        raise InventoryError(path, raw.line, "gpus", "is missing", "add `gpus:` to the node entry")
    gpus = entry.gpus or 0
    if model is None and gpus > 0:
        raise InventoryError(
            path,
            raw.line_of("gpus"),
            "model",
            f"{gpus} GPUs but no model",
            "name the GPU model, or set gpus to 0 for a CPU-only node",
        )
    if model is not None and gpus == 0:
        raise InventoryError(
            path,
            raw.line_of("gpus"),
            "gpus",
            f"0 GPUs but model {model.name!r}",
            "set gpus to the node's GPU count, or drop model for a CPU-only node",
        )
    uuids = entry.gpu_uuids or []
    if uuids and len(uuids) != gpus:
        raise InventoryError(
            path,
            raw.line_of("gpu_uuids"),
            "gpu_uuids",
            f"expected {gpus} strings",
            "list one UUID per GPU, or drop gpu_uuids",
        )
    if uuids and count > 1:
        raise InventoryError(
            path,
            raw.line_of("gpu_uuids"),
            "gpu_uuids",
            "is set on a group of nodes",
            "give gpu_uuids only on a single node (count 1)",
        )
    labels = entry.labels or {}
    node_labels = {str(k): _label_value(v) for k, v in sorted(labels.items(), key=lambda kv: str(kv[0]))}
    out = []
    for i in range(entry.start, entry.start + count):
        try:
            name = pattern.format(index=i)
        except (KeyError, IndexError, ValueError) as exc:
            raise InventoryError(
                path,
                raw.line_of("name"),
                "name",
                f"{pattern!r} is not a valid pattern ({exc})",
                "use {index} or {index:02d} as the only placeholder",
            ) from None
        node = Node(
            name=name,
            model=model,
            gpus=gpus,
            cpu_milli=entry.cpu,
            memory_mib=entry.memory,
            domain=str(entry.domain) if entry.domain is not None else name,
            unit_milli=unit_milli.get(model.name, MILLI_PER_GPU) if model else MILLI_PER_GPU,
            labels=MappingProxyType(node_labels),
            gpu_uuids=tuple(uuids),
        )
        out.append((node, raw.line_of("name")))
    return out


def parse_inventory(text: str, source: str, catalog: Catalog | None = None) -> Pool:
    """A pool from YAML inventory text; `source` names it in errors (see the module docstring)."""
    catalog = catalog or default_catalog()
    try:
        doc = yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader subclass
    except _DuplicateKey as dup:
        raise InventoryError(
            source, dup.line, str(dup.key), f"is given twice (first on line {dup.first})", "keep one of them"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InventoryError(
            source, mark.line + 1 if mark else None, "yaml", f"not valid YAML ({exc})", "fix the YAML syntax"
        ) from None
    if not isinstance(doc, _Mapping):
        raise InventoryError(
            source, 1, "document", "is not a mapping", "start the file with `schema_version: 1` and a `nodes:` list"
        )
    try:
        inventory = _InventoryFile.model_validate(doc)
    except ValidationError as exc:
        raise _refused(doc, first_problem(exc, _InventoryFile), source) from None
    for i, entry in enumerate(inventory.models or []):
        try:
            catalog = catalog.extended([parse_model_entry(entry, "entry")])
        except CatalogError as exc:
            raise InventoryError(
                source,
                doc["models"].lines[i],
                f"models[{i}]",
                str(exc),
                "fix the model entry (schema in gpu_catalog.yaml)",
            ) from None
    unit_milli = _read_unit_milli(doc, catalog, source)
    nodes: list[Node] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(inventory.nodes):
        for node, line in _expand_group(entry, doc["nodes"][i], i, catalog, unit_milli, source):
            if node.name in seen:
                raise InventoryError(
                    source,
                    line,
                    "name",
                    f"node {node.name!r} is already named on line {seen[node.name]}",
                    "give each node a unique name",
                )
            seen[node.name] = line
            nodes.append(node)
    return Pool(tuple(nodes), source=source)


def read_inventory(path: str | Path, catalog: Catalog | None = None) -> Pool:
    """A pool from a YAML inventory file (schema in the module docstring)."""
    path = Path(path)
    return parse_inventory(read_text(path), str(path), catalog)
