"""The queue estimate by forward simulation against what happened, and what one estimate costs
(DESIGN.md sections 8 and 10, issue 31).

Usage: .venv/bin/python bench/queue_estimate.py [--limit 2500] [--every 3600] [--interval 60]
    [--cases accuracy,cost] [--nodes 4000] [--queued 5000]

`accuracy`: replays ITP traces (`data/traces/microsoft_itp_elasticflow_2021`) on the 64 G2 nodes of
`data/pools/openb_g2_64.csv` under `data/tenants.example.yaml`, as `xirang simulate --eta-every`
does (`simulate/eta_score.py`): every `--every` simulated seconds each waiting job's estimated start,
its trace duration declared, against its next admission in the same replay, beside the two baselines
measured on the same samples: `starts_now` (it starts now) and `declared_ends` (the running work's
expected ends counted without simulating the queue: the queue view's estimator before this one).
Scenarios: `make simulate`'s pair (cluster04 as research/llm online training, cluster02 as
product/ranking offline training, 512 GPUs), and each of the five clusters alone as offline training
on the first 16 of those nodes (128 GPUs, one tenant), where a queue forms. Figures per scenario:
median and p90 absolute error in seconds, the share unknown, and per baseline its figures and the
forward estimate's on the samples it dates. Target: there, the forward median at most half the better
baseline's.

`cost`: one estimate on `--nodes` 8-GPU nodes (`cycle_speed.build_pool`) full of running work with
known expected ends, `--queued` runs waiting (`cycle_speed.build_requests`), beside one cycle on the
same snapshot (what the tick spends anyway) and the counting baseline. Target: within one tick, well
under the tick's `cycle_budget_s` (15 s).

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
from cycle_speed import build_pool, build_requests  # this folder's cycle bench: its pool and queue mix

from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.apply import apply_cycle, pending_after
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.model import Allocation
from xirang_platform.scheduling.order import queue_order
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.scheduling.scorers import DEFAULT_PLACEMENT, make_scorer
from xirang_platform.scheduling.snapshot import SchedulerConfig, Snapshot
from xirang_platform.scheduling.state import ClusterState
from xirang_platform.simulate.eta import Forecast, estimate_starts
from xirang_platform.simulate.eta_score import BASELINES, EtaSampler, declared_ends, eta_metrics
from xirang_platform.simulate.inputs import load_book, load_jobs, load_pool, pool_catalog
from xirang_platform.simulate.replay import ReplayOptions, replay, replay_config
from xirang_platform.simulate.traces import limit_jobs

ITP = "data/traces/microsoft_itp_elasticflow_2021"
# name -> (job specs, nodes of `NODES` used, whether the tenants file splits the quota)
SCENARIOS = {
    "make-simulate pair": (
        [f"{ITP}/cluster04.csv:online-training:research/llm", f"{ITP}/cluster02.csv:offline-training:product/ranking"],
        64,
        True,
    ),
    **{f"cluster0{k}": ([f"{ITP}/cluster0{k}.csv:offline-training"], 16, False) for k in range(1, 6)},
}
NODES = Path("data/pools/openb_g2_64.csv")
TENANTS = Path("data/tenants.example.yaml")
TICK_BUDGET_S = 15.0  # the tick's default `cycle_budget_s`


def accuracy(jobs: list[str], nodes: int, tenants: bool, limit: int, every: float, interval: float) -> dict:
    """The forward estimate and both baselines on one replay of `jobs` on the first `nodes` nodes."""
    started = time.perf_counter()
    pool = Pool(load_pool(NODES, 8).nodes[:nodes])
    book = load_book(TENANTS if tenants else None, pool)
    trace = limit_jobs(load_jobs(jobs, book, tenants_given=tenants, catalog=pool_catalog(pool)), limit)
    config = SchedulerConfig(min_runtime_s=600.0, scorer=make_scorer(DEFAULT_PLACEMENT, [j.request for j in trace], 42))
    options = ReplayOptions(interval_s=interval)
    durations = {j.request.id: j.duration_s for j in trace}
    sampler = EtaSampler(pool, book, replay_config(config, options), durations, every, tick_s=interval)
    result = replay(pool, book, trace, config, options, observe=sampler)
    eta = eta_metrics(sampler.samples, result.events, every)
    return {
        "jobs": len(trace),
        "gpus": pool.gpus,
        "cycles": result.cycles,
        **eta,
        "unknown_share": round(eta["unknown"] / eta["samples"], 4) if eta["samples"] else None,
        "estimates_cut_by_the_bound": sampler.horizons,
        "target_met": target_met(eta),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def target_met(eta: dict) -> bool | None:
    """Whether the forward median is at most half the better baseline's, on the samples that baseline
    dates (None without samples)."""
    pairs = [
        (eta[name]["median_abs_error_s"], eta[name]["forward"]["median_abs_error_s"])
        for name in BASELINES
        if eta[name]["median_abs_error_s"] is not None
    ]
    if not pairs:
        return None
    baseline, forward = min(pairs)
    return forward <= baseline / 2


def cost(nodes: int, queued: int, seed: int = 7) -> dict:
    """One estimate at scale, beside one cycle of the same snapshot and the counting baseline."""
    pool = build_pool(nodes)
    book = QuotaBook(
        {f"t{k}": pool.gpu_milli // 10 for k in range(10)}, {(f"t{k}", "default"): None for k in range(10)}
    )
    config = SchedulerConfig()
    rng = np.random.default_rng(seed)
    now = 3_600.0
    # Fill the pool from a queue larger than it, then keep `queued` of what is left waiting.
    state = ClusterState(pool)
    allocations: dict[str, Allocation] = {}
    pending = build_requests(queued * 3, seed)
    result = cycle(Snapshot(pool, state, allocations, book), pending, now, config)
    apply_cycle(result, state, allocations)
    waiting = pending_after(pending, result)[:queued]
    ends = {a: now + float(rng.uniform(60, 6 * 3600)) for a in sorted(allocations)}
    durations = {r.id: float(rng.uniform(60, 6 * 3600)) for r in waiting}
    snapshot = Snapshot.build(pool, allocations.values(), book)

    t0 = time.perf_counter()
    one = cycle(snapshot, waiting, now, config)
    cycle_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = estimate_starts(snapshot, waiting, now, config, Forecast(ends, durations), memo=one.memo)
    estimate_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    order = list(queue_order(waiting, book, snapshot.balances or {}))
    idle = snapshot.state.capacity_milli - snapshot.state.allocated_milli
    declared_ends(order, [(a, ends[a.id]) for a in allocations.values()], idle, now)
    counting_s = time.perf_counter() - t0
    dated = sum(t is not None for t in got.starts.values())
    return {
        "nodes": nodes,
        "running": len(allocations),
        "queued": len(waiting),
        "estimate_s": round(estimate_s, 2),
        "estimate_cycles": got.cycles,
        "estimate_plan_steps": got.plan_steps,
        "estimate_cut_by_the_bound": got.horizon,
        "dated_share": round(dated / len(waiting), 4) if waiting else None,
        "baseline_one_cycle_s": round(cycle_s, 3),
        "baseline_counting_s": round(counting_s, 3),
        "target_s": TICK_BUDGET_S,
        "target_met": estimate_s <= TICK_BUDGET_S,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cases", default="accuracy,cost", help="accuracy, cost or both")
    parser.add_argument("--limit", type=int, default=2500, help="jobs replayed per scenario (as `--limit`)")
    parser.add_argument("--every", type=float, default=3600.0, help="simulated seconds between estimates")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between cycles (as `--interval`)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="which accuracy scenarios")
    parser.add_argument("--nodes", type=int, default=4000, help="nodes of the cost case")
    parser.add_argument("--queued", type=int, default=5000, help="runs waiting in the cost case")
    args = parser.parse_args()
    if args.limit < 1 or args.every <= 0 or args.interval < 0 or args.nodes < 1 or args.queued < 1:
        parser.error("--limit, --nodes, --queued must be >= 1, --every > 0 and --interval >= 0")
    cases = set(args.cases.split(","))
    out: dict = {"every_s": args.every, "interval_s": args.interval, "limit": args.limit}
    if "accuracy" in cases:
        out["accuracy"] = {
            name: accuracy(*SCENARIOS[name], args.limit, args.every, args.interval)
            for name in args.scenarios.split(",")
        }
        medians = [s["median_abs_error_s"] for s in out["accuracy"].values() if s["median_abs_error_s"] is not None]
        out["accuracy_median_of_medians_s"] = statistics.median(medians) if medians else None
    if "cost" in cases:
        out["cost"] = cost(args.nodes, args.queued)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
