"""Real `torchrun` processes (gloo on the CPU): a run checkpointed at one world size resumes at another
from the step after its checkpoint, with the world size it was given and the same global batch, and
ends where an uninterrupted run ends."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from xirang_platform.training.checkpoint import load_checkpoint
from xirang_platform.training.digits import digits_split, write_rows
from xirang_platform.training.launch import TrainingJob, TrainingOutcome, TrainingSettings, run_training
from xirang_platform.training.plan import rank_shares
from xirang_platform.training.predictor import MlpClassifier

EPOCHS = 2
STEPS_PER_EPOCH = 23  # 1,437 training rows in global batches of 64
TOTAL = EPOCHS * STEPS_PER_EPOCH
LONG_PAUSE_S = 600.0  # the pause after an epoch, cut short by the notice: the stop lands between epochs


def training_job(folder: Path, *, epoch_pause_s: float = 0.0) -> TrainingJob:
    data = digits_split()
    return TrainingJob(
        data=write_rows(folder / "rows.npz", data["x_train"], data["y_train"]),
        checkpoint=folder / "model.pt",
        settings=TrainingSettings(
            epochs=EPOCHS, global_batch=64, hidden_units=32, learning_rate=0.01, seed=7, epoch_pause_s=epoch_pause_s
        ),
    )


def launch(job: TrainingJob, world_size: int, notice: Callable[[list[dict[str, Any]]], bool]) -> TrainingOutcome:
    """Run `job`; `notice` sees the progress events so far and says whether the notice has come."""
    events: list[dict[str, Any]] = []
    lines: list[str] = []
    outcome = run_training(
        job, world_size, on_line=lines.append, on_progress=events.append, notice=lambda: notice(events)
    )
    assert outcome.returncode == 0, lines
    assert outcome.events == events
    return outcome


def never(_: list[dict[str, Any]]) -> bool:
    return False


def at_once(_: list[dict[str, Any]]) -> bool:
    return True


def after_first_checkpoint(events: list[dict[str, Any]]) -> bool:
    return any(e["event"] == "checkpoint" for e in events)


def final_weights(job: TrainingJob) -> list[np.ndarray]:
    model = MlpClassifier.load(job.model_file)
    return [*model.weights, *model.biases]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    """The weights of the same run at world size 2, never stopped."""
    job = training_job(tmp_path_factory.mktemp("uninterrupted"))
    outcome = launch(job, 2, never)
    assert outcome.done
    return final_weights(job)


@pytest.mark.parametrize(
    ("first_world", "then_world", "notice", "pause_s", "stopped_after"),
    [
        pytest.param(
            2,
            1,
            after_first_checkpoint,
            LONG_PAUSE_S,
            STEPS_PER_EPOCH,
            id="the notice in the pause after epoch 1 at world size 2; resumed at world size 1",
        ),
        pytest.param(
            2,
            3,
            at_once,
            0.0,
            1,
            id="the notice before the first step at world size 2 stops it after that step; resumed at world size 3",
        ),
    ],
)
def test_a_run_checkpointed_at_one_world_size_resumes_at_another_from_the_next_step(
    tmp_path: Path,
    uninterrupted: list[np.ndarray],
    first_world: int,
    then_world: int,
    notice: Callable[[list[dict[str, Any]]], bool],
    pause_s: float,
    stopped_after: int,
) -> None:
    first = launch(training_job(tmp_path, epoch_pause_s=pause_s), first_world, notice)
    assert first.stopped
    assert first.last == {
        "event": "stopped",
        "step": stopped_after,
        "world_size": first_world,
        "steps_run": stopped_after,
    }
    job = training_job(tmp_path)
    saved = load_checkpoint(job.checkpoint)
    assert saved is not None
    assert (saved["step"], saved["world_size"], saved["global_batch"]) == (stopped_after, first_world, 64)

    resumed = launch(job, then_world, never)

    assert resumed.done
    start = resumed.started()
    assert start["resumed"] is True
    assert (start["step"], start["first_step"], start["total_steps"]) == (stopped_after, stopped_after + 1, TOTAL)
    assert start["world_size"] == then_world
    assert (start["global_batch"], start["shares"]) == (64, rank_shares(64, then_world))
    assert start["learning_rate"] == job.settings.learning_rate  # the global batch is kept: the rate is unchanged
    assert resumed.last is not None
    assert (resumed.last["step"], resumed.last["steps_run"]) == (TOTAL, TOTAL - stopped_after)  # none redone
    checkpoints = [e["step"] for e in resumed.events if e["event"] == "checkpoint"]
    assert checkpoints == [s for s in range(stopped_after + 1, TOTAL + 1) if s % STEPS_PER_EPOCH == 0]
    for got, want in zip(final_weights(job), uninterrupted, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
