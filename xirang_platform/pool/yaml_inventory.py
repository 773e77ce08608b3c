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
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from xirang_platform.pool.catalog import Catalog, CatalogError, default_catalog, parse_model_entry
from xirang_platform.pool.inventory_error import InventoryError, check_unit_milli, read_text, unknown_model
from xirang_platform.pool.model import MILLI_PER_GPU, GpuModel, Node, Pool

SCHEMA_VERSION = 1
_TOP_FIELDS = ("schema_version", "name", "unit_milli", "models", "nodes")
_NODE_FIELDS = ("name", "count", "start", "model", "gpus", "cpu", "memory", "domain", "labels", "gpu_uuids")
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


def _check_fields(mapping: _Mapping, allowed: tuple[str, ...], path: str, what: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise InventoryError(
                path,
                mapping.line_of(key),
                str(key),
                f"unknown field in {what}",
                f"{_did_you_mean(key, allowed)}allowed fields: {', '.join(allowed)}",
            )


def _yaml_int(mapping: _Mapping, key: str, path: str, default: int | None = None) -> int:
    value = mapping.get(key, default)
    if value is None:
        raise InventoryError(path, mapping.line, key, "is missing", f"add `{key}:` to the node entry")
    if isinstance(value, bool) or not isinstance(value, int):
        raise InventoryError(
            path, mapping.line_of(key), key, f"{value!r} is not an integer", f"write {key} as a whole number"
        )
    if value < 0:
        raise InventoryError(path, mapping.line_of(key), key, f"{value} is negative", f"write {key} as 0 or more")
    return value


def _parsed(mapping: _Mapping, key: str, parse: Callable[[Any], int], path: str, what: str, hint: str) -> int:
    """`parse(mapping[key])`, or an `InventoryError` naming the key, the value and how to write it."""
    try:
        return parse(mapping[key])
    except (TypeError, ValueError):
        raise InventoryError(path, mapping.line_of(key), key, f"{mapping[key]!r} is not {what}", hint) from None


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
    if not isinstance(raw, _Mapping):
        raise InventoryError(
            path,
            doc.line_of("unit_milli"),
            "unit_milli",
            "is not a mapping",
            "write one `MODEL: milli` line per model, e.g. `L40S: 125`",
        )
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


def _expand_group(
    entry: Any, index: int, line: int, catalog: Catalog, unit_milli: Mapping[str, int], path: str
) -> list[tuple[Node, int]]:
    if not isinstance(entry, _Mapping):
        raise InventoryError(
            path,
            line,
            f"nodes[{index}]",
            "is not a mapping",
            "write each node (group) as a mapping with name, model, gpus, cpu, memory",
        )
    _check_fields(entry, _NODE_FIELDS, path, f"nodes[{index}]")
    pattern = entry.get("name")
    if not isinstance(pattern, str) or not pattern.strip():
        raise InventoryError(
            path,
            entry.line,
            "name",
            "the node name is missing",
            "give the node (group) a `name`, with {index} when count > 1",
        )
    count = _yaml_int(entry, "count", path, default=1)
    start = _yaml_int(entry, "start", path, default=0)
    if count < 1:
        raise InventoryError(path, entry.line_of("count"), "count", "is 0", "set count to 1 or more, or drop the entry")
    if count > 1 and "{index" not in pattern:
        raise InventoryError(
            path,
            entry.line_of("name"),
            "name",
            f"{pattern!r} has no {{index}} but count is {count}",
            "put {index} (or e.g. {index:02d}) in the name so every node gets its own",
        )
    model: GpuModel | None = None
    if entry.get("model") not in (None, ""):
        try:
            model = catalog.lookup(str(entry["model"]))
        except CatalogError as exc:
            raise unknown_model(
                path, entry.line_of("model"), "model", exc, ", or describe the model under `models`"
            ) from None
    gpus = _yaml_int(entry, "gpus", path, default=None if model else 0)
    if model is None and gpus > 0:
        raise InventoryError(
            path,
            entry.line_of("gpus"),
            "model",
            f"{gpus} GPUs but no model",
            "name the GPU model, or set gpus to 0 for a CPU-only node",
        )
    if model is not None and gpus == 0:
        raise InventoryError(
            path,
            entry.line_of("gpus"),
            "gpus",
            f"0 GPUs but model {model.name!r}",
            "set gpus to the node's GPU count, or drop model for a CPU-only node",
        )
    for key in ("cpu", "memory"):
        if key not in entry:
            raise InventoryError(path, entry.line, key, "is missing", f"add `{key}:` to the node entry")
    cpu = _parsed(
        entry, "cpu", parse_cpu, path, "a CPU amount", 'write cores as a number (e.g. 96) or milli-cores as "96000m"'
    )
    memory = _parsed(
        entry,
        "memory",
        parse_memory,
        path,
        "a memory amount",
        "write MiB as an integer (e.g. 262144) or a quantity like 256Gi",
    )
    labels = entry.get("labels") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(v, (str, int, float, bool)) for v in labels.values()):
        raise InventoryError(
            path,
            entry.line_of("labels"),
            "labels",
            "is not a mapping of plain values",
            "write labels as `key: value` lines",
        )
    uuids = entry.get("gpu_uuids") or []
    if uuids:
        if not isinstance(uuids, list) or not all(isinstance(u, str) for u in uuids) or len(uuids) != gpus:
            raise InventoryError(
                path,
                entry.line_of("gpu_uuids"),
                "gpu_uuids",
                f"expected {gpus} strings",
                "list one UUID per GPU, or drop gpu_uuids",
            )
        if count > 1:
            raise InventoryError(
                path,
                entry.line_of("gpu_uuids"),
                "gpu_uuids",
                "is set on a group of nodes",
                "give gpu_uuids only on a single node (count 1)",
            )
    domain = entry.get("domain")
    if domain is not None and (not isinstance(domain, (str, int)) or str(domain).strip() == ""):
        raise InventoryError(
            path,
            entry.line_of("domain"),
            "domain",
            f"{domain!r} is not a name",
            "write the domain as a name, or drop it (a node is then its own domain)",
        )
    node_labels = {str(k): _label_value(v) for k, v in sorted(labels.items(), key=lambda kv: str(kv[0]))}
    out = []
    for i in range(start, start + count):
        try:
            name = pattern.format(index=i)
        except (KeyError, IndexError, ValueError) as exc:
            raise InventoryError(
                path,
                entry.line_of("name"),
                "name",
                f"{pattern!r} is not a valid pattern ({exc})",
                "use {index} or {index:02d} as the only placeholder",
            ) from None
        node = Node(
            name=name,
            model=model,
            gpus=gpus,
            cpu_milli=cpu,
            memory_mib=memory,
            domain=str(domain).strip() if domain is not None else name,
            unit_milli=unit_milli.get(model.name, MILLI_PER_GPU) if model else MILLI_PER_GPU,
            labels=MappingProxyType(node_labels),
            gpu_uuids=tuple(uuids),
        )
        out.append((node, entry.line_of("name")))
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
    _check_fields(doc, _TOP_FIELDS, source, "the inventory")
    version = doc.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise InventoryError(
            source,
            doc.line_of("schema_version"),
            "schema_version",
            f"{version!r} is not supported",
            f"write schema_version: {SCHEMA_VERSION}",
        )
    extra = doc.get("models") or []
    if extra:
        if not isinstance(extra, _Sequence):
            raise InventoryError(
                source,
                doc.line_of("models"),
                "models",
                "is not a list",
                "list extra models in the gpu_catalog.yaml entry schema",
            )
        for i, entry in enumerate(extra):
            try:
                catalog = catalog.extended([parse_model_entry(entry, "entry")])
            except CatalogError as exc:
                raise InventoryError(
                    source, extra.lines[i], f"models[{i}]", str(exc), "fix the model entry (schema in gpu_catalog.yaml)"
                ) from None
    unit_milli = _read_unit_milli(doc, catalog, source)
    entries = doc.get("nodes")
    if not isinstance(entries, _Sequence) or not entries:
        raise InventoryError(
            source, doc.line_of("nodes"), "nodes", "no nodes are listed", "add a `nodes:` list with at least one node"
        )
    nodes: list[Node] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        for node, line in _expand_group(entry, i, entries.lines[i], catalog, unit_milli, source):
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
