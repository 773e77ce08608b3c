"""The layers of DESIGN.md section 2, read from the source with `ast`: who may import what.

- the scheduler core (`xirang_platform/scheduling/`) imports only the standard library, numpy, the
  pool model and itself;
- nothing under `xirang_platform/` but the Dagster layer imports the top-level `resources` or
  `sensors` packages (assets take `GpuPoolResource` as a parameter);
- only `xirang_platform/ledger/` imports sqlalchemy, sqlmodel or alembic;
- only the Dagster layer (`resources/`, `sensors/`, `xirang_platform/coordinator.py`,
  `xirang_platform/assets/`, `xirang_platform/definitions.py`, and the embedded platform that drives
  Dagster's daemons for `xirang demo` and the admission benchmark: `embedded.py`, `demo.py`, and
  `run_workers.py`, which reads a run's worker from its run log, and `crash_scene.py`, the crash
  test's and benchmark's deployment) imports dagster.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for top in ("xirang_platform", "resources", "sensors") for p in (ROOT / top).rglob("*.py"))
DAGSTER_LAYER = (
    "resources/",
    "sensors/",
    "xirang_platform/coordinator.py",
    "xirang_platform/assets/",
    "xirang_platform/ops/",
)
DAGSTER_LAYER_FILES = (
    "xirang_platform/definitions.py",
    "xirang_platform/embedded.py",
    "xirang_platform/demo.py",
    "xirang_platform/run_workers.py",
    "xirang_platform/crash_scene.py",
)
SQL = {"sqlalchemy", "sqlmodel", "alembic"}


Rule = Callable[[Path, str], bool]


def imports(source: str, path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, read as the file at `path` (relative
    imports resolved against its package)."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    found = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            found.append((node.lineno, ".".join([*base, node.module] if node.module else base)))
    return found


def top(module: str) -> str:
    return module.split(".", 1)[0]


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def violations(files: list[Path], allowed: Rule) -> list[str]:
    """Every import in `files` that `allowed` refuses, as `path:line imports module`."""
    return [f"{rel(p)}:{line} imports {m}" for p in files for line, m in imports(p.read_text(), p) if not allowed(p, m)]


def test_the_sources_are_found() -> None:
    names = {rel(p) for p in SOURCES}
    assert "xirang_platform/scheduling/cycle.py" in names
    assert "xirang_platform/ledger/ledger.py" in names
    assert "xirang_platform/definitions.py" in names


def core_may_import(_: Path, module: str) -> bool:
    return (
        top(module) in sys.stdlib_module_names
        or top(module) == "numpy"
        or module == "xirang_platform.pool"
        or module.startswith(("xirang_platform.pool.", "xirang_platform.scheduling"))
    )


def package_may_import(path: Path, module: str) -> bool:
    where = rel(path)
    return (
        top(module) not in ("resources", "sensors") or where.startswith(DAGSTER_LAYER) or where in DAGSTER_LAYER_FILES
    )


def sql_may_import(path: Path, module: str) -> bool:
    return top(module) not in SQL or rel(path).startswith("xirang_platform/ledger/")


def dagster_may_import(path: Path, module: str) -> bool:
    where = rel(path)
    return not top(module).startswith("dagster") or where.startswith(DAGSTER_LAYER) or where in DAGSTER_LAYER_FILES


RULES = [
    pytest.param(
        [p for p in SOURCES if rel(p).startswith("xirang_platform/scheduling/")],
        core_may_import,
        id="the core imports only the standard library, numpy and the pool model",
    ),
    pytest.param(
        [p for p in SOURCES if rel(p).startswith("xirang_platform/")],
        package_may_import,
        id="only the Dagster layer imports the top-level resources and sensors",
    ),
    pytest.param(SOURCES, sql_may_import, id="only the ledger imports sqlalchemy, sqlmodel, alembic"),
    pytest.param(SOURCES, dagster_may_import, id="only the Dagster layer imports dagster"),
]


@pytest.mark.parametrize(("files", "allowed"), RULES)
def test_layer_boundaries(files: list[Path], allowed: Rule) -> None:
    assert files, "the rule must see some files"
    assert violations(files, allowed) == []


@pytest.mark.parametrize(
    ("where", "source", "allowed", "ok"),
    [
        pytest.param("xirang_platform/scheduling/x.py", "import pandas", core_may_import, False, id="core: pandas"),
        pytest.param(
            "xirang_platform/scheduling/x.py", "from ..ledger import db", core_may_import, False, id="core: ledger"
        ),
        pytest.param(
            "xirang_platform/scheduling/x.py", "from ..pool.model import Pool", core_may_import, True, id="core: pool"
        ),
        pytest.param("xirang_platform/scheduling/x.py", "from . import quota", core_may_import, True, id="core: self"),
        pytest.param("xirang_platform/simulate/x.py", "import sensors.tick", package_may_import, False, id="sensors"),
        pytest.param("xirang_platform/simulate/x.py", "from sqlalchemy import text", sql_may_import, False, id="sql"),
        pytest.param("xirang_platform/ledger/x.py", "import sqlmodel", sql_may_import, True, id="ledger: sql"),
        pytest.param("xirang_platform/launch/x.py", "import dagster", dagster_may_import, False, id="dagster"),
        pytest.param("sensors/x.py", "from dagster import sensor", dagster_may_import, True, id="sensors: dagster"),
    ],
)
def test_the_rules_catch_a_crossing(where: str, source: str, allowed: Rule, ok: bool) -> None:
    """Each rule refuses a crossing written into a file at `where` (relative imports resolved)."""
    path = ROOT / where
    assert all(allowed(path, module) for _, module in imports(source, path)) is ok
