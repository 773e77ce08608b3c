"""Elastic replay (DESIGN.md section 8): training jobs that may run between MIN and MAX times their trace
GPUs, and the work model that makes elastic and fixed replays of one trace comparable.

A job's work is its trace GPU-seconds: `duration_s` at its trace size `g`. At `n` GPUs it progresses
at `speed(n, g) = (n / g) ** SCALING_EXPONENT` trace-seconds per second: throughput grows as
`n ** SCALING_EXPONENT`, a power law fitted to one published measurement (docs/design-notes.md,
record E2): Horovod (Sergeev and Del Balso, "Horovod: fast and easy distributed deep learning in
TensorFlow", arXiv:1802.05799, 2018) measured VGG-16 at 68% of linear scaling on 128 GPUs, the least
efficient of the models it reports (Inception V3 and ResNet-101 reach about 90%). So
`128 ** a = 0.68 * 128`, `a = 1 + log2(0.68) / 7 = 0.92`: doubling a job's GPUs makes it 1.89x
faster, halving them 1.89x slower. The least efficient curve is the cautious choice: growing pays
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

HORIZON_GPUS, EFFICIENCY_THERE = 128, 0.68  # Horovod, VGG-16: 68% of linear at 128 GPUs
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
