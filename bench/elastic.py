"""Elastic training against fixed sizes on real traces: the same jobs, load and GPUs, one run.

Replays the ITP training traces and the SD serving inference load of `bench/scenarios/itp_sd_g2.yaml`
(built as `bench/unified_vs_siloed.py` builds its replays, unified policy) on pools of 192 and 256
GPUs, once with every training job at its trace size (the baseline, measured in the same run) and
once elastic: each training job may run between 0.5x and 2x its trace GPUs (`--elastic 0.5:2`), a
resize stops it for 30 s (`--resize-cost 30`), its work conserved at the stated scaling curve
(`simulate/elastic.py`). Prints one JSON object: per size and mode mean JCT, mean queueing (and
first wait), utilization, inference p99 wait, lost work, resizes; and the targets evaluated.

    .venv/bin/python bench/elastic.py                     # 24 and 32 nodes of 8 GPUs
    .venv/bin/python bench/elastic.py --sizes 24 --range 0.5:2 --resize-cost 30

Targets (issue 30): elastic mean JCT at least 1.3x lower than fixed, utilization no lower, inference
p99 wait within 30 s of fixed. A markdown table goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from unified_vs_siloed import load_scenario, sub_pool, training_book  # noqa: E402

from xirang_platform.simulate.elastic import SCALING_EXPONENT, elastic_jobs, parse_range  # noqa: E402
from xirang_platform.simulate.inference_replay import inference_partition, policy_metrics, run_policy  # noqa: E402

JCT_RATIO, P99_SLACK_S = 1.3, 30.0
FIGURES = (
    "training_jct_mean_s",
    "training_queue_mean_s",
    "training_wait_mean_s",
    "utilization",
    "inference_wait_p99_s",
    "lost_gpu_seconds",
    "resize_lost_gpu_seconds",
    "preemptions",
    "resizes",
    "grows",
    "shrinks",
    "training_unfinished",
)


def run_mode(sc: dict, nodes: int, jobs: list, resize_cost: float) -> dict:
    """One replay (unified policy) of `jobs` on the first `nodes` nodes: its figures and wall time."""
    pool = sub_pool(sc["pool"], nodes)
    _, training = inference_partition(pool, sc["setup"])
    book = training_book(sc["doc"], training.gpu_milli)
    options = replace(sc["options"], resize_cost_s=resize_cost)
    started = time.perf_counter()
    run = policy_metrics(run_policy("unified", pool, book, jobs, sc["setup"], sc["config"], options))
    out = {k: run.get(k) for k in FIGURES}
    out.update(nodes=nodes, gpus=pool.gpus, wall_s=round(time.perf_counter() - started, 1))
    return out


def evaluate(fixed: dict, elastic: dict) -> dict:
    """The issue's targets for one size, with the figures they compare."""
    jct = fixed["training_jct_mean_s"] / elastic["training_jct_mean_s"] if elastic["training_jct_mean_s"] else None
    p99_added = (elastic["inference_wait_p99_s"] or 0.0) - (fixed["inference_wait_p99_s"] or 0.0)
    return {
        "jct_ratio": jct,
        "jct_ok": jct is not None and jct >= JCT_RATIO,
        "queue_ratio": (
            fixed["training_queue_mean_s"] / elastic["training_queue_mean_s"]
            if elastic["training_queue_mean_s"]
            else None
        ),
        "utilization_ok": elastic["utilization"] >= fixed["utilization"],
        "inference_p99_added_s": p99_added,
        "p99_ok": p99_added <= P99_SLACK_S,
    }


def table(rows: list[dict]) -> str:
    cols = [("gpus", "GPUs"), ("mode", "mode")] + [(k, k) for k in FIGURES]
    out = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for k, _ in cols:
            v = r.get(k)
            cells.append("-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    """Run both modes at each size and print the JSON object (the table on stderr)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", type=Path, default=REPO / "bench/scenarios/itp_sd_g2.yaml")
    ap.add_argument("--sizes", default="24,32", help="comma-separated node counts (8 GPUs each) [default: 24,32]")
    ap.add_argument("--range", default="0.5:2", help="MIN:MAX factors of the trace GPUs [default: 0.5:2]")
    ap.add_argument("--resize-cost", type=float, default=30.0, help="seconds a resize stops a job [default: 30]")
    args = ap.parse_args()
    sc = load_scenario(args.scenario, None)
    low, high = parse_range(args.range)
    elastic = elastic_jobs(sc["jobs"], low, high)
    rows, per_size = [], []
    for nodes in (int(x) for x in args.sizes.split(",")):
        fixed_row = {"mode": "fixed", **run_mode(sc, nodes, sc["jobs"], 0.0)}
        elastic_row = {"mode": "elastic", **run_mode(sc, nodes, elastic, args.resize_cost)}
        rows += [fixed_row, elastic_row]
        per_size.append({"nodes": nodes, "gpus": fixed_row["gpus"], **evaluate(fixed_row, elastic_row)})
    out = {
        "scenario": str(args.scenario.relative_to(REPO) if args.scenario.is_relative_to(REPO) else args.scenario),
        "training_jobs": len(sc["jobs"]),
        "elastic_range": [low, high],
        "resize_cost_s": args.resize_cost,
        "scaling_exponent": SCALING_EXPONENT,
        "elastic_grow_idle_s": sc["config"].elastic_grow_idle_s,
        "checkpoint_s": sc["options"].checkpoint_interval_s,
        "rows": rows,
        "targets": per_size,
        "all_met": all(c["jct_ok"] and c["utilization_ok"] and c["p99_ok"] for c in per_size),
    }
    print(table(rows), file=sys.stderr)
    print(json.dumps(out, sort_keys=True, default=float))


if __name__ == "__main__":
    main()
