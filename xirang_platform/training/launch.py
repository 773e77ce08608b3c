"""Run a training job under `torchrun`, one worker per GPU, and stop it on the run's preemption notice.

`run_training` starts `python -m torch.distributed.run --standalone --nproc-per-node N -m
xirang_platform.training.worker ...` as a child process in a session of its own (a signal meant for
the run's process, such as Dagster's interrupt that carries the notice, does not reach the workers),
passes every line the workers print to `on_line`, turns progress lines into events for `on_progress`,
and asks `notice()` between lines. When the notice comes it creates the stop file: the workers save
a checkpoint after their current step and exit. If the launching process dies (killed past its
grace), the workers see it gone and do the same. Should the caller itself fail, the workers get the
stop file and `STOP_WAIT_S` to save and exit; then `torchrun` is terminated (SIGTERM, which it passes
on to its workers, each in a session of its own, killing them `TORCHRUN_CLOSE_S` later), so no worker
outlives the run.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xirang_platform.training.progress import read_progress

POLL_S = 0.2  # how often the launcher asks for the notice while the workers are quiet
STOP_WAIT_S = 30.0  # what workers get to save and exit when the caller fails
TORCHRUN_CLOSE_S = 45.0  # torchrun's own shutdown: SIGTERM to its workers, SIGKILL 30 s later
TAIL_LINES = 20  # output lines kept for a failure's message


@dataclass(frozen=True)
class TrainingSettings:
    """How to train (the lifecycle's `TrainingConfig`); the world size is not part of it."""

    epochs: int
    global_batch: int
    hidden_units: int
    learning_rate: float
    seed: int
    epoch_pause_s: float = 0.0

    def fixed(self) -> dict[str, Any]:
        """The settings a checkpoint records and a resumption must keep (`checkpoint.FIXED`)."""
        return {"global_batch": self.global_batch, "seed": self.seed, "hidden_units": self.hidden_units}


@dataclass(frozen=True)
class TrainingJob:
    """One launch's inputs: the rows (written by `digits.write_rows`), the lineage's checkpoint, the settings."""

    data: Path
    checkpoint: Path
    settings: TrainingSettings

    @property
    def model_file(self) -> Path:
        """Where rank 0 writes the trained weights when done (`predictor.MlpClassifier.load` reads them)."""
        return self.checkpoint.with_suffix(".npz")

    def worker_args(self) -> list[str]:
        """The worker's command line for this job (`worker.parse_args` reads it)."""
        s = self.settings
        return [
            f"--data={self.data}",
            f"--checkpoint={self.checkpoint}",
            f"--model-out={self.model_file}",
            f"--epochs={s.epochs}",
            f"--global-batch={s.global_batch}",
            f"--hidden-units={s.hidden_units}",
            f"--learning-rate={s.learning_rate!r}",
            f"--seed={s.seed}",
            f"--epoch-pause-s={s.epoch_pause_s!r}",
        ]


def torchrun_command(job: TrainingJob, world_size: int, stop_file: Path, watch_pid: int) -> list[str]:
    """The `torchrun` command line that trains `job` on `world_size` workers of this host."""
    if world_size < 1:
        raise ValueError(f"world size {world_size}: a training run needs at least one worker")
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world_size}",
        "-m",
        "xirang_platform.training.worker",
        *job.worker_args(),
        f"--stop-file={stop_file}",
        f"--watch-pid={watch_pid}",
    ]


@dataclass
class TrainingOutcome:
    """How a launch ended: `torchrun`'s exit status, the progress events in order, the output's tail."""

    returncode: int
    events: list[dict[str, Any]] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)

    @property
    def last(self) -> dict[str, Any] | None:
        """The last progress event (None: the workers printed none)."""
        return self.events[-1] if self.events else None

    @property
    def step(self) -> int:
        """The finished steps when the workers ended (their last event's; 0 before any)."""
        return int(self.last["step"]) if self.last is not None else 0

    @property
    def steps_run(self) -> int:
        """Steps this launch ran (0 unless the workers stopped or finished)."""
        return int(self.last.get("steps_run", 0)) if self.last is not None else 0

    @property
    def stopped(self) -> bool:
        """Whether the workers stopped on the notice."""
        return self.returncode == 0 and self.last is not None and self.last["event"] == "stopped"

    @property
    def done(self) -> bool:
        """Whether the workers finished every step."""
        return self.returncode == 0 and self.last is not None and self.last["event"] == "done"

    @property
    def refusal(self) -> str | None:
        """Why the workers refused to resume the checkpoint, or None."""
        return next((str(doc["problem"]) for doc in self.events if doc["event"] == "refused"), None)

    def started(self) -> dict[str, Any]:
        """The `start` event (ValueError naming the output's tail when the workers never started)."""
        for doc in self.events:
            if doc["event"] == "start":
                return doc
        raise ValueError(f"the workers never started (exit {self.returncode}): {' | '.join(self.tail)}")


def run_training(
    job: TrainingJob,
    world_size: int,
    *,
    on_line: Callable[[str], None],
    on_progress: Callable[[dict[str, Any]], None],
    notice: Callable[[], bool],
    env: dict[str, str] | None = None,
    stop_wait_s: float = STOP_WAIT_S,
) -> TrainingOutcome:
    """Train `job` on `world_size` workers until they finish or stop on the notice; see the module doc."""
    environment = {**os.environ, **(env or {})}
    environment.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own default, said here so it need not warn
    environment["PYTHONUNBUFFERED"] = "1"
    with tempfile.TemporaryDirectory(prefix="xirang-torchrun-") as folder:
        stop_file = Path(folder) / "stop"
        command = torchrun_command(job, world_size, stop_file, os.getpid())
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=environment,
            start_new_session=True,
        )
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=_pump, args=(process, lines), daemon=True, name="torchrun-output")
        reader.start()
        outcome = TrainingOutcome(returncode=0)
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        try:
            while True:
                try:
                    line = lines.get(timeout=POLL_S)
                except queue.Empty:
                    line = ""
                if line is None:
                    break
                if line:
                    doc = read_progress(line)
                    if doc is None:
                        tail.append(line)
                        on_line(line)
                    else:
                        outcome.events.append(doc)
                        on_progress(doc)
                if not stop_file.exists() and notice():
                    stop_file.touch()
        finally:
            if process.poll() is None:
                stop_file.touch()
                _end(process, stop_wait_s)
        outcome.returncode = process.wait()
        outcome.tail = list(tail)
        return outcome


def _pump(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    """Move the workers' output to `lines`, one line at a time; None once it ends."""
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def _end(process: subprocess.Popen[str], stop_wait_s: float) -> None:
    """Give the workers `stop_wait_s` to stop on the stop file, then terminate `torchrun`, which ends them.

    Not a SIGKILL to `torchrun`'s process group: its workers run in sessions of their own and would
    outlive it."""
    try:
        process.wait(timeout=stop_wait_s)
        return
    except subprocess.TimeoutExpired:
        process.terminate()
    try:
        process.wait(timeout=TORCHRUN_CLOSE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
