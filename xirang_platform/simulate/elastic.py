"""Elastic replay (DESIGN.md section 8): training jobs that may run between MIN and MAX times their trace
GPUs, and the work model that makes elastic and fixed replays of one trace comparable.

A job's work is its trace GPU-seconds: `duration_s` at its trace size `g`. At `n` GPUs it progresses
at `speed(n, g) = (n / g) ** SCALING_EXPONENT` trace-seconds per second: throughput grows as
`n ** SCALING_EXPONENT`, a power law through one published measurement (docs/design-notes.md,
record F7): Horovod's benchmark (the Horovod repository's `docs/benchmarks`, and Sergeev and Del
Balso, arXiv:1802.05799, 2018), 128 servers of 4 Pascal GPUs (512 GPUs) on 25 Gbit/s RoCE, reached 68%
of linear scaling on VGG-16, the least efficient of its models (Inception V3 and ResNet-101 reach 90%).
So `512 ** a = 0.68 * 512`, `a = 1 + log2(0.68) / 9 = 0.938`: doubling a job's GPUs makes it 1.92x
faster, halving them 1.92x slower. The least efficient curve is the cautious choice: growing pays
least under it.

A resize stops the job for `resize_cost_s` (its checkpoint and restart at the new size, the
`--resize-cost`): it holds its new units and makes no progress meanwhile (the event's `lost_gpu_s`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from xirang_platform.scheduling.model import GpuRange, Tier
from xirang_platform.simulate.traces import TraceJob

HORIZON_GPUS, EFFICIENCY_THERE = 512, 0.68  # Horovod, VGG-16: 68% of linear at 512 GPUs
SCALING_EXPONENT = 1 + math.log2(EFFICIENCY_THERE) / math.log2(HORIZON_GPUS)
TRAINING = (Tier.ONLINE_TRAINING, Tier.OFFLINE_TRAINING)


def speed(gpus: int, trace_gpus: int, exponent: float = SCALING_EXPONENT) -> float:
    """Trace-seconds of work done per second at `gpus` GPUs by a job traced at `trace_gpus`."""
    if gpus == trace_gpus:
        return 1.0
    return (gpus / trace_gpus) ** exponent


def parse_range(text: str) -> tuple[float, float]:
    """`MIN:MAX` of `--elastic` as two factors, 0 < MIN <= 1 <= MAX; a ValueError says what to write."""
    parts = text.split(":")
    try:
        low, high = (float(p) for p in parts) if len(parts) == 2 else (math.nan, math.nan)
    except ValueError:
        low = high = math.nan
    if not (math.isfinite(low) and math.isfinite(high)) or not 0 < low <= 1 <= high:
        raise ValueError(
            f"--elastic {text!r}: give MIN:MAX as two factors of a job's trace GPUs with 0 < MIN <= 1 <= MAX, "
            "e.g. 0.5:2"
        )
    return low, high


def elastic_jobs(jobs: Iterable[TraceJob], low: float, high: float) -> list[TraceJob]:
    """`jobs` with every training job of whole GPUs made elastic: between `low` and `high` times its
    trace GPUs (rounded to whole GPUs, at least 1), asking its largest size; its work stays its trace's."""
    out = []
    for job in jobs:
        r = job.request
        if r.tier not in TRAINING or r.gpus < 1 or not r.whole_gpus:
            out.append(job)
            continue
        small, large = max(1, round(low * r.gpus)), max(1, round(high * r.gpus))
        elastic = GpuRange(small, max(small, large))
        request = replace(
            r,
            gpus=elastic.max,
            cpu_milli=r.cpu_milli * elastic.max // r.gpus,
            memory_mib=r.memory_mib * elastic.max // r.gpus,
            elastic=elastic,
        )
        out.append(replace(job, request=request, trace_gpus=r.gpus))
    return out
