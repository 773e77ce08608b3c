"""The rules that make a data-parallel run the same run at every world size (no torch here).

A run is a sequence of optimizer steps numbered 1, 2, ... over its epochs. What a step does depends on
the step alone, never on how many workers share it:

1. **Data order.** Epoch `e` visits the training rows in the permutation drawn from `seed` and `e`
   (numpy's generator seeded with `[seed, e]`); step `k` of the epoch takes the next `global_batch`
   rows of it (the epoch's last step takes what is left).
2. **Shares.** Rank `r` of `W` takes a contiguous share of the step's rows: the first `n mod W` ranks
   take `n // W + 1` rows, the others `n // W`. When the global batch does not divide by the world
   size the shares differ by one row; a rank may get none when `W` exceeds the rows of a step.
3. **Loss.** Each rank sums its rows' losses and scales the sum by `W / n`. DistributedDataParallel
   averages the ranks' gradients (divides by `W`), so every rank applies the gradient of the mean loss
   over the step's `n` rows, whatever the shares: the step is the one a single process would take
   (PyTorch's DistributedDataParallel notes: with a summed loss the gradient is `M` times smaller on
   `M` nodes, "take this into consideration when you want to obtain a mathematically equivalent
   training process"; `torch/nn/parallel/distributed.py`).
4. **Learning rate.** Unchanged by a resize. The same notes say to treat a DDP model and a single-GPU
   model "as the same (E.g. using the same learning rate for equivalent batch size)"; the linear
   scaling rule (Goyal et al., "Accurate, Large Minibatch SGD", 2017) scales the rate with the global
   batch, and the global batch is kept across world sizes, so the rate it gives is the configured one.
5. **Resumption.** A checkpoint records the number of finished steps `s`; the resumed run starts at
   step `s + 1`, so no finished step is redone and none is skipped (torchrun's notice: "RANK is NOT
   stable ... do not hard code assumptions about WORLD_SIZE"; the checkpoint holds nothing per rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def rank_shares(rows: int, world_size: int) -> list[int]:
    """How many of a step's `rows` each rank takes: the first `rows mod world_size` ranks one more."""
    if world_size < 1:
        raise ValueError(f"world size {world_size}: a run needs at least one worker (one GPU)")
    base, extra = divmod(rows, world_size)
    return [base + 1 if rank < extra else base for rank in range(world_size)]


@dataclass(frozen=True)
class ElasticPlan:
    """How a run's work is cut into steps (rules 1 and 5), the same at every world size."""

    rows: int
    global_batch: int
    epochs: int
    seed: int

    def __post_init__(self) -> None:
        if self.global_batch < 1:
            raise ValueError(f"global batch {self.global_batch}: a step needs at least one row; use 1 or more")
        if self.epochs < 1:
            raise ValueError(f"epochs {self.epochs}: train at least one epoch")
        if self.rows < 1:
            raise ValueError("no training rows: the dataset is empty")

    @property
    def steps_per_epoch(self) -> int:
        """Steps in one pass over the rows (the last one may be short)."""
        return math.ceil(self.rows / self.global_batch)

    @property
    def total_steps(self) -> int:
        """Steps of the whole run."""
        return self.epochs * self.steps_per_epoch

    def epoch_of(self, step: int) -> int:
        """The epoch (from 1) that step `step` (from 1) belongs to."""
        return (step - 1) // self.steps_per_epoch + 1

    def ends_epoch(self, step: int) -> bool:
        """Whether `step` is its epoch's last."""
        return step % self.steps_per_epoch == 0

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The order in which epoch `epoch` visits the rows (rule 1)."""
        return np.random.default_rng([self.seed, epoch]).permutation(self.rows)

    def step_rows(self, step: int, order: np.ndarray | None = None) -> np.ndarray:
        """The rows of the global batch of `step`; `order`: its epoch's order, when already drawn."""
        order = self.epoch_order(self.epoch_of(step)) if order is None else order
        start = ((step - 1) % self.steps_per_epoch) * self.global_batch
        return order[start : start + self.global_batch]

    def rank_rows(self, rows: np.ndarray, rank: int, world_size: int) -> np.ndarray:
        """Rank `rank`'s contiguous share of a step's `rows` (rule 2)."""
        shares = rank_shares(len(rows), world_size)
        start = sum(shares[:rank])
        return rows[start : start + shares[rank]]

    @staticmethod
    def loss_scale(step_rows: int, world_size: int) -> float:
        """What a rank multiplies its summed loss by, so the averaged gradient is the step's mean (rule 3)."""
        return world_size / step_rows

    def first_step(self, finished: int) -> int:
        """The step a run resumed after `finished` finished steps starts at (rule 5)."""
        if not 0 <= finished <= self.total_steps:
            raise ValueError(
                f"the checkpoint has {finished} finished steps, outside this run's 0..{self.total_steps}: "
                "resume with the run config it was trained with, or start a new lineage"
            )
        return finished + 1
