"""The operations suite reuses the engine harness (tests/dagster), the ledger builders (tests/ledger)
and the simulator builders (tests/simulate)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for folder in ("dagster", "ledger", "simulate"):
    path = str(HERE.parent / folder)
    if path not in sys.path:
        sys.path.insert(0, path)
