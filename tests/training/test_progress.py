"""The progress lines between rank 0 and the launcher (`training/progress.py`)."""

from __future__ import annotations

from typing import Any

import pytest

from xirang_platform.training.progress import describe, progress_line, read_progress

START = {
    "step": 23,
    "world_size": 3,
    "first_step": 24,
    "total_steps": 138,
    "global_batch": 64,
    "shares": [22, 21, 21],
    "learning_rate": 0.01,
    "backend": "gloo",
    "resumed": True,
}


@pytest.mark.parametrize(
    ("event", "fields", "sentence"),
    [
        pytest.param(
            "start",
            START,
            "training on 3 worker(s) (gloo): resuming after step 23, steps 24..138; global batch 64 as "
            "[22, 21, 21] per rank, learning rate 0.01",
            id="a resumption says where it starts and how the batch is shared",
        ),
        pytest.param(
            "checkpoint",
            {"step": 46, "world_size": 3, "epoch": 2, "reason": "epoch"},
            "checkpoint of step 46 saved after epoch 2 (world size 3)",
            id="an epoch's checkpoint",
        ),
        pytest.param(
            "checkpoint",
            {"step": 30, "world_size": 3, "epoch": 2, "reason": "notice"},
            "checkpoint of step 30 saved on the preemption notice (world size 3)",
            id="a checkpoint on the notice, mid-epoch",
        ),
        pytest.param(
            "stopped",
            {"step": 30, "world_size": 3, "steps_run": 7},
            "stopped on the notice after step 30; 7 step(s) run by this launch",
            id="a stop on the notice",
        ),
        pytest.param(
            "done",
            {"step": 138, "world_size": 3, "steps_run": 108, "loss": 0.1},
            "training done at step 138 (108 step(s) run here), last epoch's mean loss 0.1000",
            id="done",
        ),
        pytest.param(
            "refused",
            {"step": 23, "world_size": 1, "problem": "cannot resume"},
            "refused to resume: cannot resume",
            id="a refusal says why",
        ),
    ],
)
def test_a_progress_line_reads_back_and_reads_as_a_sentence(event: str, fields: dict[str, Any], sentence: str) -> None:
    doc = read_progress(progress_line(event, **fields))
    assert doc == {"event": event, **fields}
    assert describe(doc) == sentence


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("W1205 21:00:00 torch/distributed/run.py: a warning", id="torchrun's own line"),
        pytest.param("xirang-training {not json", id="a broken progress line"),
        pytest.param('xirang-training {"event": "lunch", "step": 1}', id="an unknown event"),
        pytest.param('xirang-training ["start"]', id="not an object"),
    ],
)
def test_other_lines_are_not_progress(line: str) -> None:
    assert read_progress(line) is None


def test_an_unknown_event_is_not_written() -> None:
    with pytest.raises(ValueError, match="unknown progress event 'lunch'") as raised:
        progress_line("lunch", step=1)
    assert "one of start, checkpoint, stopped, done, refused" in str(raised.value)
