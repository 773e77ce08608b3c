"""One rank of a data-parallel training run: the program `torchrun` starts once per GPU.

`python -m torch.distributed.run --standalone --nproc-per-node N -m xirang_platform.training.worker
--data rows.npz --checkpoint model.pt ...` (the launcher, `launch.py`, builds that command). Each rank
joins the process group (NCCL on GPUs, gloo on the CPU), reads the lineage's checkpoint if there is
one, and trains the steps after it with DistributedDataParallel, taking its share of each global batch
(`plan.py`). Rank 0 saves a checkpoint after every epoch and on a stop, writes the trained weights for
the numpy classifier when done, and prints the progress lines (`progress.py`). A checkpoint trained
with another global batch, seed or width is refused before any step (`refused`).

A stop is asked for by the launcher's stop file (the run got its preemption notice) or by the end of
the launching process (the run was killed past its grace). Rank 0 looks after every step and in the
pause between epochs, and broadcasts what it saw, so every rank stops after the same step; the
checkpoint then holds that step and the resumption starts at the next.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from xirang_platform.training.checkpoint import (
    classifier_of,
    load_checkpoint,
    resumption_problem,
    save_checkpoint,
)
from xirang_platform.training.digits import read_rows
from xirang_platform.training.plan import ElasticPlan, rank_shares
from xirang_platform.training.progress import progress_line

CLASSES = 10
STOP_POLL_S = 0.05  # how often the pause between epochs looks for a stop
REFUSED = 2  # the exit status of a worker that refuses to resume a checkpoint (its `refused` line says why)


def build_model(features: int, hidden_units: int, classes: int = CLASSES) -> nn.Sequential:
    """The MLP: one hidden layer with ReLU (`predictor.MlpClassifier` is its forward pass in numpy)."""
    return nn.Sequential(nn.Linear(features, hidden_units), nn.ReLU(), nn.Linear(hidden_units, classes))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The worker's command line (`launch.TrainingJob.worker_args` writes it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, required=True, help="training rows (.npz of x and y)")
    parser.add_argument("--checkpoint", type=Path, required=True, help="the lineage's checkpoint file")
    parser.add_argument("--model-out", type=Path, required=True, help="the trained weights, written when done")
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--global-batch", type=int, required=True, help="rows per step, over all ranks")
    parser.add_argument("--hidden-units", type=int, required=True)
    parser.add_argument("--learning-rate", type=float, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--epoch-pause-s", type=float, default=0.0, help="pause after each epoch (demos)")
    parser.add_argument("--stop-file", type=Path, required=True, help="stop after the step when it exists")
    parser.add_argument("--watch-pid", type=int, default=0, help="stop after the step when this process ends")
    return parser.parse_args(argv)


class StopWatch:
    """Whether the run was asked to stop, agreed by every rank (rank 0 looks, then broadcasts)."""

    def __init__(self, stop_file: Path, watch_pid: int, device: torch.device) -> None:
        self.stop_file = stop_file
        self.watch_pid = watch_pid
        self.flag = torch.zeros(1, dtype=torch.int32, device=device)

    def _seen(self) -> bool:
        if self.stop_file.exists():
            return True
        if self.watch_pid:
            try:
                os.kill(self.watch_pid, 0)
            except ProcessLookupError:
                return True
        return False

    def requested(self) -> bool:
        """Whether to stop now; every rank gets the same answer (one broadcast)."""
        self.flag.fill_(int(dist.get_rank() == 0 and self._seen()))
        dist.broadcast(self.flag, src=0)
        return bool(self.flag.item())

    def pause(self, seconds: float) -> bool:
        """Sleep `seconds` in short naps (the same number on every rank); True when a stop cut it short."""
        for _ in range(math.ceil(seconds / STOP_POLL_S)):
            time.sleep(STOP_POLL_S)
            if self.requested():
                return True
        return False


def _device() -> tuple[str, torch.device]:
    """The backend and this rank's device: NCCL on its own GPU when CUDA is there, gloo on the CPU."""
    if not torch.cuda.is_available():
        return "gloo", torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if local_rank >= torch.cuda.device_count():
        raise SystemExit(
            f"rank {local_rank} has no GPU: {torch.cuda.device_count()} visible (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}); start as many workers as the allocation's GPUs"
        )
    torch.cuda.set_device(local_rank)
    return "nccl", torch.device("cuda", local_rank)


class RankTrainer:
    """One rank's training: the model and optimizer resumed from the checkpoint, its steps, its stops."""

    def __init__(self, args: argparse.Namespace, backend: str, device: torch.device) -> None:
        self.args, self.backend, self.device = args, backend, device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.say = _Rank0(self.rank)
        x, y = read_rows(args.data)
        self.x, self.y = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        self.plan = ElasticPlan(rows=len(y), global_batch=args.global_batch, epochs=args.epochs, seed=args.seed)
        self.settings = {"global_batch": args.global_batch, "seed": args.seed, "hidden_units": args.hidden_units}
        torch.manual_seed(args.seed)  # every rank builds the same initial model
        self.model = build_model(x.shape[1], args.hidden_units).to(device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=args.learning_rate)
        self.epoch_loss = torch.zeros(2, dtype=torch.float64, device=device)  # summed loss, rows
        self.loss_mean: float | None = None  # the last finished epoch's mean training loss

    def resume(self) -> int | None:
        """Load the lineage's checkpoint; the steps it finished (0: none), or None when it is refused."""
        state = load_checkpoint(self.args.checkpoint)
        if state is None:
            return 0
        problem = resumption_problem(state, self.settings)
        if problem is not None:
            self.say("refused", step=state["step"], world_size=self.world, problem=problem)
            return None
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        return int(state["step"])

    def run(self, finished: int) -> None:
        """Train the steps after `finished`, stopping when asked (rule 5 of `plan.py`)."""
        plan, args = self.plan, self.args
        ddp = DistributedDataParallel(
            self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None
        )
        self.say(
            "start",
            step=finished,
            world_size=self.world,
            first_step=plan.first_step(finished),
            total_steps=plan.total_steps,
            global_batch=plan.global_batch,
            shares=rank_shares(plan.global_batch, self.world),
            learning_rate=args.learning_rate,
            backend=self.backend,
            resumed=finished > 0,
        )
        stop = StopWatch(args.stop_file, args.watch_pid, self.device)
        order: tuple[int, np.ndarray] | None = None
        for step in range(plan.first_step(finished), plan.total_steps + 1):
            epoch = plan.epoch_of(step)
            if order is None or order[0] != epoch:
                order = (epoch, plan.epoch_order(epoch))
            self.step(ddp, plan.step_rows(step, order[1]))
            if plan.ends_epoch(step):
                self.end_epoch(step)
            if step < plan.total_steps and (
                stop.requested() or (plan.ends_epoch(step) and stop.pause(args.epoch_pause_s))
            ):
                if not plan.ends_epoch(step):
                    self.checkpoint(step, "notice")
                self.say("stopped", step=step, world_size=self.world, steps_run=step - finished)
                return
        if self.rank == 0:
            classifier_of(self.model.state_dict()).save(args.model_out)
        steps_run = plan.total_steps - finished
        self.say("done", step=plan.total_steps, world_size=self.world, steps_run=steps_run, loss=self.loss_mean)

    def step(self, ddp: DistributedDataParallel, rows: np.ndarray) -> None:
        """One optimizer step over the global batch `rows`, this rank on its share (rules 2 and 3)."""
        mine = torch.from_numpy(self.plan.rank_rows(rows, self.rank, self.world)).to(self.device)
        loss = nn.functional.cross_entropy(ddp(self.x[mine]), self.y[mine], reduction="sum")
        self.optimizer.zero_grad()
        (loss * self.plan.loss_scale(len(rows), self.world)).backward()
        self.optimizer.step()
        self.epoch_loss += torch.tensor([loss.item(), len(mine)], dtype=torch.float64, device=self.device)

    def end_epoch(self, step: int) -> None:
        """The epoch's mean loss over every rank, then its checkpoint."""
        dist.all_reduce(self.epoch_loss)
        self.loss_mean = float(self.epoch_loss[0] / self.epoch_loss[1])
        self.epoch_loss.zero_()
        self.checkpoint(step, "epoch")

    def checkpoint(self, step: int, reason: str) -> None:
        """Rank 0 saves the state after `step` (`reason`: `epoch` or `notice`) and says so."""
        if self.rank == 0:
            state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
            save_checkpoint(self.args.checkpoint, {**self.settings, "step": step, "world_size": self.world, **state})
        self.say("checkpoint", step=step, world_size=self.world, epoch=self.plan.epoch_of(step), reason=reason)


class _Rank0:
    """Prints progress lines on rank 0 only (every rank knows the same facts)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __call__(self, event: str, **fields: Any) -> None:
        if self.rank == 0:
            print(progress_line(event, **fields), flush=True)


def main(argv: list[str] | None = None) -> int:
    """Join the process group `torchrun` set up, train, leave it."""
    args = parse_args(argv)
    torch.set_num_threads(1)  # one core per rank: ranks share the machine's cores
    backend, device = _device()
    dist.init_process_group(backend)
    try:
        trainer = RankTrainer(args, backend, device)
        finished = trainer.resume()
        if finished is None:
            return REFUSED
        trainer.run(finished)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
