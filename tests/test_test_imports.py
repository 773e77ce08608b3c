"""How the tests import each other's code: one way, by package path.

Shared builders, fixtures and fakes live in helper modules (`tests/<package>/<name>.py`, not
`test_*.py`), imported as `from tests.scheduling.cycle_builders import job`: `pythonpath = ["."]` in
pyproject.toml puts the repository root on the path. A test module never imports another test module
(collecting one would run its tests twice over, and its helpers hide among tests), never names a
helper by its bare module name (pytest's rootdir insertion makes that work by accident, and the same
file then loads twice under two names), and never edits `sys.path`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def helper_names(tests: Path) -> frozenset[str]:
    """The bare module names of the helper modules under `tests` (every `.py` but tests and conftests)."""
    return frozenset(p.stem for p in tests.rglob("*.py") if not p.name.startswith("test_") and p.name != "conftest.py")


def imported_modules(node: ast.AST) -> list[str]:
    """The modules an import statement names (`from . import x` names none)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module]
    return []


SYS_PATH_EDITS = frozenset({"insert", "append", "extend", "remove", "pop", "clear"})


def edits_sys_path(node: ast.AST) -> bool:
    """A call of a method that changes `sys.path` (`insert`, `append`, ...) or an assignment to it."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in SYS_PATH_EDITS and ast.unparse(node.func.value) == "sys.path"
    if isinstance(node, ast.Assign | ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(ast.unparse(t) == "sys.path" for t in targets)
    return False


def import_problems(source: str, where: str, helpers: frozenset[str]) -> list[str]:
    """`where:line: problem, and its fix` for each way `source` imports test code other than by package path."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        for module in imported_modules(node):
            parts = module.split(".")
            if any(part.startswith("test_") for part in parts):
                problems.append(
                    f"{where}:{line}: imports the test module {module}: move what it shares into a helper module "
                    "(tests/<package>/<name>.py) and import that"
                )
            elif parts[0] in helpers:
                problems.append(
                    f"{where}:{line}: imports the helper {module} by its bare name: import it by package path "
                    "(`from tests.<package>." + parts[0] + " import ...`)"
                )
        if edits_sys_path(node):
            problems.append(
                f"{where}:{line}: edits sys.path: import helpers as `tests.<package>.<module>` "
                '(pyproject.toml\'s `pythonpath = ["."]`), or pass PYTHONPATH to a subprocess'
            )
    return sorted(problems, key=lambda p: (p.split(":")[0], int(p.split(":")[1])))


def test_every_test_file_imports_test_code_by_package_path() -> None:
    helpers = helper_names(TESTS)
    assert {"cycle_builders", "ledger_helpers", "engine_harness", "strategies"} <= helpers
    problems = [
        problem
        for path in sorted(TESTS.rglob("*.py"))
        for problem in import_problems(path.read_text(encoding="utf-8"), str(path.relative_to(TESTS.parent)), helpers)
    ]
    assert problems == []


HELPERS = frozenset({"cycle_builders", "ledger_helpers"})


@pytest.mark.parametrize(
    ("source", "want"),
    [
        pytest.param(
            "from tests.scheduling.cycle_builders import job\nimport tests.ledger.ledger_helpers as lh\n",
            [],
            id="helpers imported by package path pass",
        ),
        pytest.param(
            "import json\nfrom xirang_platform.scheduling import cycle\n",
            [],
            id="the standard library and the project pass",
        ),
        pytest.param(
            "from cycle_builders import job\n",
            [
                "t.py:1: imports the helper cycle_builders by its bare name: import it by package path "
                "(`from tests.<package>.cycle_builders import ...`)"
            ],
            id="a helper named by its bare module name is refused with the package-path form",
        ),
        pytest.param(
            "def f():\n    from test_cycle_properties import CONFIG\n",
            [
                "t.py:2: imports the test module test_cycle_properties: move what it shares into a helper module "
                "(tests/<package>/<name>.py) and import that"
            ],
            id="a test module imported inside a function is refused",
        ),
        pytest.param(
            "from tests.control.test_tick_plan import CONFIG\n",
            [
                "t.py:1: imports the test module tests.control.test_tick_plan: move what it shares into a helper "
                "module (tests/<package>/<name>.py) and import that"
            ],
            id="a test module imported by package path is refused too",
        ),
        pytest.param(
            "import sys\nsys.path.insert(0, 'tests/launch')\nsys.path = ['x']\n",
            [
                "t.py:2: edits sys.path: import helpers as `tests.<package>.<module>` "
                '(pyproject.toml\'s `pythonpath = ["."]`), or pass PYTHONPATH to a subprocess',
                "t.py:3: edits sys.path: import helpers as `tests.<package>.<module>` "
                '(pyproject.toml\'s `pythonpath = ["."]`), or pass PYTHONPATH to a subprocess',
            ],
            id="inserting into or assigning sys.path is refused",
        ),
        pytest.param(
            "import os, sys\nenv = {**os.environ, 'PYTHONPATH': os.pathsep.join(sys.path)}\n",
            [],
            id="reading sys.path for a subprocess's environment passes",
        ),
    ],
)
def test_the_import_check_names_each_problem_and_its_fix(source: str, want: list[str]) -> None:
    assert import_problems(source, "t.py", HELPERS) == want
