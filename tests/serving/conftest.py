"""The serving suite reuses the operations helpers (tests/ops: the real Prometheus server)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for folder in ("ops",):
    path = str(HERE.parent / folder)
    if path not in sys.path:
        sys.path.insert(0, path)
