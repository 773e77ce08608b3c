"""Replay metrics, computed from the event log alone (one source of truth), and time series for plots.

Definitions (the `--json` object of DESIGN.md section 8, plus a few extras):
- `utilization`: allocated GPU-seconds / capacity GPU-seconds over the span (first to last event).
- wait: from a job's submit to its first admit (queueing delay; time spent requeued after a
  preemption is not wait, it shows in the JCT). Only admitted jobs have a wait.
- `inference_wait_p99_s`: 99th percentile (numpy's linear interpolation) of inference waits.
- `training_wait_mean_s`, `training_jct_mean_s`: over online- and offline-training jobs; JCT is
  submit to finish, over finished jobs.
- `preemptions`, `lost_gpu_seconds` (summed from the preempt events), `jobs_finished`,
  `jobs_rejected`, `jobs_unfinished` (submitted, neither finished nor rejected), `returns`.
- `tiers`: per tier, submitted / finished / rejected / preempted counts and mean wait.
- Elastic replay (DESIGN.md section 8): `resizes`, `grows`, `shrinks` (resize events), and
  `lost_gpu_seconds` counts the GPU-seconds a resize's restart held idle (`resize_lost_gpu_seconds`);
  `training_queue_mean_s`: over finished training jobs, all the time each spent waiting: submit to
  first admit plus every preempt to the next admit (queueing, requeues included).
A figure without any job to average over is null.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.model import Tier
from xirang_platform.simulate.events import Event

TRAINING = (Tier.ONLINE_TRAINING.value, Tier.OFFLINE_TRAINING.value)


@dataclass(frozen=True)
class JobTimes:
    """When one job was submitted, first admitted and finished (None when it never was)."""

    job: str
    tier: str
    submit: float
    first_admit: float | None
    finish: float | None
    rejected: bool
    preemptions: int

    @property
    def wait(self) -> float | None:
        """Submit to first admit."""
        return None if self.first_admit is None else self.first_admit - self.submit

    @property
    def jct(self) -> float | None:
        """Submit to finish."""
        return None if self.finish is None else self.finish - self.submit


def job_times(events: Iterable[Event]) -> list[JobTimes]:
    """Per job, its submit, first admit and finish times, in submit order."""
    submit: dict[str, tuple[float, str]] = {}
    admit: dict[str, float] = {}
    finish: dict[str, float] = {}
    rejected: set[str] = set()
    preempted: dict[str, int] = defaultdict(int)
    for e in events:
        kind, job = e["event"], e["job"]
        if kind == "submit":
            submit[job] = (e["t"], e["tier"])
        elif kind == "admit":
            admit.setdefault(job, e["t"])
        elif kind == "finish":
            finish[job] = e["t"]
        elif kind == "reject":
            rejected.add(job)
        elif kind == "preempt":
            preempted[job] += 1
    return [
        JobTimes(job, tier, t, admit.get(job), finish.get(job), job in rejected, preempted[job])
        for job, (t, tier) in submit.items()
    ]


def allocated_series(events: Iterable[Event]) -> tuple[np.ndarray, np.ndarray]:
    """(times, allocated milli from each time on): a step function over the log."""
    held: dict[str, int] = {}
    times: list[float] = []
    level: list[int] = []
    now = 0
    for e in events:
        kind = e["event"]
        if kind in ("admit", "resize"):
            now -= held.get(e["job"], 0) if kind == "resize" else 0
            held[e["job"]] = sum(int(s["milli"]) for s in e["alloc"])
            now += held[e["job"]]
        elif kind in ("finish", "preempt"):
            now -= held.pop(e["job"], 0)
        else:
            continue
        _record(times, level, e["t"], now)
    return np.asarray(times, dtype=float), np.asarray(level, dtype=np.int64)


def queue_series(events: Iterable[Event]) -> tuple[np.ndarray, np.ndarray]:
    """(times, number of waiting requests from each time on)."""
    times: list[float] = []
    level: list[int] = []
    now = 0
    step = {"submit": 1, "preempt": 1, "admit": -1, "reject": -1}
    for e in events:
        d = step.get(e["event"])
        if d is None:
            continue
        now += d
        _record(times, level, e["t"], now)
    return np.asarray(times, dtype=float), np.asarray(level, dtype=np.int64)


def _record(times: list[float], level: list[int], t: float, value: int) -> None:
    """Append a step at `t`, or overwrite the last one when it is at the same instant."""
    if times and times[-1] == t:
        level[-1] = value
    else:
        times.append(t)
        level.append(value)


def gpu_seconds(times: np.ndarray, milli: np.ndarray, end: float) -> float:
    """The area under a step function of allocated milli, in GPU-seconds, up to `end`."""
    if len(times) == 0:
        return 0.0
    widths = np.diff(np.append(times, end))
    return float((widths * milli).sum()) / MILLI_PER_GPU


def compute_metrics(events: Sequence[Event], capacity_gpus: float) -> dict:
    """The `--json` metrics object of a replay, from its event log and the pool's GPU count."""
    if not events:
        start = end = 0.0
    else:
        start, end = float(events[0]["t"]), float(events[-1]["t"])
    span = end - start
    times, milli = allocated_series(events)
    used = gpu_seconds(times, milli, end)
    jobs = job_times(events)
    inference_waits = [j.wait for j in jobs if j.tier == Tier.INFERENCE.value and j.wait is not None]
    training = [j for j in jobs if j.tier in TRAINING]
    preempts = [e for e in events if e["event"] == "preempt"]
    resizes = [e for e in events if e["event"] == "resize"]
    resize_lost = float(sum(e.get("lost_gpu_s", 0.0) for e in resizes))
    tiers = {}
    for tier in sorted({j.tier for j in jobs}):
        mine = [j for j in jobs if j.tier == tier]
        tiers[tier] = {
            "submitted": len(mine),
            "finished": sum(j.finish is not None for j in mine),
            "rejected": sum(j.rejected for j in mine),
            "preempted": sum(j.preemptions for j in mine),
            "wait_mean_s": _mean([j.wait for j in mine if j.wait is not None]),
        }
    return {
        "utilization": used / (capacity_gpus * span) if capacity_gpus and span > 0 else 0.0,
        "inference_wait_p99_s": float(np.percentile(inference_waits, 99)) if inference_waits else None,
        "training_wait_mean_s": _mean([j.wait for j in training if j.wait is not None]),
        "training_jct_mean_s": _mean([j.jct for j in training if j.jct is not None]),
        "preemptions": len(preempts),
        "lost_gpu_seconds": float(sum(e.get("lost_gpu_s", 0.0) for e in preempts)) + resize_lost,
        "resize_lost_gpu_seconds": resize_lost,
        "resizes": len(resizes),
        "grows": sum(e["kind"] == "grow" for e in resizes),
        "shrinks": sum(e["kind"] == "shrink" for e in resizes),
        "training_queue_mean_s": _mean(list(training_queueing(events).values())),
        "jobs_finished": sum(j.finish is not None for j in jobs),
        "jobs_rejected": sum(j.rejected for j in jobs),
        "jobs_unfinished": sum(j.finish is None and not j.rejected for j in jobs),
        "jobs_submitted": len(jobs),
        "returns": sum(e["event"] == "return" for e in events),
        "span_s": span,
        "allocated_gpu_seconds": used,
        "capacity_gpus": capacity_gpus,
        "tiers": tiers,
    }


def training_queueing(events: Iterable[Event]) -> dict[str, float]:
    """Per finished training job, the seconds it spent waiting: submit to first admit, plus each
    preempt to the next admit."""
    since: dict[str, float] = {}
    waited: dict[str, float] = {}
    done: set[str] = set()
    for e in events:
        kind, job = e["event"], e["job"]
        if kind == "submit" and e["tier"] in TRAINING:
            since[job], waited[job] = e["t"], 0.0
        elif job not in waited:
            continue
        elif kind == "admit" and job in since:
            waited[job] += e["t"] - since.pop(job)
        elif kind == "preempt":
            since[job] = e["t"]
        elif kind == "finish":
            done.add(job)
    return {job: w for job, w in waited.items() if job in done}


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None
