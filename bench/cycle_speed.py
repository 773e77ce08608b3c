"""Cycle speed: one cycle over 4,000 nodes x 8 GPUs with 10,000 pending mixed requests.

Prints one JSON object: admissions per second of one full cycle (the target is >= 1,000/s on one
core), and, measured in the same run, the baseline of admitting the same requests one per cycle
(Kueue's "one head per queue per cycle" shape, kueue#14477) over the first `--baseline-requests`.
Published figures for context: Kueue about 43 workloads/s (envtest), YuniKorn 115-833 pods/s.

    .venv/bin/python bench/cycle_speed.py [--nodes 4000] [--requests 10000] [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from xirang_platform.pool.model import GpuModel, Node, Pool
from xirang_platform.scheduling.apply import apply_cycle
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.model import Request, Tier
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.scheduling.snapshot import SchedulerConfig, Snapshot

MODELS = [GpuModel("H100-SXM", 81559, 989), GpuModel("A100-80", 81920, 312)]
TENANTS = [f"t{k}" for k in range(10)]


def build_pool(nodes: int) -> Pool:
    """`nodes` 8-GPU nodes, half H100 half A100, in NVLink/leaf domains of 16 nodes."""
    return Pool(
        tuple(
            Node(f"node-{i:05d}", MODELS[(i // 16) % 2], 8, 192_000, 2_000_000, f"dom-{i // 16:04d}", unit_milli=125)
            for i in range(nodes)
        )
    )


def build_requests(count: int, seed: int) -> list[Request]:
    """A mixed queue: 20% inference replicas (fractions and whole GPUs), 30% online-training gangs,
    50% offline/batch jobs; ten tenants; seeded."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        u = rng.random()
        tenant = TENANTS[int(rng.integers(len(TENANTS)))]
        t = float(rng.integers(0, 3600))
        if u < 0.2:
            frac = int(rng.choice([250, 500, 1000]))
            r = Request(
                f"r{k:05d}",
                tenant,
                "default",
                Tier.INFERENCE,
                t,
                gpus=1,
                milli_per_gpu=frac,
                cpu_milli=4000,
                memory_mib=32_768,
                gpu_memory_mib=int(rng.choice([0, 40_000])),
            )
        elif u < 0.5:
            gpus = int(rng.choice([2, 4, 8, 16, 32]))
            r = Request(
                f"r{k:05d}",
                tenant,
                "default",
                Tier.ONLINE_TRAINING,
                t,
                gpus=gpus,
                cpu_milli=8000 * gpus,
                memory_mib=65_536 * gpus,
            )
        else:
            gpus = int(rng.choice([1, 1, 2, 4, 8]))
            tier = Tier.OFFLINE_TRAINING if rng.random() < 0.7 else Tier.BATCH_INFERENCE
            r = Request(
                f"r{k:05d}", tenant, "default", tier, t, gpus=gpus, cpu_milli=6000 * gpus, memory_mib=32_768 * gpus
            )
        out.append(r)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4000)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--baseline-requests", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    pool = build_pool(args.nodes)
    share = pool.gpu_milli // len(TENANTS)
    book = QuotaBook({t: share for t in TENANTS}, {(t, "default"): None for t in TENANTS})
    requests = build_requests(args.requests, args.seed)
    config = SchedulerConfig()
    snapshot = Snapshot.build(pool, [], book)

    started = time.perf_counter()
    result = cycle(snapshot, requests, now=3600.0, config=config)
    seconds = time.perf_counter() - started
    admitted = len(result.admits)

    # Baseline: the same queue, one admission attempt per cycle.
    state, allocations = snapshot.state.copy(), {}
    base = requests[: args.baseline_requests]
    started = time.perf_counter()
    base_admitted = 0
    for r in base:
        res = cycle(Snapshot(pool, state, allocations, book), [r], 3600.0, config)
        apply_cycle(res, state, allocations)
        base_admitted += len(res.admits)
    base_seconds = time.perf_counter() - started

    print(
        json.dumps(
            {
                "nodes": args.nodes,
                "gpus": pool.gpus,
                "pending": len(requests),
                "admitted": admitted,
                "held": len(result.holds),
                "cycle_seconds": round(seconds, 3),
                "admissions_per_s": round(admitted / seconds, 1),
                "requests_per_s": round(len(requests) / seconds, 1),
                "allocated_fraction": round(sum(a.allocation.milli for a in result.admits) / pool.gpu_milli, 4),
                "baseline_one_per_cycle": {
                    "requests": len(base),
                    "admitted": base_admitted,
                    "seconds": round(base_seconds, 3),
                    "admissions_per_s": round(base_admitted / base_seconds, 1),
                },
                "target_admissions_per_s": 1000,
                "pass": admitted / seconds >= 1000,
                "published": {"kueue_envtest_workloads_per_s": 43, "yunikorn_pods_per_s": [115, 833]},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
