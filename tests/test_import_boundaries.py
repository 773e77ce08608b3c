"""What the import contracts (`[tool.importlinter]` in pyproject.toml, run by `make lint`) cannot say.

The contracts hold the layers of DESIGN.md section 2 apart, forbid import cycles, and keep Dagster and
SQL in their layers. Two rules are left to this file:

- every package of `xirang_platform/` (and the top-level `resources` and `sensors`) sits in a layer of
  the layers contract, so a new package cannot slip past it (import-linter checks only the layers it
  is given);
- the scheduler core (`xirang_platform/scheduling/`) imports only the standard library and numpy
  from outside the project: an allow-list, where a forbidden contract can only list what it refuses.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

import grimp
import pytest
from importlinter.api import read_configuration

ROOT = Path(__file__).resolve().parents[1]
ROOTS = ("xirang_platform", "resources", "sensors")
CORE = "xirang_platform.scheduling"
CORE_MAY_IMPORT = frozenset(sys.stdlib_module_names) | {"numpy"}


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    """The project's import graph as import-linter builds it (third-party packages as their top name)."""
    return grimp.build_graph(*ROOTS, include_external_packages=True, cache_dir=None)


def layered_modules() -> set[str]:
    """The packages the layers contract names (a layer `a | b` names two siblings)."""
    contracts = read_configuration(str(ROOT / "pyproject.toml"))["contracts_options"]
    (layers,) = [c["layers"] for c in contracts if c["id"] == "layers"]
    return {name.strip() for layer in layers for name in layer.replace(":", "|").split("|")}


def unlayered(packages: Iterable[str], layered: set[str]) -> list[str]:
    """The packages no layer names, sorted."""
    return sorted(set(packages) - layered)


def foreign_imports(graph: grimp.ImportGraph, package: str, allowed: frozenset[str]) -> list[str]:
    """`module -> package` for every import by `package`'s modules of a package from outside the
    project (grimp keeps those as their top-level name, "squashed") that `allowed` lacks."""
    return sorted(
        f"{module} -> {imported}"
        for module in graph.find_descendants(package) | {package}
        for imported in graph.find_modules_directly_imported_by(module)
        if graph.is_module_squashed(imported) and imported not in allowed
    )


def test_every_package_sits_in_a_layer(graph: grimp.ImportGraph) -> None:
    packages = {*graph.find_children("xirang_platform"), "resources", "sensors"}
    assert {CORE, "xirang_platform.definitions", "sensors"} <= packages
    assert unlayered(packages, layered_modules()) == []


def test_the_core_imports_only_the_standard_library_and_numpy(graph: grimp.ImportGraph) -> None:
    assert foreign_imports(graph, CORE, CORE_MAY_IMPORT) == []


@pytest.mark.parametrize(
    ("files", "package", "want"),
    [
        pytest.param(
            {"core/__init__.py": "", "core/a.py": "import numpy\nimport pandas\nimport json\n"},
            "core",
            ["core.a -> pandas"],
            id="a third-party package outside the allow-list is named with its importer",
        ),
        pytest.param(
            {"core/__init__.py": "", "core/sub/__init__.py": "", "core/sub/b.py": "def f():\n    import yaml\n"},
            "core",
            ["core.sub.b -> yaml"],
            id="an import inside a function of a subpackage counts",
        ),
        pytest.param(
            {"core/__init__.py": "import numpy as np\nfrom collections import abc\n"},
            "core",
            [],
            id="the standard library and numpy are allowed",
        ),
    ],
)
def test_the_allow_list_catches_a_foreign_import(
    tmp_path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str], package: str, want: list[str]
) -> None:
    for name, source in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    probe = grimp.build_graph(package, include_external_packages=True, cache_dir=None)
    assert foreign_imports(probe, package, CORE_MAY_IMPORT) == want


def test_a_package_without_a_layer_is_named() -> None:
    assert unlayered(["xirang_platform.pool", "xirang_platform.newcomer"], layered_modules()) == [
        "xirang_platform.newcomer"
    ]
