"""A pool from an openb-style node CSV (DESIGN.md section 3).

openb node CSV (`sn,cpu_milli,memory_mib,gpu,model`, optional `domain`; header on line 1)
    One node per row. `model` is a catalog name or alias (openb's `V100M16`, `G2`, ...); a row with
    `gpu` 0 and an empty `model` is a CPU-only node. Without a `domain` column, each model's nodes
    (CPU-only nodes count as one model) are cut, in file order, into consecutive blocks of
    `domain_size` nodes named `<model>-<block>` (e.g. `G2-000`).

Any malformed input raises `InventoryError` naming the file, the line, the field and the fix, and
nothing is returned.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from pathlib import Path

from xirang_platform.pool.catalog import Catalog, CatalogError, default_catalog
from xirang_platform.pool.inventory_error import InventoryError, check_unit_milli, read_text, unknown_model
from xirang_platform.pool.model import MILLI_PER_GPU, GpuModel, Node, Pool

OPENB_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
CPU_ONLY_DOMAIN = "cpu"


def _csv_int(row: Mapping[str, str], column: str, path: Path, line: int) -> int:
    raw = (row.get(column) or "").strip()
    try:
        value = int(raw)
    except ValueError:
        raise InventoryError(
            path, line, column, f"{raw!r} is not an integer", f"write {column} as a whole number"
        ) from None
    if value < 0:
        raise InventoryError(path, line, column, f"{value} is negative", f"write {column} as 0 or more")
    return value


def read_openb_nodes(
    path: str | Path, domain_size: int = 8, unit_milli: int = 1, catalog: Catalog | None = None
) -> Pool:
    """A pool from an openb-style node CSV (`sn,cpu_milli,memory_mib,gpu,model`, optional `domain`)."""
    path = Path(path)
    catalog = catalog or default_catalog()
    if isinstance(domain_size, bool) or not isinstance(domain_size, int) or domain_size < 1:
        raise InventoryError(
            path, None, "domain_size", f"{domain_size!r} is not a positive integer", "pass --domain-size 1 or more"
        )
    check_unit_milli(unit_milli, path, None, "unit_milli")
    handle = io.StringIO(read_text(path), newline="")
    nodes: list[Node] = []
    seen: dict[str, int] = {}
    blocks: dict[str, int] = {}  # nodes seen so far per model, for the automatic domains
    with handle:
        reader = csv.DictReader(handle)
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [c for c in OPENB_COLUMNS if c not in header]
        if missing:
            raise InventoryError(
                path,
                1,
                missing[0],
                f"column {missing[0]!r} is missing from the header",
                f"the header must hold {','.join(OPENB_COLUMNS)} (optionally domain)",
            )
        reader.fieldnames = header
        has_domain = "domain" in header
        for row in reader:
            line = reader.line_num
            if None in row:
                raise InventoryError(
                    path,
                    line,
                    "row",
                    f"{len(header) + len(row[None])} fields for {len(header)} columns",
                    "remove the extra fields",
                )
            name = (row["sn"] or "").strip()
            if not name:
                raise InventoryError(path, line, "sn", "the node name is empty", "give every node a name")
            if name in seen:
                raise InventoryError(
                    path,
                    line,
                    "sn",
                    f"node {name!r} is already named on line {seen[name]}",
                    "give each node a unique name",
                )
            seen[name] = line
            cpu = _csv_int(row, "cpu_milli", path, line)
            memory = _csv_int(row, "memory_mib", path, line)
            gpus = _csv_int(row, "gpu", path, line)
            model_name = (row["model"] or "").strip()
            model: GpuModel | None = None
            if model_name:
                try:
                    model = catalog.lookup(model_name)
                except CatalogError as exc:
                    raise unknown_model(path, line, "model", exc) from None
                if gpus == 0:
                    raise InventoryError(
                        path,
                        line,
                        "gpu",
                        f"0 GPUs but model {model_name!r}",
                        "set gpu to the node's GPU count, or clear model for a CPU-only node",
                    )
            elif gpus > 0:
                raise InventoryError(
                    path,
                    line,
                    "model",
                    f"{gpus} GPUs but no model",
                    "name the GPU model (e.g. T4), or set gpu to 0 for a CPU-only node",
                )
            if has_domain:
                domain = (row["domain"] or "").strip()
                if not domain:
                    raise InventoryError(
                        path,
                        line,
                        "domain",
                        "the domain is empty",
                        "fill in every row's domain, or drop the column for automatic domains",
                    )
            else:
                key = model.name if model else CPU_ONLY_DOMAIN
                index = blocks.get(key, 0)
                blocks[key] = index + 1
                domain = f"{key}-{index // domain_size:03d}"
            nodes.append(
                Node(
                    name=name,
                    model=model,
                    gpus=gpus,
                    cpu_milli=cpu,
                    memory_mib=memory,
                    domain=domain,
                    unit_milli=unit_milli if model else MILLI_PER_GPU,
                )
            )
    if not nodes:
        raise InventoryError(path, 1, "rows", "the file holds no nodes", "add one row per node below the header")
    return Pool(tuple(nodes), source=str(path))


# --- YAML inventory -----------------------------------------------------------------------------
