"""Values people type or write into files: names and quotas checked one way everywhere, echoed safely.

The quota ledger (`xirang quota`, `Ledger`), the simulator's `--tenants` file and the command-line
messages all read tenant and project names and GPU quotas through this module, so a name or a quota
the ledger would refuse is refused by the simulator too, with the same words.

- Names: 1-64 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit. Lower
  case only, so that `Research` and `research` cannot become two accounts (they would be one
  Kubernetes namespace and one Dagster tag value to a person reading them).
- Quotas: a number of GPUs (`8`, `0.5`, `12.125`), at most 3 decimals (stored as milli-GPU), 0 to
  `MAX_QUOTA_GPUS`. The bound keeps every stored amount, and the cap of 1.2 x the quota, inside a
  32-bit `integer` column on SQLite and PostgreSQL alike.
- Echoes: user text is printed verbatim (rich markup escaped) and long values are cut short.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path

from rich.console import Console
from rich.text import Text

from xirang_platform.base.units import MILLI_PER_GPU

MAX_QUOTA_GPUS = 1_000_000
MAX_QUOTA_MILLI = MAX_QUOTA_GPUS * MILLI_PER_GPU
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
NAME_RULE = "use 1-64 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit"
ECHO_LIMIT = 80


class InputError(ValueError):
    """A name or number that cannot be used; the message names it and the fix."""


def shown(value: object, limit: int = ECHO_LIMIT) -> str:
    """`value` as it is echoed in a message: its repr, cut to about `limit` characters."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 1]}… ({len(str(value)):,} characters)"


def check_name(name: object, what: str) -> str:
    """`name` if it is a valid tenant or project name (`what` says which), else InputError."""
    if isinstance(name, str) and NAME_PATTERN.match(name):
        return name
    hint = ""
    if isinstance(name, str) and NAME_PATTERN.match(name.lower()):
        hint = f" (write {name.lower()!r})"
    no_slash = " (no '/', which separates tenant and project)" if isinstance(name, str) and "/" in name else ""
    raise InputError(f"invalid {what} name {shown(name)}: {NAME_RULE}{hint}{no_slash}")


def quota_milli(value: object) -> int:
    """A quota given in GPUs (decimal text or a number) as milli-GPU, within 0..MAX_QUOTA_GPUS.

    Refuses non-numbers (also NaN, infinities, booleans and '1_000'), negatives, more than
    `MAX_QUOTA_GPUS`, and fractions finer than one milli-GPU."""
    amount = _decimal(value)
    if amount is None:
        raise InputError(f"quota {shown(value)} is not a number of GPUs: write it like 8 or 0.5")
    if amount < 0:
        raise InputError(f"quota {shown(value)} is negative: a quota is 0 GPUs or more")
    if amount > MAX_QUOTA_GPUS:
        raise InputError(
            f"quota {shown(value)} is more than {MAX_QUOTA_GPUS:,} GPUs, the most a quota may be: give a smaller quota"
        )
    milli = amount * MILLI_PER_GPU
    if milli != milli.to_integral_value():
        raise InputError(f"quota {shown(value)} is finer than 1 milli-GPU: use at most 3 decimals, e.g. 0.125")
    return int(milli)


def check_quota_milli(milli: object, what: str) -> int:
    """`milli` if it is a whole number of milli-GPU in 0..MAX_QUOTA_MILLI (API callers), else InputError."""
    if isinstance(milli, bool) or not isinstance(milli, int):
        raise InputError(f"quota of {what} must be a whole number of milli-GPU, got {shown(milli)}")
    if milli < 0:
        raise InputError(f"quota of {what} must not be negative, got {milli} milli-GPU: pass 0 or more")
    if milli > MAX_QUOTA_MILLI:
        raise InputError(
            f"quota of {what} is {milli:,} milli-GPU, more than {MAX_QUOTA_GPUS:,} GPUs, the most a quota may be"
        )
    return milli


def _decimal(value: object) -> Decimal | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return Decimal(repr(value)) if math.isfinite(value) else None
    if isinstance(value, int | Decimal):
        amount = Decimal(value)
    elif isinstance(value, str) and "_" not in value:
        try:
            amount = Decimal(value.strip())
        except InvalidOperation:
            return None
    else:
        return None
    return amount if amount.is_finite() else None


UTF8_FIX = "give a UTF-8 text file (CSV or YAML)"


def not_utf8_problem(error: UnicodeDecodeError) -> str:
    """What is wrong with a file that is not UTF-8 text (for readers that add the place and the fix)."""
    return f"not UTF-8 text (byte {error.start} cannot be decoded)"


def not_utf8(path: str | Path, error: UnicodeDecodeError) -> str:
    """The message for a file that is not UTF-8 text."""
    return f"{path}: {not_utf8_problem(error)}; {UTF8_FIX}"


def print_error(message: str, *, prefix: str = "error") -> None:
    """Print `message` on stderr after a red `prefix:` (yellow for a warning), verbatim: neither rich
    markup (`[/]`) nor emoji codes (`:a:`) in it are rendered."""
    label = Text(f"{prefix}:", style="red" if prefix == "error" else "yellow")
    Console(stderr=True).print(Text.assemble(label, " ", message), highlight=False, soft_wrap=True)


def verbatim(text: str) -> Text:
    """`text` as a rich renderable shown exactly as written (for table cells of user input)."""
    return Text(text)
