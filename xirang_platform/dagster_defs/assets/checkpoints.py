"""Training checkpoints that outlive a preempted run (DESIGN.md section 7: resumption redoes no work).

A checkpoint lives under the instance's storage directory, keyed by the asset and by the run's root
run: the platform resumes a preempted run as a new run whose root is the first one, so the
resumption finds the epochs its predecessor finished. A checkpoint is written to a temporary file
and renamed into place, so a run killed mid-write leaves the previous epoch's checkpoint intact.
`Checkpoints` pickles the scikit-learn models of the offline sweep; the lifecycle's data-parallel
training keeps a `torch.save` file at `checkpoint_path(..., suffix=".pt")` (`xirang_platform/training/`).
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster import AssetExecutionContext

from xirang_platform.dagster_defs.assets.admission import lineage_root

CHECKPOINT_DIR = "xirang-checkpoints"


@dataclass(frozen=True)
class Checkpoints:
    """The checkpoint file of one asset in one lineage of runs."""

    path: Path

    @classmethod
    def for_run(cls, context: AssetExecutionContext, name: str = "") -> Checkpoints:
        """The checkpoint of the asset being materialized (and of its part `name`), shared by a run and its
        resumptions."""
        return cls(checkpoint_path(context, name))

    def load(self) -> dict[str, Any] | None:
        """The last saved state, or None when this lineage has not saved one yet."""
        if not self.path.exists():
            return None
        with self.path.open("rb") as f:
            return pickle.load(f)  # noqa: S301 - written by this module, under the instance's own storage

    def save(self, state: dict[str, Any]) -> None:
        """Write `state` atomically (temporary file, then rename)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            pickle.dump(state, f)
        os.replace(tmp, self.path)


def checkpoint_path(context: AssetExecutionContext, name: str = "", suffix: str = ".pkl") -> Path:
    """Where the asset being materialized keeps its checkpoint (of its part `name`) in this lineage of runs:
    under the instance's storage, by asset key and root run; `suffix` names the format (`.pt`: torch)."""
    storage = Path(context.instance.storage_directory())
    key = "__".join(context.asset_key.path)
    root = lineage_root(context.instance, context.run)
    return storage / CHECKPOINT_DIR / key / f"{root}{'-' + name if name else ''}{suffix}"
