"""Unified against siloed on real traces: the same jobs, the same load, the same GPUs, one run.

Replays ITP training jobs (one cluster as online training, P1; another as offline training, P2) and the
SD serving inference load (autoscaled P0 replicas) on pools of several sizes, under both policies
(`simulate/inference_replay.py`), and prints one JSON object: per size and policy the figures, and the issue's
targets evaluated (siloed is the baseline, measured in the same run).

    .venv/bin/python bench/unified_vs_siloed.py                       # bench/scenarios/itp_sd_g2.yaml
    .venv/bin/python bench/unified_vs_siloed.py --scenario FILE --sizes 24,40 --checkpoint 900

A markdown table of the figures goes to stderr. Targets (issue 13), where siloed training queues (its
training partition is smaller than training demand): unified utilization >= 1.25x siloed, mean training
JCT >= 1.5x lower, inference wait p99 no worse, lost GPU-seconds < 2% of training GPU-seconds; where
demand exceeds capacity, unified utilization >= 80%; GPUs saved >= 25% (the smallest unified pool
whose mean JCT and inference p99 are no worse than siloed's at the largest size).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from xirang_platform.load.traces import read_load
from xirang_platform.pool.model import MILLI_PER_GPU, Pool
from xirang_platform.pool.readers import read_pool
from xirang_platform.scheduling.model import Tier
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.scheduling.replica_scaling import ServiceSpec
from xirang_platform.scheduling.snapshot import SchedulerConfig
from xirang_platform.simulate.inference_bounds import fluid_jct_mean, fluid_util, replica_series
from xirang_platform.simulate.inference_replay import InferenceSetup, policy_metrics, run_policy
from xirang_platform.simulate.replay import ReplayOptions
from xirang_platform.simulate.traces import merge_traces, read_itp_jobs

REPO = Path(__file__).resolve().parents[1]
DAY = 86400.0
UTIL_RATIO, JCT_RATIO, UTIL_FLOOR, LOST_MAX, SAVED_MIN = 1.25, 1.5, 0.80, 0.02, 0.25


def load_scenario(path: Path, checkpoint: float | None) -> dict:
    """The scenario file, with its traces read: jobs of the window, the load, the service, the pool."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    start, days = doc["window"]["start_day"] * DAY, doc["window"]["days"] * DAY
    traces = []
    for key, tier in (("online", Tier.ONLINE_TRAINING), ("offline", Tier.OFFLINE_TRAINING)):
        spec = doc[key]
        jobs = read_itp_jobs(REPO / spec["trace"], tier=tier, tenant=spec["tenant"], project="default")
        # read_itp_jobs rebases each file to its first submit; put it back on the collection's clock.
        t0 = _first_submit(REPO / spec["trace"])
        window = [j for j in jobs if start <= j.request.submit_time + t0 < start + days]
        traces.append(
            (
                key,
                [
                    replace(j, request=replace(j.request, submit_time=j.request.submit_time + t0 - start))
                    for j in window
                ],
            )
        )
    inf = doc["inference"]
    load = read_load(REPO / inf["load"], window_s=inf["window_s"]).looped(days)
    service = ServiceSpec(
        "inference",
        inf["tenant"],
        "default",
        replica_qps=inf["replica_qps"],
        replica_gpu_milli=inf["replica_gpu_milli"],
        replica_gpu_memory_mib=round(inf["replica_memory_gb"] * 1024),
        headroom=inf["headroom"],
        up_cooldown_s=inf["up_cooldown_s"],
        down_cooldown_s=inf["down_cooldown_s"],
    )
    sched = doc["scheduler"]
    checkpoint_s = checkpoint or sched["checkpoint_s"]
    # `checkpoint`: the minimum runtime follows the checkpoint interval (a resumed job reaches its next
    # checkpoint before it may be preempted again).
    min_runtime = checkpoint_s if sched["min_runtime_s"] == "checkpoint" else float(sched["min_runtime_s"])
    return {
        "doc": doc,
        "pool": read_pool(REPO / doc["pool"], domain_size=8, unit_milli=1),
        "jobs": merge_traces(traces),
        "setup": InferenceSetup(service, load, inf["tick_s"]),
        "config": SchedulerConfig(min_runtime_s=min_runtime),
        "options": ReplayOptions(checkpoint_interval_s=checkpoint_s),
    }


def _first_submit(path: Path) -> float:
    import pandas as pd

    return float(pd.read_csv(path, usecols=["submission_time"])["submission_time"].min())


def training_book(doc: dict, training_milli: int) -> QuotaBook:
    """The training tenants' quotas: their shares of the GPUs that are not inference's."""
    tenants = {doc[k]["tenant"]: round(doc[k]["quota_share"] * training_milli) for k in ("online", "offline")}
    return QuotaBook(tenants, {(t, "default"): None for t in tenants})


def sub_pool(pool: Pool, nodes: int) -> Pool:
    """The first `nodes` nodes of `pool` in name order."""
    if nodes > len(pool.nodes):
        raise SystemExit(f"the pool has {len(pool.nodes)} nodes; a size of {nodes} nodes cannot be cut from it")
    return Pool(pool.nodes[:nodes], source=f"{pool.source} (first {nodes} nodes)")


def run_size(sc: dict, nodes: int, policy: str, runs: dict | None = None) -> dict:
    """One policy on one pool size: its metrics and how long it took (the run kept in `runs`)."""
    pool = sub_pool(sc["pool"], nodes)
    from xirang_platform.simulate.inference_replay import inference_partition

    inference, training = inference_partition(pool, sc["setup"])
    book = training_book(sc["doc"], training.gpu_milli)
    started = time.perf_counter()
    run = run_policy(policy, pool, book, sc["jobs"], sc["setup"], sc["config"], sc["options"])
    m = policy_metrics(run)
    m["wall_s"] = round(time.perf_counter() - started, 1)
    m["nodes"] = nodes
    m["gpus"] = pool.gpus
    m["training_partition_gpus"] = training.gpus
    if policy == "unified":
        m.update(fluid_bounds(sc, nodes))
    if runs is not None:
        runs[(nodes, policy)] = (run, m)
    return m


def demand_series(sc: dict, horizon: float, step: float = 600.0) -> tuple[np.ndarray, np.ndarray]:
    """(training GPUs, inference GPUs) demanded at every `step` of [0, horizon): training as if every
    submitted job ran at once (no queueing), inference as the replicas the policy wants for the load."""
    grid = np.arange(0.0, horizon, step)
    jobs = sc["jobs"]
    s = np.array([j.request.submit_time for j in jobs])
    e = s + np.array([j.duration_s for j in jobs])
    g = np.array([j.request.gpus for j in jobs])
    training = np.array([g[(s <= t) & (e > t)].sum() for t in grid], dtype=float)
    setup = sc["setup"]
    spec = setup.spec
    wanted = [max(spec.min_replicas, spec.wanted(setup.load.at(float(t)) or 0.0)) for t in grid]
    inference = np.array(wanted, dtype=float) * spec.replica_gpu_milli / MILLI_PER_GPU
    return training, inference


def fluid_bounds(sc: dict, nodes: int, step: float = 60.0, tail_days: float = 60.0) -> dict:
    """What a fluid schedule (`simulate/inference_bounds.py`: no placement, gang, quota or lost work)
    reaches on the unified pool of `nodes`, inference holding the autoscaler's replicas: the
    utilization no scheduler passes over the window, and the mean JCT of shortest-remaining-first."""
    setup = sc["setup"]
    spec, load = setup.spec, setup.load
    pool = sub_pool(sc["pool"], nodes)
    grid = np.arange(load.start, load.end, step)
    held = replica_series(spec, load.at, grid, setup.peak_replicas) * spec.replica_gpu_milli / MILLI_PER_GPU
    inference = np.minimum(held, pool.gpus)
    training = pool.gpus - inference
    jobs = list(sc["jobs"])
    return {
        "fluid_utilization": fluid_util(jobs, training, inference, pool.gpus, step),
        "fluid_jct_mean_s": fluid_jct_mean(jobs, training, float(pool.gpus), step, int(tail_days * DAY / step)),
    }


def evaluate(rows: list[dict], training: np.ndarray, inference: np.ndarray, jct_floor_s: float) -> dict:
    """The issue's targets, per size and overall; each with the figures it compared.

    A size counts as "siloed training queues" when training demand exceeds the siloed training
    partition for at least half the window, and as "demand exceeds capacity" when training plus
    inference demand exceeds the pool for at least half the window. Beside each ratio, what bounds it:
    `util_ratio_ceiling` is 1 / siloed's utilization (unified cannot pass 100%), `fluid_util_ratio_bound`
    unified's fluid utilization over siloed's (no scheduler does more work in the window: a tighter
    ceiling), `fluid_jct_ratio` siloed's mean JCT over unified's fluid shortest-first one, `jct_ratio_ceiling`
    siloed's mean JCT over `jct_floor_s` (the mean job duration: a JCT with no wait and no lost work,
    which no scheduler beats), and `no_queue_utilization_ratio` the ratio of
    the utilizations both policies would have if every job ran at its submit time within its
    partition (demand clipped to capacity; queueing can shift work into idle hours and pass it)."""
    by = {(r["nodes"], r["policy"]): r for r in rows}
    sizes = sorted({r["nodes"] for r in rows})
    per_size = []
    for n in sizes:
        u, s = by[(n, "unified")], by[(n, "siloed")]
        partition = s["training_partition_gpus"]
        queue_share = float(np.mean(training > partition))
        over_share = float(np.mean(training + inference > u["gpus"]))
        unified_fill = float(np.mean(np.minimum(training + inference, u["gpus"])))
        siloed_fill = float(np.mean(np.minimum(training, partition) + np.minimum(inference, u["gpus"] - partition)))
        check: dict = {
            "nodes": n,
            "share_training_over_partition": queue_share,
            "share_demand_over_capacity": over_share,
            "utilization_ratio": _ratio(u["utilization"], s["utilization"]),
            "no_queue_utilization_ratio": _ratio(unified_fill, siloed_fill),
            "util_ratio_ceiling": _ratio(1.0, s["utilization"]),
            "fluid_util_ratio_bound": _ratio(u["fluid_utilization"], s["utilization"]),
            "fluid_jct_ratio": _ratio(s["training_jct_mean_s"], u["fluid_jct_mean_s"]),
            "jct_ratio": _ratio(s["training_jct_mean_s"], u["training_jct_mean_s"]),
            "jct_ratio_ceiling": _ratio(s["training_jct_mean_s"], jct_floor_s),
            "inference_p99_unified_s": u["inference_wait_p99_s"],
            "inference_p99_siloed_s": s["inference_wait_p99_s"],
            "lost_fraction_unified": u["lost_fraction"],
        }
        if queue_share >= 0.5:
            check["util_ratio_ok"] = (check["utilization_ratio"] or 0.0) >= UTIL_RATIO
            check["jct_ratio_ok"] = (check["jct_ratio"] or 0.0) >= JCT_RATIO
            check["p99_ok"] = (u["inference_wait_p99_s"] or 0.0) <= (s["inference_wait_p99_s"] or 0.0)
            check["lost_ok"] = u["lost_fraction"] < LOST_MAX
        if over_share >= 0.5:
            check["util_floor_ok"] = u["utilization"] >= UTIL_FLOOR
        per_size.append(check)
    largest = sizes[-1]
    ref = by[(largest, "siloed")]
    fits = [
        n
        for n in sizes
        if (by[(n, "unified")]["training_jct_mean_s"] or np.inf) <= (ref["training_jct_mean_s"] or np.inf)
        and (by[(n, "unified")]["inference_wait_p99_s"] or 0.0) <= (ref["inference_wait_p99_s"] or 0.0)
    ]
    smallest = min(fits) if fits else None
    saved = 1 - smallest / largest if smallest else 0.0
    verdicts = [v for c in per_size for k, v in c.items() if k.endswith("_ok")]
    excess = {
        n: _ratio(by[(n, "unified")]["training_jct_mean_s"], ref["training_jct_mean_s"]) for n in sizes if n < largest
    }
    return {
        "per_size": per_size,
        "gpus_saved": {
            "smallest_unified_nodes_matching_siloed_at_largest": smallest,
            "largest_nodes": largest,
            "saved_fraction": saved,
            "ok": saved >= SAVED_MIN,
            # unified mean JCT at each smaller size over siloed's at the largest (1.0 = no worse)
            "unified_jct_over_reference": excess,
        },
        "all_met": all(verdicts) and saved >= SAVED_MIN,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def table(rows: list[dict]) -> str:
    """A markdown table of the figures, one row per size and policy."""
    cols = [
        ("nodes", "nodes", "{}"),
        ("gpus", "GPUs", "{}"),
        ("policy", "policy", "{}"),
        ("utilization", "util", "{:.3f}"),
        ("inference_wait_p99_s", "inf p99 wait s", "{:.0f}"),
        ("inference_unserved", "inf unserved", "{:.4f}"),
        ("training_wait_mean_s", "train wait mean s", "{:.0f}"),
        ("training_jct_mean_s", "JCT mean s", "{:.0f}"),
        ("training_jct_p95_s", "JCT p95 s", "{:.0f}"),
        ("preemptions", "preempt", "{}"),
        ("lost_gpu_seconds", "lost GPU-s", "{:.0f}"),
        ("lost_fraction", "lost/train", "{:.4f}"),
        ("wall_s", "wall s", "{}"),
    ]
    out = ["| " + " | ".join(h for _, h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join("-" if r[k] is None else f.format(r[k]) for k, _, f in cols) + " |")
    return "\n".join(out)


def ratio_table(targets: dict) -> str:
    """A markdown table of the ratios per size beside what bounds them, and the GPUs saved."""
    out = [
        "| nodes | training over siloed partition | demand over pool | util ratio | no-queue util ratio "
        "| util ratio ceiling | fluid util ratio bound | JCT ratio | fluid JCT ratio | JCT ratio ceiling |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = ("share_training_over_partition", "share_demand_over_capacity", "utilization_ratio")
    keys += ("no_queue_utilization_ratio", "util_ratio_ceiling", "fluid_util_ratio_bound", "jct_ratio")
    keys += ("fluid_jct_ratio", "jct_ratio_ceiling")
    for c in targets["per_size"]:
        cells = ["-" if c[k] is None else f"{c[k]:.2f}" for k in keys]
        out.append(f"| {c['nodes']} | " + " | ".join(cells) + " |")
    saved = targets["gpus_saved"]
    over = ", ".join(f"{n}: {r:.4f}" for n, r in saved["unified_jct_over_reference"].items() if r is not None)
    out.append(
        f"\nGPUs saved: {saved['saved_fraction']:.1%} (smallest unified size no worse than siloed at "
        f"{saved['largest_nodes']} nodes: {saved['smallest_unified_nodes_matching_siloed_at_largest']}); "
        f"unified mean JCT over that reference by size: {over}"
    )
    return "\n".join(out)


def main() -> None:
    """Run the sweep and print the JSON object (and the table on stderr)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", type=Path, default=REPO / "bench/scenarios/itp_sd_g2.yaml")
    ap.add_argument("--sizes", help="comma-separated node counts [default: the scenario's]")
    ap.add_argument("--checkpoint", type=float, help="checkpoint interval in seconds [default: the scenario's]")
    ap.add_argument("--report", type=Path, help="write the report page (plots, both policies) of one size here")
    ap.add_argument("--report-size", type=int, help="node count of the report [default: the second size]")
    args = ap.parse_args()
    sc = load_scenario(args.scenario, args.checkpoint)
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else sc["doc"]["sizes_nodes"]
    report_size = args.report_size or sizes[min(1, len(sizes) - 1)]
    runs: dict = {}
    rows = [
        run_size(sc, n, policy, runs if args.report and n == report_size else None)
        for n in sizes
        for policy in ("siloed", "unified")
    ]
    if args.report:
        from xirang_platform.simulate.inference_report import write_inference_report

        write_inference_report(args.report, [runs[(report_size, p)] for p in ("unified", "siloed")])
    training, inference = demand_series(sc, sc["setup"].load.end)
    jct_floor = float(np.mean([j.duration_s for j in sc["jobs"]]))
    out = {
        "scenario": str(args.scenario.relative_to(REPO) if args.scenario.is_relative_to(REPO) else args.scenario),
        "training_jobs": len(sc["jobs"]),
        "training_demand_mean_gpus": float(training.mean()),
        "inference_demand_mean_gpus": float(inference.mean()),
        "inference_load": sc["setup"].load.describe(),
        "inference_peak_replicas": sc["setup"].peak_replicas,
        "checkpoint_s": sc["options"].checkpoint_interval_s,
        "min_runtime_s": sc["config"].min_runtime_s,
        "lend_forecast_s": sc["config"].lend_forecast_s,
        "rows": rows,
        "training_jct_floor_s": jct_floor,
        "targets": evaluate(rows, training, inference, jct_floor),
        "gpu_milli": MILLI_PER_GPU,
    }
    print(table(rows), file=sys.stderr)
    print(ratio_table(out["targets"]), file=sys.stderr)
    print(json.dumps(out, sort_keys=True, default=float))


if __name__ == "__main__":
    main()
