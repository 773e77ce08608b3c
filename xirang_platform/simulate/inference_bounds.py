"""What no scheduler could beat on a trace: a fluid schedule of the training jobs beside inference.

A fluid schedule drops every placement rule: a job may run on any fraction of its GPUs, at once, on
whatever capacity inference leaves (inference is served first, as the autoscaler's replicas, which
both policies share), with no gang, domain, quota, preemption or lost work. Run in steps of `step_s`
(a job starts at the first step after its submit, so it is a few seconds pessimistic per job, far
below what it bounds):
- `order="longest"` serves the jobs with the most work left first: of all schedules it keeps the most
  jobs running when capacity frees up, so the GPU-seconds it does within a window bound the
  utilization any scheduler reaches there (`fluid_util`);
- `order="shortest"` serves the jobs nearest to finishing first (shortest remaining time), the
  classic schedule for a low mean completion time: its mean JCT says how much of a JCT ratio is
  left to win (an estimate, not a proof: with per-job rate limits it is not always optimal).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from xirang_platform.scheduling.replica_scaling import ScalerMemory, ServiceSpec, decide
from xirang_platform.simulate.traces import TraceJob


@dataclass(frozen=True)
class FluidRun:
    """A fluid schedule: GPU-seconds done within the window, and each job's finish (NaN if never)."""

    gpu_seconds: float
    finish: np.ndarray


def fluid_schedule(
    jobs: list[TraceJob], capacity: Callable[[int], float], steps: int, step_s: float, order: str
) -> FluidRun:
    """Run `jobs` fluidly for `steps` steps of `step_s` on `capacity(k)` GPUs at step k, in `order`
    ("longest" or "shortest" remaining work first); GPU-seconds are counted over the whole run."""
    if order not in ("longest", "shortest"):
        raise ValueError(f"order must be 'longest' or 'shortest', got {order!r}")
    submit = np.array([j.request.submit_time for j in jobs], dtype=float)
    gpus = np.array([j.request.gpus for j in jobs], dtype=float)
    left = np.array([j.duration_s for j in jobs], dtype=float) * gpus
    finish = np.full(len(jobs), np.nan)
    done = 0.0
    for k in range(steps):
        t = k * step_s
        alive = np.flatnonzero((submit <= t) & (left > 0))
        if not len(alive):
            continue
        # Ties broken by index: the order is total and deterministic.
        key = left[alive] / gpus[alive] if order == "shortest" else -left[alive]
        room = capacity(k)
        for j in alive[np.lexsort((alive, key))]:
            if room <= 0:
                break
            rate = min(gpus[j], room, left[j] / step_s)
            left[j] -= rate * step_s
            room -= rate
            done += rate * step_s
            if left[j] <= 1e-9:
                finish[j] = t + step_s
    return FluidRun(done, finish)


def replica_series(
    spec: ServiceSpec, load_at: Callable[[float], float | None], times: np.ndarray, cap: int
) -> np.ndarray:
    """The replicas the autoscaling policy holds at each of `times` (ticks in order), at most `cap`."""
    memory, current, out = ScalerMemory(), 0, []
    for t in times:
        d = decide(spec, memory, current, load_at(float(t)), float(t), cap)
        memory, current = d.memory, d.target
        out.append(current)
    return np.array(out, dtype=float)


def fluid_util(
    jobs: list[TraceJob], training_gpus: np.ndarray, inference_gpus: np.ndarray, capacity_gpus: float, step_s: float
) -> float:
    """The utilization bound of a window of `len(training_gpus)` steps: inference's GPUs plus the
    fluid longest-first training work on `training_gpus[k]` (capacity left to training at step k)."""
    run = fluid_schedule(jobs, lambda k: float(training_gpus[k]), len(training_gpus), step_s, "longest")
    span = len(training_gpus) * step_s
    return float((run.gpu_seconds + float(inference_gpus.sum()) * step_s) / (capacity_gpus * span))


def fluid_jct_mean(
    jobs: list[TraceJob], training_gpus: np.ndarray, after_gpus: float, step_s: float, tail_steps: int
) -> float | None:
    """Mean JCT of the fluid shortest-first schedule: `training_gpus[k]` in the window, `after_gpus`
    for `tail_steps` more steps after it (None if some job is still unfinished then)."""
    window = len(training_gpus)
    run = fluid_schedule(
        jobs,
        lambda k: float(training_gpus[k]) if k < window else after_gpus,
        window + tail_steps,
        step_s,
        "shortest",
    )
    if np.isnan(run.finish).any():
        return None
    submit = np.array([j.request.submit_time for j in jobs], dtype=float)
    return float(np.mean(run.finish - submit))
