"""Placement on Alibaba's openb trace, FGD's fill method: our `xirang` policy against the baselines.

Runs every (policy, seed) through `xirang_platform.simulate.fill.run_fill` (the real scheduler
`cycle`, one pod at a time) and prints ONE JSON object: per policy the mean and per-seed allocation
ratio at 100% and 130% arrived demand, seconds per seed, the FGD paper's published figures for the
same seeds read from `fgd_paper_expected_alloc_results.csv`, and whether `xirang` reaches the target.

    .venv/bin/python bench/placement_openb.py [--seeds 42-51] [--policies bestfit,fgd,xirang] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from multiprocessing import Pool as ProcessPool
from pathlib import Path

import pandas as pd

from xirang_platform.simulate.fill import FILL_POLICIES, run_fill
from xirang_platform.simulate.inputs import load_openb

DATA = Path(__file__).resolve().parent.parent / "data" / "traces" / "alibaba_openb_gpu_2023"
NODES = DATA / "openb_node_list_gpu_node.csv"
PODS = DATA / "openb_pod_list_default.csv"
PAPER = DATA / "fgd_paper_expected_alloc_results.csv"
PAPER_POLICY = {"random": "01-Random", "bestfit": "05-BestFit", "fgd": "06-FGD"}
TARGET = 95.5

_loaded: tuple | None = None


def _load() -> tuple:
    global _loaded
    if _loaded is None:
        _loaded = load_openb(NODES, PODS)
    return _loaded


def _run(task: tuple[str, int]) -> dict:
    policy, seed = task
    pool, pods = _load()
    r = run_fill(pool, pods, policy, seed)
    return {
        "policy": policy,
        "seed": seed,
        "at_100": r.alloc_ratio_at_100,
        "at_130": r.alloc_ratio_at_130,
        "seconds": round(r.seconds, 2),
        "pods": r.pods,
        "placed": r.placed,
    }


def parse_seeds(text: str) -> list[int]:
    """Seeds from '42-51' or '42,43,47'."""
    seeds: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            seeds.extend(range(int(lo), int(hi) + 1))
        else:
            seeds.append(int(part))
    return seeds


def paper_figures(seeds: list[int]) -> dict[str, dict[str, float]]:
    """The FGD paper's column 100 and 130, mean over `seeds`, for the default openb workload."""
    df = pd.read_csv(PAPER)
    df = df[(df.workload == "openb_pod_list_default") & df.seed.isin(seeds)]
    out = {}
    for ours, theirs in PAPER_POLICY.items():
        rows = df[df.sc_policy == theirs]
        if len(rows):
            out[ours] = {"at_100": round(float(rows["100"].mean()), 3), "at_130": round(float(rows["130"].mean()), 3)}
    return out


def main() -> None:
    """Run the benchmark and print its JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="42-51", help="e.g. 42-51 or 42,43")
    parser.add_argument("--policies", default="bestfit,fgd,xirang", help=f"comma list of {', '.join(FILL_POLICIES)}")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    args = parser.parse_args()
    seeds = parse_seeds(args.seeds)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in FILL_POLICIES]
    if unknown:
        parser.error(f"unknown policies {unknown}; choose from {', '.join(FILL_POLICIES)}")
    tasks = [(p, s) for p in policies for s in seeds]
    started = time.perf_counter()
    if args.jobs > 1:
        with ProcessPool(args.jobs) as workers:
            results = workers.map(_run, tasks, chunksize=1)
    else:
        results = [_run(t) for t in tasks]
    report: dict = {"bench": "placement_openb", "seeds": seeds, "jobs": args.jobs, "policies": {}}
    for p in policies:
        rows = [r for r in results if r["policy"] == p]
        report["policies"][p] = {
            "mean_at_100": round(statistics.fmean(r["at_100"] for r in rows), 3),
            "mean_at_130": round(statistics.fmean(r["at_130"] for r in rows), 3),
            "per_seed_at_100": {r["seed"]: r["at_100"] for r in rows},
            "per_seed_at_130": {r["seed"]: r["at_130"] for r in rows},
            "seconds_per_seed": {r["seed"]: r["seconds"] for r in rows},
            "mean_seconds": round(statistics.fmean(r["seconds"] for r in rows), 2),
        }
    report["paper"] = paper_figures(seeds)
    report["target"] = {"policy": "xirang", "at_100": TARGET}
    if "xirang" in report["policies"]:
        report["target"]["pass"] = report["policies"]["xirang"]["mean_at_100"] >= TARGET
    report["wall_seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
