"""The queue view's estimated start against what happened in a replay (DESIGN.md section 10, issue 25).

Usage: .venv/bin/python bench/queue_estimate.py [--limit 2500] [--every 10] [--interval 60]

Replays `make simulate`'s two ITP traces (cluster04 as research/llm online training, cluster02 as
product/ranking offline training) on the 64 G2 nodes of `data/pools/openb_g2_64.csv` under
`data/tenants.example.yaml`. After every `--every`-th cycle it estimates each waiting job's start with
the queue view's own core (`queue_view.estimate_starts`: the cycle's order, each hold's kind as the
tick writes it, the idle GPUs, the caps), in two variants of the running work's expected ends:

- `declared`: admit time plus the job's own duration (as if every job declared its run time);
- `historical`: admit time plus the median of the last 20 durations of finished jobs of its kind
  (tenant, project, tier, GPUs), as the live view does with a Dagster job's successful runs; a kind
  without a finished job has no expected end.

Each estimate is compared with the job's actual next admit in the same replay. A sample whose job
never started (still waiting at the end) is left out. Prints one JSON object: `all_samples`, per
estimate (the two variants and two baselines: `now`, the job starts now; `mean_wait`, it starts
after the mean wait of the jobs admitted so far) the median absolute error, the median signed error
(> 0: estimated late), p90, the count and the share of `unknown`; `on_known`, per variant, the
variant and the baselines on the samples that variant estimated (the fair comparison); and
`by_hold_kind`, the same per hold kind (`capacity`, `quota`, `reserved`, `queued`: no hold this cycle).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict, deque
from collections.abc import Mapping
from pathlib import Path

from xirang_platform.ops.queue_view import HISTORY_RUNS, estimate_starts
from xirang_platform.ops.waiting import hold_kind
from xirang_platform.platform.tick_plan import hold_text
from xirang_platform.scheduling.model import Allocation, Request
from xirang_platform.scheduling.order import queue_order
from xirang_platform.scheduling.quota import QuotaBook, balances_from
from xirang_platform.scheduling.result import CycleResult
from xirang_platform.scheduling.scorers import DEFAULT_PLACEMENT, make_scorer
from xirang_platform.scheduling.snapshot import SchedulerConfig
from xirang_platform.simulate.inputs import load_book, load_jobs, load_pool, pool_catalog
from xirang_platform.simulate.replay import ReplayOptions, replay
from xirang_platform.simulate.traces import limit_jobs

ITP = "data/traces/microsoft_itp_elasticflow_2021"
JOBS = [f"{ITP}/cluster04.csv:online-training:research/llm", f"{ITP}/cluster02.csv:offline-training:product/ranking"]
NODES = Path("data/pools/openb_g2_64.csv")
TENANTS = Path("data/tenants.example.yaml")
VARIANTS = ("declared", "historical")
WAITING_FOR_TICK = "queued"  # the kind of a waiting job the cycle gave no hold (it was not considered)


def _kind(r: Request) -> tuple:
    return (r.tenant, r.project, r.tier.value, r.gpus)


class Sampler:
    """The replay's observer: keeps the history of finished jobs and, every `every` cycles, notes each
    waiting job's estimates (declared, historical) and the baselines' inputs."""

    def __init__(
        self, durations: Mapping[str, float], pool_milli: int, book: QuotaBook, config: SchedulerConfig, every: int
    ) -> None:
        self.durations, self.pool_milli, self.book, self.config = durations, pool_milli, book, config
        self.every = every
        self.cycles = 0
        self.live: dict[str, Allocation] = {}
        self.history: dict[tuple, deque[float]] = defaultdict(lambda: deque(maxlen=HISTORY_RUNS))
        self.first_admit: dict[str, float] = {}
        self.waits: list[float] = []
        self.samples: list[dict] = []

    def __call__(
        self, now: float, result: CycleResult, pending: Mapping[str, Request], allocations: Mapping[str, Allocation]
    ) -> None:
        self._follow(now, pending, allocations)
        self.cycles += 1
        if self.cycles % self.every == 0 and pending:
            self._sample(now, result, pending, allocations)

    def _follow(self, now: float, pending: Mapping[str, Request], allocations: Mapping[str, Allocation]) -> None:
        gone = [a for job, a in self.live.items() if job not in allocations and job not in pending]
        for a in sorted(gone, key=lambda a: (a.start + self.durations[a.id], a.id)):  # finished: in end order
            self.history[_kind(a.request)].append(self.durations[a.id])
        for job, a in allocations.items():
            if job not in self.first_admit:
                self.first_admit[job] = a.start
                self.waits.append(a.start - a.request.submit_time)
        self.live = dict(allocations)

    def _sample(
        self, now: float, result: CycleResult, pending: Mapping[str, Request], allocations: Mapping[str, Allocation]
    ) -> None:
        book = self.book
        balances = balances_from(book, allocations.values())
        held = sum(a.milli for a in allocations.values())
        ratio = self.config.overcommit.ratio(min(1.0, held / self.pool_milli))
        holds = {h.request_id: h for h in result.holds}
        order = list(queue_order(list(pending.values()), book, balances))
        kinds = [
            (r, hold_kind(hold_text(holds[r.id], r, book, balances, ratio)) if r.id in holds else WAITING_FOR_TICK)
            for r in order
        ]
        declared = [(a, a.start + self.durations[a.id]) for a in allocations.values()]
        historical = [(a, self._historical_end(a)) for a in allocations.values()]
        idle = self.pool_milli - held
        by_declared = estimate_starts(kinds, declared, idle, book, balances, ratio, now)
        by_history = estimate_starts(kinds, historical, idle, book, balances, ratio, now)
        mean_wait = statistics.fmean(self.waits) if self.waits else 0.0
        for (r, kind), d, h in zip(kinds, by_declared, by_history, strict=True):
            self.samples.append(
                {
                    "job": r.id,
                    "t": now,
                    "declared": d,
                    "historical": h,
                    "now": now,
                    "mean_wait": now + mean_wait,
                    "kind": kind,
                }
            )

    def _historical_end(self, a: Allocation) -> float | None:
        done = self.history.get(_kind(a.request))
        return a.start + statistics.median(done) if done else None


def _errors(samples: list[dict], key: str, known_by: str | None = None) -> dict:
    """Absolute errors of estimate `key` against the actual starts; with `known_by`, only on the
    samples that variant estimated (so a baseline compares with it on the same samples)."""
    if known_by is not None:
        samples = [s for s in samples if s[known_by] is not None]
    signed = [s[key] - s["actual"] for s in samples if s[key] is not None]
    known = [abs(e) for e in signed]
    out = {
        "median_abs_error_s": round(statistics.median(known), 1) if known else None,
        "median_signed_error_s": round(statistics.median(signed), 1) if signed else None,  # > 0: estimated late
        "p90_abs_error_s": round(statistics.quantiles(known, n=10)[-1], 1) if len(known) >= 2 else None,
        "count": len(known),
    }
    if known_by is None:
        out["unknown_share"] = round(1 - len(known) / len(samples), 4) if samples else None
    return out


def _compared(samples: list[dict]) -> dict:
    """Each variant and, on the samples it estimated, the two baselines."""
    return {
        variant: {key: _errors(samples, key, known_by=variant) for key in (variant, "now", "mean_wait")}
        for variant in VARIANTS
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=2500, help="jobs replayed (as `xirang simulate --limit`)")
    parser.add_argument("--every", type=int, default=10, help="estimate after every N-th cycle")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between cycles (as `--interval`)")
    args = parser.parse_args()
    if args.limit < 1 or args.every < 1 or args.interval < 0:
        parser.error("--limit and --every must be >= 1 and --interval >= 0")
    started = time.perf_counter()
    pool = load_pool(NODES, 8)
    book = load_book(TENANTS, pool)
    trace = limit_jobs(load_jobs(JOBS, book, tenants_given=True, catalog=pool_catalog(pool)), args.limit)
    config = SchedulerConfig(min_runtime_s=600.0, scorer=make_scorer(DEFAULT_PLACEMENT, [j.request for j in trace], 42))
    sampler = Sampler({j.request.id: j.duration_s for j in trace}, pool.gpu_milli, book, config, args.every)
    result = replay(pool, book, trace, config, ReplayOptions(interval_s=args.interval), observe=sampler)
    admits: dict[str, list[float]] = defaultdict(list)
    for e in result.events:
        if e["event"] == "admit":
            admits[e["job"]].append(e["t"])
    samples = []
    for s in sampler.samples:
        after = [t for t in admits.get(s["job"], []) if t >= s["t"]]
        if after:
            samples.append({**s, "actual": after[0]})
    never = len(sampler.samples) - len(samples)
    waits_left = [s["actual"] - s["t"] for s in samples]
    out = {
        "jobs": len(trace),
        "cycles": result.cycles,
        "samples": len(samples),
        "samples_never_started": never,
        "sampled_every_cycles": args.every,
        "interval_s": args.interval,
        "median_wait_left_s": round(statistics.median(waits_left), 1) if waits_left else None,
        "all_samples": {key: _errors(samples, key) for key in (*VARIANTS, "now", "mean_wait")},
        "on_known": _compared(samples),
        "by_hold_kind": {
            k: _compared([s for s in samples if s["kind"] == k]) for k in sorted({s["kind"] for s in samples})
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
