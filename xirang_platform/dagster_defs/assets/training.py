"""Real, small training work for the offline sweep: scikit-learn's MLP on the bundled digits, on CPU.

The loop resumes from the lineage's checkpoint, runs the remaining epochs, and checkpoints after each
one, so a preempted run's resumption redoes no finished epoch. On a preemption notice
(`GpuPoolResource.on_preemption`) it stops after the epoch's checkpoint, well within the grace, so the
resumption redoes nothing. The lifecycle's `trained_model` trains data-parallel with PyTorch instead
(`distributed_training.py`); both take the pool through `TrainingPool`.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from dagster import AssetExecutionContext

from xirang_platform.dagster_defs.assets.checkpoints import Checkpoints

if TYPE_CHECKING:
    from sklearn.neural_network import MLPClassifier

    from resources.gpu_pool import StepContext

# scikit-learn is imported where it is used: every code server and run process imports the definitions,
# and most runs (probes, replicas, the pool observer) never train.

CLASSES = np.arange(10)


class TrainingPool(Protocol):
    """What a training loop asks of the pool (`GpuPoolResource`): report checkpoints, take the
    preemption notice, stop on it."""

    def checkpointed(self, context: StepContext, step: int | None = None, at: float | None = None) -> bool:
        """Record that the run saved a checkpoint."""
        ...

    def on_preemption(self, context: StepContext) -> AbstractContextManager[None]:
        """Within the block the run's termination is its notice."""
        ...

    def preemption_requested(self, context: StepContext) -> bool:
        """Whether the notice came."""
        ...

    def pause(self, context: StepContext, seconds: float) -> None:
        """Sleep, cut short by the notice."""
        ...

    def stop_on_notice(self, context: StepContext, step: int | None = None, *, saved: bool = True) -> None:
        """Stop the run after the checkpoint saved on the notice (`saved=False`: nothing to save)."""
        ...


@dataclass(frozen=True)
class Trained:
    """A trained model and how much of its training this run did."""

    model: MLPClassifier
    epochs: int
    resumed_from_epoch: int
    checkpoint: Checkpoints


def train(
    context: AssetExecutionContext,
    data: dict[str, np.ndarray],
    *,
    epochs: int,
    hidden_units: int,
    learning_rate: float,
    seed: int,
    epoch_pause_s: float = 0.0,
    name: str = "",
    gpu_pool: TrainingPool | None = None,
) -> Trained:
    """Train epoch by epoch from the lineage's last checkpoint (`name` tells candidates of one asset apart);
    each epoch's checkpoint is reported to `gpu_pool`, so a preemption picks victims by the work since it."""
    # The notice is taken from the loop's first line: a victim preempted while it imports and loads its
    # checkpoint (the cheapest victim is the newest run) stops cleanly before its first epoch.
    with gpu_pool.on_preemption(context) if gpu_pool is not None else nullcontext():
        from sklearn.neural_network import MLPClassifier

        checkpoints = Checkpoints.for_run(context, name)
        state = checkpoints.load()
        resumed_from = state["epoch"] if state else 0
        model = (
            state["model"]
            if state
            else MLPClassifier(hidden_layer_sizes=(hidden_units,), learning_rate_init=learning_rate, random_state=seed)
        )
        if resumed_from:
            context.log.info(f"{name or 'model'}: resuming from the checkpoint of epoch {resumed_from} of {epochs}")
        if gpu_pool is not None and resumed_from < epochs and gpu_pool.preemption_requested(context):
            gpu_pool.stop_on_notice(context, step=resumed_from or None, saved=False)
        x, y = data["x_train"], data["y_train"]
        for epoch in range(resumed_from + 1, epochs + 1):
            order = np.random.default_rng([seed, epoch]).permutation(len(y))
            model.partial_fit(x[order], y[order], classes=CLASSES)
            checkpoints.save({"epoch": epoch, "model": model})
            if gpu_pool is None:
                time.sleep(epoch_pause_s)
                continue
            gpu_pool.checkpointed(context, step=epoch)
            if epoch < epochs and gpu_pool.preemption_requested(context):
                gpu_pool.stop_on_notice(context, step=epoch)  # saved above: stop cleanly within the grace
            gpu_pool.pause(context, epoch_pause_s)
    return Trained(model, epochs, resumed_from, checkpoints)


def accuracy(model: Any, x: np.ndarray, y: np.ndarray) -> float:
    """The share of `x` that `model` labels as `y`."""
    return float(np.mean(model.predict(x) == y))
