"""The lifecycle's training as a Dagster step: `torchrun` with one worker per allocated GPU.

`train_data_parallel` reads the world size from the run's allocation (`xirang/allocation`: one worker
per GPU; a run that holds none, materialized outside the platform, runs one), hands the dataset
asset's rows to the workers in a file, and launches them (`xirang_platform/training/launch.py`) with
the lineage's checkpoint, so a resumption at any size continues from the step after it. The workers'
output goes to the run's log; each checkpoint they save is reported to the pool (the victim order's
work lost); the run's preemption notice makes them save one after their current step and stop, and
the run then ends on its notice. The scheduler's resize of an elastic run (DESIGN.md section 11) is
that notice and a resumption with another allocation: the same code, a different world size. The
step's own process never imports torch: the workers check the checkpoint and write the trained weights
for the numpy classifier (`training/predictor.py`).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from dagster import AssetExecutionContext, Failure

from xirang_platform.control.run_allocation import RunAllocation
from xirang_platform.dagster_defs.assets.checkpoints import checkpoint_path
from xirang_platform.dagster_defs.assets.training import TrainingPool
from xirang_platform.training.digits import write_rows
from xirang_platform.training.launch import TrainingJob, TrainingSettings, run_training
from xirang_platform.training.predictor import MlpClassifier
from xirang_platform.training.progress import describe


class AllocatingPool(TrainingPool, Protocol):
    """What the data-parallel step asks of the pool besides a training loop's needs: the run's allocation."""

    def allocation(self, context: AssetExecutionContext) -> RunAllocation | None:
        """The run's allocation, or None for a run that holds none."""
        ...


def world_size(allocation: RunAllocation | None) -> int:
    """Workers to start: one per GPU of the allocation; one for a run that holds no allocation."""
    return allocation.gpu_count if allocation is not None and allocation.gpu_count else 1


@dataclass(frozen=True)
class DataParallelTraining:
    """A finished data-parallel training: its model, where it started and ran, and its checkpoint."""

    model: MlpClassifier
    start: dict[str, Any]  # the workers' `start` event: world size, first step, shares, learning rate
    steps_run: int
    checkpoint: Path
    wall_s: float

    def metadata(self) -> dict[str, Any]:
        """Asset metadata of the training."""
        return {
            "world_size": self.start["world_size"],
            "backend": self.start["backend"],
            "global_batch": self.start["global_batch"],
            "rank_batches": str(self.start["shares"]),
            "learning_rate": self.start["learning_rate"],
            "resumed_from_step": self.start["step"],
            "steps_run_here": self.steps_run,
            "total_steps": self.start["total_steps"],
            "training_wall_s": round(self.wall_s, 2),
        }


def train_data_parallel(
    context: AssetExecutionContext,
    data: dict[str, np.ndarray],
    settings: TrainingSettings,
    gpu_pool: AllocatingPool,
) -> DataParallelTraining:
    """Train on `data`'s training rows under `torchrun` with `settings`, from the lineage's checkpoint;
    see the module doc."""
    began = time.monotonic()
    world = world_size(gpu_pool.allocation(context))
    with gpu_pool.on_preemption(context):
        if gpu_pool.preemption_requested(context):
            gpu_pool.stop_on_notice(context, saved=False)
        path = checkpoint_path(context, suffix=".pt")
        with tempfile.TemporaryDirectory(prefix="xirang-rows-") as folder:
            job = TrainingJob(write_rows(Path(folder) / "rows.npz", data["x_train"], data["y_train"]), path, settings)
            context.log.info(f"torchrun: {world} worker(s), one per allocated GPU; checkpoint {path}")
            outcome = run_training(
                job,
                world,
                on_line=context.log.info,
                on_progress=lambda doc: _report(context, gpu_pool, doc),
                notice=lambda: gpu_pool.preemption_requested(context),
            )
        if outcome.refusal is not None:
            raise Failure(description=outcome.refusal)
        if outcome.stopped:
            gpu_pool.stop_on_notice(context, step=outcome.step)
        if not outcome.done:
            raise Failure(
                description=f"torchrun exited {outcome.returncode} before training finished: {' | '.join(outcome.tail)}"
            )
    return DataParallelTraining(
        model=MlpClassifier.load(job.model_file),
        start=outcome.started(),
        steps_run=outcome.steps_run,
        checkpoint=path,
        wall_s=time.monotonic() - began,
    )


def _report(context: AssetExecutionContext, gpu_pool: TrainingPool, doc: dict[str, Any]) -> None:
    """Log a progress event; report a saved checkpoint to the pool."""
    context.log.info(describe(doc))
    if doc["event"] == "checkpoint":
        gpu_pool.checkpointed(context, step=doc["step"])
