"""Metrics and time series of a policy run with autoscaled inference (unified or siloed).

The replay's `compute_metrics` (whole log), with these on top or instead, over a fixed measurement window [0, horizon]
that is the same for both policies (the span of the inference load; jobs still running after it
count only up to it):
- `utilization`: allocated GPU-seconds in the window / (pool GPUs x window);
- `training_wait_mean_s` / `_p95_s`, `training_jct_mean_s` / `_p95_s`: over training jobs (JCT over
  finished ones; the replay runs until every training job has finished, so all have one unless the
  pool can never hold them);
- `inference_wait_p99_s`: submit to admit of replicas; `inference_unserved`: the share of the load
  (QPS-seconds) above what the running replicas serve at full load, so a replica that waits shows as
  load not served;
- `lost_gpu_seconds` and `lost_fraction` (of the GPU-seconds training held), `preemptions`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.model import Tier
from xirang_platform.simulate.events import Event
from xirang_platform.simulate.metrics import TRAINING, compute_metrics, gpu_seconds, job_times

INFERENCE = Tier.INFERENCE.value


def tier_series(events: Iterable[Event]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per tier, (times, allocated milli from each time on): step functions over the log."""
    tier_of: dict[str, str] = {}
    held: dict[str, int] = {}
    level: dict[str, int] = defaultdict(int)
    out: dict[str, tuple[list[float], list[int]]] = defaultdict(lambda: ([], []))
    for e in events:
        kind, job = e["event"], e["job"]
        if kind == "submit":
            tier_of[job] = e["tier"]
            continue
        if kind in ("admit", "resize"):  # a resize replaces the run's allocation
            before = held.get(job, 0) if kind == "resize" else 0
            held[job] = sum(int(s["milli"]) for s in e["alloc"])
            delta = held[job] - before
        elif kind in ("finish", "preempt"):
            delta = -held.pop(job, 0)
        else:
            continue
        tier = tier_of[job]
        level[tier] += delta
        times, values = out[tier]
        if times and times[-1] == e["t"]:
            values[-1] = level[tier]
        else:
            times.append(e["t"])
            values.append(level[tier])
    return {t: (np.asarray(v[0], dtype=float), np.asarray(v[1], dtype=np.int64)) for t, v in sorted(out.items())}


def step_at(times: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The step function (times, values) sampled at `grid` (0 before its first step)."""
    if len(times) == 0:
        return np.zeros(len(grid))
    i = np.searchsorted(times, grid, side="right") - 1
    return np.where(i >= 0, values[np.clip(i, 0, None)], 0)


def clipped_gpu_seconds(times: np.ndarray, milli: np.ndarray, horizon: float) -> float:
    """GPU-seconds under a step function of milli from its start to `horizon`."""
    keep = times < horizon
    return gpu_seconds(times[keep], milli[keep], horizon)


def waiting_training_series(events: Iterable[Event]) -> tuple[np.ndarray, np.ndarray]:
    """(times, training requests waiting from each time on)."""
    tier_of: dict[str, str] = {}
    times: list[float] = []
    level: list[int] = []
    now = 0
    step = {"submit": 1, "preempt": 1, "admit": -1, "reject": -1}
    for e in events:
        if e["event"] == "submit":
            tier_of[e["job"]] = e["tier"]
        d = step.get(e["event"])
        if d is None or tier_of.get(e["job"]) not in TRAINING:
            continue
        now += d
        if times and times[-1] == e["t"]:
            level[-1] = now
        else:
            times.append(e["t"])
            level.append(now)
    return np.asarray(times, dtype=float), np.asarray(level, dtype=np.int64)


def run_metrics(
    events: Sequence[Event],
    capacity_gpus: float,
    horizon: float,
    load_times: np.ndarray,
    load_qps: np.ndarray,
    replica_qps: float,
    replica_milli: int,
) -> dict:
    """The metrics of one policy run (module docstring); `load_*` is the inference load on a grid."""
    base = compute_metrics(events, capacity_gpus)
    series = tier_series(events)
    allocated = sum(clipped_gpu_seconds(t, m, horizon) for t, m in series.values())
    training_held = sum(
        gpu_seconds(t, m, float(events[-1]["t"])) for tier, (t, m) in series.items() if tier in TRAINING
    )
    jobs = [j for j in job_times(events) if j.tier in TRAINING]
    waits = [j.wait for j in jobs if j.wait is not None]
    jcts = [j.jct for j in jobs if j.jct is not None]
    replicas = step_at(*series.get(INFERENCE, (np.array([]), np.array([]))), load_times) / replica_milli
    qps = np.nan_to_num(load_qps)
    unserved = np.clip(qps - replicas * replica_qps, 0, None).sum()
    out = {
        "utilization": allocated / (capacity_gpus * horizon) if horizon > 0 else 0.0,
        "inference_wait_p99_s": base["inference_wait_p99_s"],
        "inference_unserved": float(unserved / qps.sum()) if qps.sum() > 0 else 0.0,
        "training_wait_mean_s": _stat(waits, np.mean),
        "training_wait_p95_s": _stat(waits, lambda v: np.percentile(v, 95)),
        "training_jct_mean_s": _stat(jcts, np.mean),
        "training_jct_p95_s": _stat(jcts, lambda v: np.percentile(v, 95)),
        "training_jobs": len(jobs),
        "training_unfinished": sum(j.jct is None for j in jobs),
        "preemptions": base["preemptions"],
        "lost_gpu_seconds": base["lost_gpu_seconds"],
        "training_gpu_seconds": training_held,
        "lost_fraction": base["lost_gpu_seconds"] / training_held if training_held else 0.0,
        "returns": base["returns"],
        "capacity_gpus": capacity_gpus,
        "horizon_s": horizon,
    }
    return {**base, **out}


def _stat(values: list[float], f) -> float | None:
    return float(f(np.asarray(values))) if values else None


def milli_to_gpus(milli: np.ndarray) -> np.ndarray:
    """Milli-GPU to GPUs."""
    return milli / MILLI_PER_GPU
