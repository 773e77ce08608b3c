"""Inventory readers: a pool from a YAML inventory (`yaml_inventory.py`) or an openb-style node CSV
(`openb_csv.py`), chosen by the file's suffix, and the bundled default pool (DESIGN.md section 3).

Any malformed input raises `InventoryError` naming the file, the line, the field and the fix, and
nothing is returned.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

from xirang_platform.pool.catalog import Catalog
from xirang_platform.pool.inventory_error import InventoryError
from xirang_platform.pool.model import Pool
from xirang_platform.pool.openb_csv import read_openb_nodes
from xirang_platform.pool.yaml_inventory import parse_inventory, read_inventory


def read_pool(path: str | Path, domain_size: int = 8, unit_milli: int = 1, catalog: Catalog | None = None) -> Pool:
    """A pool from a YAML inventory (.yaml/.yml) or an openb node CSV (.csv), chosen by suffix.

    `domain_size` and `unit_milli` apply to a CSV only; a YAML inventory states its own.
    """
    suffix = Path(path).suffix.lower()
    if suffix in (".yaml", ".yml"):
        return read_inventory(path, catalog)
    if suffix == ".csv":
        return read_openb_nodes(path, domain_size=domain_size, unit_milli=unit_milli, catalog=catalog)
    raise InventoryError(
        path,
        None,
        "file",
        f"suffix {suffix or '(none)'!r} is not an inventory format",
        "give a YAML inventory (.yaml, .yml) or an openb node CSV (.csv)",
    )


DEFAULT_POOL_SOURCE = "default_pool.yaml"


def default_pool_text() -> str:
    """The bundled default pool inventory, as YAML text."""
    return resources.files("xirang_platform.pool").joinpath("data/default_pool.yaml").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def default_pool() -> Pool:
    """The bundled default pool (`data/default_pool.yaml`), read once."""
    return parse_inventory(default_pool_text(), DEFAULT_POOL_SOURCE)
