"""A training checkpoint: saved by rank 0 with `torch.save`, read by every rank of the next launch.

It holds what a resumption at any world size needs, and nothing per rank: the model's and the
optimizer's state, the finished steps, and the settings that fix what a step is (global batch, seed,
hidden units). No random state is kept: the data order is drawn from the seed and the epoch
(`plan.py`), and the model has no dropout, so a resumed step draws nothing that an uninterrupted
run's would not. A checkpoint is written to a temporary file and renamed into place, so a run killed
mid-write leaves the previous one intact.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from xirang_platform.training.predictor import MlpClassifier

# The settings a checkpoint must share with the run that resumes it: each changes what a step is.
FIXED = ("global_batch", "seed", "hidden_units")


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write `state` to `path` atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    """The saved state on the CPU, or None when the lineage has none yet."""
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


def resumption_problem(state: dict[str, Any] | None, settings: dict[str, Any]) -> str | None:
    """Why a run with `settings` cannot resume `state` (a setting of `FIXED` differs), or None."""
    if state is None:
        return None
    differ = [k for k in FIXED if state[k] != settings[k]]
    if not differ:
        return None
    said = ", ".join(f"{k} {settings[k]} (the checkpoint's is {state[k]})" for k in differ)
    return (
        f"cannot resume the checkpoint of step {state['step']} with {said}: a resumption keeps the run config "
        "it was trained with; set the checkpoint's values, or materialize as a new run (a new lineage)"
    )


def classifier_of(model_state: dict[str, torch.Tensor]) -> MlpClassifier:
    """A `build_model` state dict (its linear layers, in order) as a numpy classifier."""
    names = sorted({k.rsplit(".", 1)[0] for k in model_state}, key=int)
    return MlpClassifier(
        weights=tuple(model_state[f"{n}.weight"].detach().cpu().numpy() for n in names),
        biases=tuple(model_state[f"{n}.bias"].detach().cpu().numpy() for n in names),
    )
