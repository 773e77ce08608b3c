"""Data-parallel training that adapts to the world size it is given (DESIGN.md section 11; issue 30).

No Dagster here. The lifecycle's `trained_model` asset (`dagster_defs/assets/distributed_training.py`) launches
`torchrun` with one worker process per GPU of its allocation; the workers train a small MLP with
`torch.distributed` (gloo on CPU, NCCL on GPUs), checkpoint with `torch.save`, and resume from the
lineage's checkpoint at whatever world size the restart gets.

- `plan.py`: the rules that make a run independent of its world size (no torch): the data order per
  epoch, each rank's share of a global batch, the learning rate, the step numbering.
- `worker.py`: the `torchrun` entry point, one process per rank.
- `checkpoint.py`: what a checkpoint holds, saved and read with `torch.save` / `torch.load`.
- `launch.py`: runs `torchrun` as a child process; tells it to stop on the run's preemption notice.
- `progress.py`: the progress lines rank 0 prints and the launcher reads back.
- `predictor.py`: the trained weights as a numpy classifier, which the serving replicas load without torch.
- `digits.py`: the dataset (scikit-learn's bundled handwritten digits).
"""
