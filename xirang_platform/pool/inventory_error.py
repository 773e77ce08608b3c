"""What every inventory reader shares: `InventoryError`, which names the file, the line, the field,
the problem and the fix, and the checks both formats make (the compute unit, the GPU model, UTF-8).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xirang_platform.base.user_input import UTF8_FIX, not_utf8_problem
from xirang_platform.pool.catalog import CatalogError
from xirang_platform.pool.model import MILLI_PER_GPU


class InventoryError(ValueError):
    """A malformed inventory: says where (file, line, field), what is wrong and how to fix it."""

    def __init__(self, path: str | Path, line: int | None, field: str, problem: str, fix: str) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.problem = problem
        self.fix = fix
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {field}: {problem}; {fix}")


def check_unit_milli(value: Any, path: str | Path, line: int | None, field: str) -> int:
    """`value` as a pool's compute unit in milli-GPU: an InventoryError unless it divides 1000."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or MILLI_PER_GPU % value:
        raise InventoryError(
            path,
            line,
            field,
            f"unit_milli {value!r} does not divide {MILLI_PER_GPU}",
            "use a divisor of 1000 such as 1000, 500, 250, 125 or 1",
        )
    return value


def unknown_model(path: str | Path, line: int | None, field: str, exc: CatalogError, extra: str = "") -> InventoryError:
    """The InventoryError for a GPU model the catalog lacks, with the names it may have meant."""
    hint = f"did you mean {', '.join(exc.suggestions)}? " if exc.suggestions else ""
    return InventoryError(
        path,
        line,
        field,
        f"unknown GPU model {exc.name!r}",
        f"{hint}use a catalog model ({', '.join(exc.known)}) or an alias of one{extra}",
    )


# --- openb node CSV -----------------------------------------------------------------------------


def read_text(path: Path) -> str:
    """The text of an inventory file; an InventoryError when it cannot be read or is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(path, None, "file", f"cannot be read ({exc.strerror})", "check the path") from None
    except UnicodeDecodeError as exc:
        raise InventoryError(path, None, "file", not_utf8_problem(exc), UTF8_FIX) from None
