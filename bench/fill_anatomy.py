"""Where a cold fill's time goes (issue 9): the figures `docs/design-notes.md` quotes, with their command.

One cycle over `--nodes` x 8 GPUs from empty with 2.5x as many pending requests (`cycle_speed.py`'s
pool and queue, same seed), in this process, CPU seconds. Prints one JSON object:
- `cycle_seconds`: the cold cycle (a fresh scheduler config: an empty score memo);
- `p0_warm_seconds`: the P0 requests alone, again with the config of a first such cycle (the memo
  already knows every content: the admission path without scoring new contents);
- `scored`: (shape, content) pairs the default scorer evaluated, its node contents keyed without
  their GPUs' order (`ContentMemo.gpu_order_free`, the default) and with it (the baseline, in the
  same run), with the decision digests of both (equal: the same placements);
- `evaluate_us`: microseconds per `Xirang._evaluate` call in the cold cycle, GPU shares and whole GPUs;
- `collector_ms`: the cycle collector's passes during the cold cycle (the one after the admission
  loop walks what the loop made);
- `objects_left`: the objects the cycle made that the collector tracks, by type (the largest six).

    .venv/bin/python bench/fill_anatomy.py [--nodes 4000] [--seed 7]
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections import Counter

from cycle_speed import book_for, build_pool, build_requests, decisions_digest

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.model import Tier
from xirang_platform.scheduling.scorers import CycleFittedXirang, Xirang
from xirang_platform.scheduling.snapshot import SchedulerConfig, Snapshot

NOW = 3600.0


def timed_evaluate(calls: dict[str, list[float]]):
    """`Xirang._evaluate`, timing each call into `calls` by kind of shape (share or whole)."""
    evaluate = Xirang._evaluate

    def timed(self, cpu, left, access, req_cpu, need, gpus):
        started = time.process_time()
        try:
            return evaluate(self, cpu, left, access, req_cpu, need, gpus)
        finally:
            kind = "share" if gpus == 1 and need < MILLI_PER_GPU else "whole"
            calls[kind].append(time.process_time() - started)

    return evaluate, timed


def fresh_config(gpu_order_free: bool = True) -> SchedulerConfig:
    """Default settings with a scorer of its own (an empty memo), node contents keyed as asked."""
    scorer = CycleFittedXirang()
    scorer.unfitted.memo.gpu_order_free = gpu_order_free  # the bench's queue fits no workload: the generic scorer
    return SchedulerConfig(scorer=scorer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    pool, pending = build_pool(args.nodes), build_requests(round(args.nodes * 2.5), args.seed)
    book = book_for(pool)

    def run(requests, config, watch=None):
        """One cycle over `requests` from empty, and its CPU seconds; `watch`: a collector callback
        for its duration."""
        snapshot = Snapshot.build(pool, [], book)
        gc.collect()
        if watch is not None:
            gc.callbacks.append(watch)
        started = time.process_time()
        try:
            result = cycle(snapshot, requests, NOW, config)
            return result, time.process_time() - started
        finally:
            if watch is not None:
                gc.callbacks.remove(watch)

    calls: dict[str, list[float]] = {"share": [], "whole": []}
    passes: list[float] = []
    began: list[float] = []

    def collector(phase: str, info: dict) -> None:
        if phase == "start":
            began.append(time.perf_counter())
        else:
            passes.append(round((time.perf_counter() - began.pop()) * 1000, 2))

    gc.collect()
    tracked = Counter(type(o).__name__ for o in gc.get_objects())
    result, seconds = run(pending, fresh_config(), collector)
    left = Counter(type(o).__name__ for o in gc.get_objects()) - tracked

    evaluate, timed = timed_evaluate(calls)
    Xirang._evaluate = timed  # type: ignore[method-assign]
    try:
        keyed_free, _ = run(pending, fresh_config())
        scored_free = sum(len(v) for v in calls.values())
        per_call = {kind: round(sum(v) / len(v) * 1e6, 1) if v else None for kind, v in calls.items()}
        calls["share"], calls["whole"] = [], []
        keyed_ordered, _ = run(pending, fresh_config(gpu_order_free=False))
        scored_ordered = sum(len(v) for v in calls.values())
    finally:
        Xirang._evaluate = evaluate  # type: ignore[method-assign]

    p0 = [r for r in pending if r.tier is Tier.INFERENCE]
    warm = fresh_config()
    run(p0, warm)
    _, p0_warm = run(p0, warm)
    print(
        json.dumps(
            {
                "bench": "fill_anatomy",
                "nodes": args.nodes,
                "pending": len(pending),
                "admitted": len(result.admits),
                "cycle_seconds": round(seconds, 3),
                "p0_requests": len(p0),
                "p0_warm_seconds": round(p0_warm, 3),
                "scored": {
                    "gpu_order_free": scored_free,
                    "baseline_gpu_order_kept": scored_ordered,
                    "same_decisions": decisions_digest(keyed_free) == decisions_digest(keyed_ordered),
                },
                "evaluate_us": per_call,
                "collector_ms": passes,
                "objects_left": dict(left.most_common(6)),
                "objects_left_total": sum(left.values()),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
