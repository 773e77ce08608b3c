"""No `torchrun` worker outlives the run that launched it (`training/launch.py`), real processes:
killed past its grace, or failing, the run leaves its workers' checkpoint and no worker behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.waiting import wait_for
from xirang_platform.training.checkpoint import load_checkpoint
from xirang_platform.training.digits import digits_split, write_rows
from xirang_platform.training.launch import TrainingJob, TrainingSettings, run_training

PAUSE_S = 600.0  # after epoch 1 the workers pause this long unless something stops them


def paced_job(folder: Path) -> TrainingJob:
    data = digits_split()
    return TrainingJob(
        data=write_rows(folder / "rows.npz", data["x_train"], data["y_train"]),
        checkpoint=folder / "model.pt",
        settings=TrainingSettings(
            epochs=2, global_batch=64, hidden_units=16, learning_rate=0.01, seed=7, epoch_pause_s=PAUSE_S
        ),
    )


def processes_naming(path: Path) -> list[int]:
    """Pids of the live processes whose command line names `path` (the job's own checkpoint)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(path).encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def wait_until_gone(path: Path) -> None:
    """Wait until no process names `path` (the pids still running are what a failure shows)."""
    wait_for(f"every process naming {path} to end", lambda: processes_naming(path), done=lambda pids: not pids)


LAUNCHER = """
import json, sys
from pathlib import Path
from xirang_platform.training.launch import TrainingJob, TrainingSettings, run_training
job = TrainingJob(Path(sys.argv[1]), Path(sys.argv[2]), TrainingSettings(**json.loads(sys.argv[3])))
run_training(job, 2, on_line=lambda line: None, on_progress=lambda doc: print(json.dumps(doc), flush=True),
             notice=lambda: False)
"""


def test_workers_of_a_run_killed_past_its_grace_keep_their_checkpoint_and_end(tmp_path: Path) -> None:
    job = paced_job(tmp_path)
    settings = json.dumps(job.settings.__dict__)
    run = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(job.data), str(job.checkpoint), settings],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert run.stdout is not None
    events: list[dict[str, Any]] = []
    for line in run.stdout:
        events.append(json.loads(line))
        if events[-1]["event"] == "checkpoint":
            break
    assert processes_naming(job.checkpoint)  # the workers pause after epoch 1

    os.kill(run.pid, signal.SIGKILL)  # what the tick does to a run still running at the end of its grace
    run.wait()

    wait_until_gone(job.checkpoint)
    saved = load_checkpoint(job.checkpoint)
    assert saved is not None
    assert (saved["step"], saved["world_size"]) == (23, 2)


@pytest.mark.parametrize(
    "stop_wait_s",
    [
        pytest.param(30.0, id="the workers take the stop file and exit after the epoch's checkpoint"),
        pytest.param(0.0, id="given no time, torchrun is terminated and ends its workers with it"),
    ],
)
def test_a_launcher_that_fails_ends_its_workers_before_it_raises(tmp_path: Path, stop_wait_s: float) -> None:
    job = paced_job(tmp_path)

    def fail_on_checkpoint(doc: dict[str, Any]) -> None:
        if doc["event"] == "checkpoint":
            raise RuntimeError("the pool could not record the checkpoint")

    with pytest.raises(RuntimeError, match="could not record the checkpoint"):
        run_training(
            job,
            2,
            on_line=lambda _: None,
            on_progress=fail_on_checkpoint,
            notice=lambda: False,
            stop_wait_s=stop_wait_s,
        )

    assert processes_naming(job.checkpoint) == []
    saved = load_checkpoint(job.checkpoint)
    assert saved is not None
    assert saved["step"] == 23  # epoch 1's
