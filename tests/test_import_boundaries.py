"""The layers of DESIGN.md section 2 as this project lays them out (docs/design-notes.md, record A17),
read from the source with `ast`: who may import what.

- the scheduler core (`xirang_platform/scheduling/`) imports only the standard library, numpy, the
  pool model and itself;
- nothing under `xirang_platform/` but the Dagster layer imports the top-level `resources` or
  `sensors` packages (assets take `GpuPoolResource` as a parameter);
- only `xirang_platform/ledger/` imports sqlalchemy, sqlmodel or alembic, and the `xirang quota`
  command (`xirang_platform/cli/quota.py`), which reads the ledger's URL and reports its database
  errors (the CLI sits on top and may know every layer, DESIGN.md section 2);
- the platform layer (`xirang_platform/platform/`: the platform config, the autoscaling config, run
  tags, notices, the tenants file) imports no Dagster, nor the Dagster layer, nor the simulator (which
  sits above it: the simulator reads the tenants file through it);
- only the Dagster layer (`resources/`, `sensors/`, `xirang_platform/definitions.py` (what the
  code locations load), `xirang_platform/dagster_defs/`: the coordinator, the assets and
  `run_workers.py`, which reads a run's worker from its run log;
  `xirang_platform/ops/`; and, in `xirang_platform/devtools/`, the embedded platform that drives
  Dagster's daemons for `xirang demo` and the admission benchmark: `embedded.py`, `demo.py`,
  `demo_serving.py` and `crash_scene.py`, the crash test's and benchmark's deployment; and
  `xirang_platform/cli/ops.py`, whose `xirang metrics` and `xirang queue` open the Dagster instance)
  imports dagster;
- the `xirang` command (`xirang_platform/cli/`) sits on top: nothing outside it imports it;
- only the training workers (`xirang_platform/training/worker.py`) and their checkpoint
  (`training/checkpoint.py`) import torch: the code servers, the run processes that launch
  `torchrun` and the serving replicas never pay for it.

And no module of `xirang_platform/` imports itself round a cycle, type-only imports (those under
`if TYPE_CHECKING:`) included, nor does any package (`xirang_platform.<package>`, `resources`,
`sensors`) through its modules: a cycle hides which layer sits on which.
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
    "xirang_platform/dagster_defs/",
    "xirang_platform/ops/",
)
DAGSTER_LAYER_FILES = (
    "xirang_platform/definitions.py",
    "xirang_platform/devtools/embedded.py",
    "xirang_platform/devtools/demo.py",
    "xirang_platform/devtools/demo_serving.py",
    "xirang_platform/devtools/crash_scene.py",
    "xirang_platform/cli/ops.py",
)
SQL = {"sqlalchemy", "sqlmodel", "alembic"}
SQL_CLI = "xirang_platform/cli/quota.py"
ABOVE_PLATFORM = (
    "xirang_platform.simulate",
    "xirang_platform.dagster_defs",
    "xirang_platform.devtools",
    "xirang_platform.ops",
    "xirang_platform.cli",
)


Rule = Callable[[Path, str], bool]


def imports(source: str, path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, read as the file at `path` under
    `root` (relative imports resolved against its package)."""
    return [(line, module) for line, module, _ in imported_names(source, path, root)]


def imported_names(source: str, path: Path, root: Path = ROOT) -> list[tuple[int, str, tuple[str, ...]]]:
    """`imports`, each with the names a `from` import takes from the module (empty for `import m`).
    Every import statement counts, also those under `if TYPE_CHECKING:` and inside functions."""
    package = path.relative_to(root).with_suffix("").parts[:-1]
    found = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            module = ".".join([*base, node.module] if node.module else base)
            found.append((node.lineno, module, tuple(alias.name for alias in node.names)))
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
    assert "xirang_platform/platform/platform_config.py" in names


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
    return top(module) not in SQL or rel(path).startswith("xirang_platform/ledger/") or rel(path) == SQL_CLI


def platform_may_import(_: Path, module: str) -> bool:
    return (
        not top(module).startswith("dagster")
        and top(module) not in ("resources", "sensors")
        and not any(module == m or module.startswith(f"{m}.") for m in ABOVE_PLATFORM)
    )


def cli_may_import(path: Path, module: str) -> bool:
    return not (module == "xirang_platform.cli" or module.startswith("xirang_platform.cli.")) or rel(path).startswith(
        "xirang_platform/cli/"
    )


def dagster_may_import(path: Path, module: str) -> bool:
    where = rel(path)
    return not top(module).startswith("dagster") or where.startswith(DAGSTER_LAYER) or where in DAGSTER_LAYER_FILES


TORCH_FILES = ("xirang_platform/training/worker.py", "xirang_platform/training/checkpoint.py")


def torch_may_import(path: Path, module: str) -> bool:
    return top(module) != "torch" or rel(path) in TORCH_FILES


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
    pytest.param(
        [p for p in SOURCES if rel(p).startswith("xirang_platform/platform/")],
        platform_may_import,
        id="the platform layer imports no Dagster, no Dagster layer, no simulator",
    ),
    pytest.param(SOURCES, dagster_may_import, id="only the Dagster layer imports dagster"),
    pytest.param(SOURCES, cli_may_import, id="nothing but the CLI imports the CLI"),
    pytest.param(SOURCES, torch_may_import, id="only the training workers and their checkpoint import torch"),
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
        pytest.param(
            "xirang_platform/platform/x.py", "import dagster", platform_may_import, False, id="platform: dagster"
        ),
        pytest.param(
            "xirang_platform/platform/x.py",
            "from ..simulate import traces",
            platform_may_import,
            False,
            id="platform: sim",
        ),
        pytest.param(
            "xirang_platform/platform/x.py", "from . import run_tags", platform_may_import, True, id="platform: self"
        ),
        pytest.param("xirang_platform/pool/x.py", "from ..cli import pool", cli_may_import, False, id="cli"),
        pytest.param("xirang_platform/cli/x.py", "from .pool import pool_app", cli_may_import, True, id="cli: self"),
        pytest.param(
            "xirang_platform/training/launch.py", "import torch.distributed", torch_may_import, False, id="torch"
        ),
        pytest.param(
            "xirang_platform/training/worker.py", "from torch import nn", torch_may_import, True, id="torch: worker"
        ),
    ],
)
def test_the_rules_catch_a_crossing(where: str, source: str, allowed: Rule, ok: bool) -> None:
    """Each rule refuses a crossing written into a file at `where` (relative imports resolved)."""
    path = ROOT / where
    assert all(allowed(path, module) for _, module in imports(source, path)) is ok


def module_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module name -> the modules of `packages` (under `root`) it imports. `from p import m` where
    `p.m` is a module imports `p.m`; a package's own `__init__` is the module named as the package."""
    paths = {}
    for path in sorted(p for package in packages for p in (root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        edges = set()
        for _, module, names in imported_names(path.read_text(), path, root):
            submodules = {f"{module}.{n}" for n in names} & paths.keys()
            edges |= submodules
            if module in paths and len(submodules) < len(names or (None,)):
                edges.add(module)
        graph[name] = edges - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of `graph` with more than one module (each sorted; Tarjan)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            part = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return sorted(found)


def cycle_edges(graph: dict[str, set[str]], part: list[str]) -> list[str]:
    """The imports that close `part`, as `a -> b` (what the failure names)."""
    return [f"{a} -> {b}" for a in part for b in sorted(graph[a] & set(part))]


def test_no_import_cycle() -> None:
    """No cycle inside xirang_platform, resources or sensors, nor between them."""
    graph = module_graph(ROOT, ("xirang_platform", "resources", "sensors"))
    assert {"xirang_platform.scheduling.cycle", "resources.gpu_pool", "sensors.scheduling_tick"} <= graph.keys()
    assert [cycle_edges(graph, part) for part in import_cycles(graph)] == []


def package_of(module: str) -> str:
    """The package a module belongs to for the layer graph: `xirang_platform.<package>` (a module at
    the package root, such as `xirang_platform.definitions`, is its own node), or its top-level name."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "xirang_platform" else parts[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """`graph` folded to packages (`package_of`): package -> the other packages its modules import."""
    folded: dict[str, set[str]] = {package_of(m): set() for m in graph}
    for module, edges in graph.items():
        folded[package_of(module)] |= {package_of(e) for e in edges} - {package_of(module)}
    return folded


def test_no_import_cycle_between_packages() -> None:
    """The packages form layers: no two of them import each other, however indirectly (each package
    sits on those below it, as DESIGN.md section 2's table and record A17 list them)."""
    packages = package_graph(module_graph(ROOT, ("xirang_platform", "resources", "sensors")))
    assert {"xirang_platform.base", "xirang_platform.scheduling", "sensors", "xirang_platform.definitions"} <= set(
        packages
    )
    assert [cycle_edges(packages, part) for part in import_cycles(packages)] == []


def write_package(root: Path, files: dict[str, str]) -> None:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)


TYPE_ONLY = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"


@pytest.mark.parametrize(
    ("files", "cycles"),
    [
        pytest.param(
            {"pkg/__init__.py": "", "pkg/a.py": "from pkg.b import B\n", "pkg/b.py": TYPE_ONLY},
            [["pkg.a", "pkg.b"]],
            id="a cycle closed by a type-only import is a cycle",
        ),
        pytest.param(
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "from . import b\n",
                "pkg/b.py": "from .sub import c\n",
                "pkg/sub/__init__.py": "",
                "pkg/sub/c.py": "def f():\n    from ..a import x\n",
            },
            [["pkg.a", "pkg.b", "pkg.sub.c"]],
            id="relative imports, one inside a function, close a cycle of three",
        ),
        pytest.param(
            {"pkg/__init__.py": "from pkg.a import A\n", "pkg/a.py": "from pkg import b\n", "pkg/b.py": ""},
            [],
            id="a package re-exporting its modules, which import their siblings, has no cycle",
        ),
        pytest.param(
            {"pkg/__init__.py": "X = 1\n", "pkg/a.py": "from pkg import X\n", "pkg/b.py": "import pkg.a\n"},
            [],
            id="a module importing a name of its package's init has no cycle",
        ),
        pytest.param(
            {"pkg/__init__.py": "", "pkg/a.py": "import other.b\n", "other/__init__.py": "", "other/b.py": TYPE_ONLY},
            [["other.b", "pkg.a"]],
            id="a cycle between two packages is a cycle",
        ),
    ],
)
def test_the_cycle_rule_catches_a_cycle(tmp_path: Path, files: dict[str, str], cycles: list[list[str]]) -> None:
    write_package(tmp_path, files)
    assert import_cycles(module_graph(tmp_path, ("pkg", "other"))) == cycles


@pytest.mark.parametrize(
    ("files", "cycles"),
    [
        pytest.param(
            {
                "xirang_platform/__init__.py": "",
                "xirang_platform/low/__init__.py": "",
                "xirang_platform/low/a.py": "",
                "xirang_platform/low/b.py": "from xirang_platform.high import c\n",
                "xirang_platform/high/__init__.py": "",
                "xirang_platform/high/c.py": "from xirang_platform.low import a\n",
            },
            [["xirang_platform.high", "xirang_platform.low"]],
            id="two packages importing each other through different modules are a cycle",
        ),
        pytest.param(
            {
                "xirang_platform/__init__.py": "",
                "xirang_platform/entry.py": "from sensors import s\n",
                "sensors/__init__.py": "",
                "sensors/s.py": "from xirang_platform.low import a\n",
                "xirang_platform/low/__init__.py": "",
                "xirang_platform/low/a.py": "",
            },
            [],
            id="a root module above a top-level package above a subpackage is no cycle",
        ),
    ],
)
def test_the_package_rule_catches_a_cycle(tmp_path: Path, files: dict[str, str], cycles: list[list[str]]) -> None:
    write_package(tmp_path, files)
    graph = module_graph(tmp_path, ("xirang_platform", "sensors"))
    assert import_cycles(graph) == []  # no module cycle: only the packages close one
    assert import_cycles(package_graph(graph)) == cycles
