"""Preemption with a notice (issue 23): lost work, JCT, inference wait and utilization against no notice.

Two mixes, each replayed with no notice (the baseline, measured in the same run) and with notices of
15 / 60 / 120 s at checkpoint costs of 5 / 15 / 30 s (`xirang simulate --preemption-notice S
--checkpoint-cost S`, `simulate/notice.py`):

- `contention`: the README's contention example (the first command of `make simulate`): two tenants'
  ITP traces on data/pools/openb_g2_64.csv, `--limit 2500 --interval 60`, no periodic checkpoint (a
  killed victim loses its whole run);
- `mix`: the unified-versus-siloed mix (`bench/unified_vs_siloed.py`, bench/scenarios/itp_sd_g2.yaml:
  ITP training, P1 and P2, beside autoscaled SD-serving inference replicas, P0; `--scenario` names
  another, e.g. bench/scenarios/itp_azure_g2.yaml), on one pool size under both policies; there,
  also with the lending forecast off (`SchedulerConfig.lend_forecast_s = None`) at no notice and at a
  60 s notice, to see whether it still pays once notices exist.

    .venv/bin/python bench/preemption_notice.py                    # both mixes, the full grid
    .venv/bin/python bench/preemption_notice.py --limit 300 --nodes 32 --workers 2
    .venv/bin/python bench/preemption_notice.py --mixes mix --scenario bench/scenarios/itp_azure_g2.yaml \
        --nodes 24 --policies unified --notices 60 --costs 15,30

Prints one JSON object: per mix the baseline and every run's figures, and the targets evaluated:
lost GPU-seconds at a 60 s notice at least 90% below the baseline's (each cost), and inference p99
wait within the notice of the baseline's. A markdown table goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.scorers import DEFAULT_PLACEMENT, make_scorer
from xirang_platform.scheduling.snapshot import SchedulerConfig
from xirang_platform.simulate.inputs import load_book, load_jobs, load_pool, pool_catalog
from xirang_platform.simulate.metrics import compute_metrics
from xirang_platform.simulate.notice import NoticePolicy, notice_metrics
from xirang_platform.simulate.replay import ReplayOptions, replay
from xirang_platform.simulate.traces import limit_jobs

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
ITP = "data/traces/microsoft_itp_elasticflow_2021"
CONTENTION_JOBS = [
    f"{ITP}/cluster04.csv:online-training:research/llm",
    f"{ITP}/cluster02.csv:offline-training:product/ranking",
]
SCENARIO = "bench/scenarios/itp_sd_g2.yaml"
LOST_CUT, TARGET_NOTICE = 0.90, 60.0
FIGURES = (
    "lost_gpu_seconds",
    "training_jct_mean_s",
    "inference_wait_p99_s",
    "utilization",
    "preemptions",
    "preemptor_wait_added_s_mean",
)


def contention_run(notice: NoticePolicy, forecast: bool, limit: int) -> dict:
    """The README's contention example under `notice` (the CLI's inputs, read the CLI's way)."""
    pool = load_pool(REPO / "data/pools/openb_g2_64.csv", 8)
    book = load_book(REPO / "data/tenants.example.yaml", pool)
    specs = [str(REPO / s) for s in CONTENTION_JOBS]
    found = load_jobs(specs, book, tenants_given=True, catalog=pool_catalog(pool), keep_times=False, times=True)
    trace = limit_jobs(found, limit)
    scorer = make_scorer(DEFAULT_PLACEMENT, [j.request for j in trace], 42)
    config = SchedulerConfig(min_runtime_s=600.0, scorer=scorer)
    if not forecast:
        config = replace(config, lend_forecast_s=None)
    result = replay(pool, book, trace, config, ReplayOptions(interval_s=60.0, notice=notice))
    return compute_metrics(result.events, pool.gpu_milli / MILLI_PER_GPU) | notice_metrics(result.events, notice)


def mix_run(notice: NoticePolicy, forecast: bool, nodes: int, policy: str, days: float | None, scenario: str) -> dict:
    """The unified-versus-siloed mix of `scenario` on `nodes` nodes under `policy` and `notice` (its
    window cut to its first `days` when given)."""
    import tempfile

    import unified_vs_siloed as uvs
    import yaml

    from xirang_platform.simulate.inference_replay import inference_partition, policy_metrics, run_policy

    path = REPO / scenario
    if days is not None:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        doc["window"]["days"] = days
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump(doc, f)
        path = Path(f.name)
    sc = uvs.load_scenario(path, None)
    pool = uvs.sub_pool(sc["pool"], nodes)
    _, training = inference_partition(pool, sc["setup"])
    book = uvs.training_book(sc["doc"], training.gpu_milli)
    config = sc["config"] if forecast else replace(sc["config"], lend_forecast_s=None)
    options = replace(sc["options"], notice=notice)
    run = run_policy(policy, pool, book, sc["jobs"], sc["setup"], config, options)
    return policy_metrics(run) | notice_metrics(run.events, notice)


def one(task: tuple) -> dict:
    """Run one point of the grid; its figures, what it was and how long it took."""
    mix, notice_s, cost_s, forecast, args = task
    notice = NoticePolicy(notice_s, cost_s)
    started = time.perf_counter()
    if mix == "contention":
        m = contention_run(notice, forecast, args["limit"])
    else:
        m = mix_run(notice, forecast, args["nodes"], args["policy"], args["days"], args["scenario"])
    row = {k: m.get(k) for k in FIGURES}
    row.update(
        mix=mix if mix == "contention" else f"mix-{args['policy']}",
        notice_s=notice_s,
        checkpoint_cost_s=cost_s,
        lend_forecast=forecast,
        wall_s=round(time.perf_counter() - started, 1),
    )
    return row


def grid(mixes: list[str], notices: list[float], costs: list[float], args: dict) -> list[tuple]:
    """Every run: per mix the baseline (no notice), each notice at each cost; the forecast off at no
    notice and at a 60 s notice where it can act (the mix: checkpoints and P0 preempting at any age)."""
    tasks = []
    variants = []
    if "contention" in mixes:
        variants.append(("contention", {"limit": args["limit"]}))
    if "mix" in mixes:
        variants += [
            ("mix", {"nodes": args["nodes"], "policy": p, "days": args["days"], "scenario": args["scenario"]})
            for p in args["policies"]
        ]
    for mix, extra in variants:
        points = [(0.0, 0.0, True)] + [(n, c, True) for n in notices for c in costs]
        if mix == "mix":
            points += [(0.0, 0.0, False)] + [(TARGET_NOTICE, c, False) for c in costs]
        tasks += [(mix, n, c, f, extra) for n, c, f in points]
    return tasks


def evaluate(rows: list[dict]) -> dict:
    """Per mix: lost work at a 60 s notice against the baseline (the cut and whether it is >= 90%), and
    whether inference p99 wait stays within the notice of the baseline's; the forecast's effect."""
    out = {}
    for mix in sorted({r["mix"] for r in rows}):
        mine = [r for r in rows if r["mix"] == mix]
        base = next(r for r in mine if r["notice_s"] == 0 and r["lend_forecast"])
        with_notice = [r for r in mine if r["notice_s"] > 0 and r["lend_forecast"]]
        cuts = {}
        for r in with_notice:
            if r["notice_s"] == TARGET_NOTICE:
                cut = 1 - r["lost_gpu_seconds"] / base["lost_gpu_seconds"] if base["lost_gpu_seconds"] else None
                cuts[f"cost_{r['checkpoint_cost_s']:g}"] = {"lost_cut": cut, "ok": cut is not None and cut >= LOST_CUT}
        p99 = {}
        for r in with_notice:
            if base["inference_wait_p99_s"] is None or r["inference_wait_p99_s"] is None:
                continue
            within = r["inference_wait_p99_s"] <= base["inference_wait_p99_s"] + r["notice_s"]
            p99[f"notice_{r['notice_s']:g}_cost_{r['checkpoint_cost_s']:g}"] = within
        entry: dict = {"lost_cut_at_60s_notice": cuts, "inference_p99_within_notice": p99 or "no inference in this mix"}
        off = {(r["notice_s"], r["checkpoint_cost_s"]): r for r in mine if not r["lend_forecast"]}
        if off:
            on = {(r["notice_s"], r["checkpoint_cost_s"]): r for r in mine if r["lend_forecast"]}
            entry["forecast_on_minus_off"] = {
                f"notice_{n:g}_cost_{c:g}": {k: _diff(on[(n, c)][k], r[k]) for k in FIGURES}
                for (n, c), r in sorted(off.items())
                if (n, c) in on
            }
        out[mix] = entry
    verdicts = [v["ok"] for e in out.values() for v in e["lost_cut_at_60s_notice"].values()]
    verdicts += [
        v
        for e in out.values()
        if isinstance(e["inference_p99_within_notice"], dict)
        for v in e["inference_p99_within_notice"].values()
    ]
    out["all_met"] = all(verdicts)
    return out


def _diff(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def table(rows: list[dict]) -> str:
    """A markdown table of the runs."""
    cols = ["mix", "notice_s", "checkpoint_cost_s", "lend_forecast", *FIGURES, "wall_s"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = ["-" if r[c] is None else f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    """Run the grid and print the JSON object (and the table on stderr)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mixes", default="contention,mix", help="comma-separated: contention, mix")
    ap.add_argument("--limit", type=int, default=2500, help="jobs of the contention example [default: 2500]")
    ap.add_argument("--nodes", type=int, default=32, help="pool size of the mix, in 8-GPU nodes [default: 32]")
    ap.add_argument("--scenario", default=SCENARIO, help=f"the mix's scenario file [default: {SCENARIO}]")
    ap.add_argument("--days", type=float, help="days of the mix's window [default: the scenario's 4]")
    ap.add_argument("--policies", default="unified,siloed", help="the mix's policies [default: unified,siloed]")
    ap.add_argument("--notices", default="15,60,120", help="notices in seconds [default: 15,60,120]")
    ap.add_argument("--costs", default="5,15,30", help="checkpoint costs in seconds [default: 5,15,30]")
    ap.add_argument("--workers", type=int, default=1, help="runs at once (processes) [default: 1]")
    args = ap.parse_args()
    extra = {
        "limit": args.limit,
        "nodes": args.nodes,
        "policies": args.policies.split(","),
        "days": args.days,
        "scenario": args.scenario,
    }
    notices = [float(x) for x in args.notices.split(",")]
    costs = [float(x) for x in args.costs.split(",")]
    tasks = grid(args.mixes.split(","), notices, costs, extra)
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        rows = []
        for row in pool.map(one, tasks):
            print(json.dumps(row, sort_keys=True), file=sys.stderr, flush=True)  # progress
            rows.append(row)
    out = {
        "contention_example": {"jobs": CONTENTION_JOBS, "limit": args.limit, "interval_s": 60, "checkpoint_s": None},
        "mix": {
            "scenario": args.scenario,
            "nodes": args.nodes,
            "policies": extra["policies"],
            "days": args.days or "the scenario's",
        },
        "rows": rows,
        "targets": evaluate(rows),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(table(rows), file=sys.stderr)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
