"""Serving under a real trace on the embedded platform: the autoscaled service against a fixed fleet.

One temporary embedded platform (the demo's: 2 nodes x 4 H100, research 4 GPUs, product 6; a
scheduling tick and an autoscaler evaluation every `--tick` seconds) deploys product's digits model
(its `lifecycle` job, real training), then, in the same run of this script:

1. autoscaled: product's service scales from its replicas' scraped `/metrics` (`autoscaling.yaml`:
   min 1, max `--max-replicas`, `--replica-qps` each) while `xirang load`'s `run_load` replays the load:
   `--step-s` seconds at 1 QPS, then a step to the SD serving trace (Alibaba, 22 h) compressed
   `--speed` times and scaled to `--peak-qps` at its peak;
2. fixed fleet: the same load against `--max-replicas` replicas held from the start (min = max: the
   fleet sized to the peak), the way a siloed inference cluster serves it.

Reported per phase: requests, failed requests, latency p50/p99 (ms, from the planned send time), the
ready replicas over time beside the offered QPS (sampled every second), replica-seconds held (the
GPU time: replicas x seconds x their GPU share), and for the autoscaled phase the time from the load
step to the first new replica serving (ready in the registry), split into the autoscaler's reaction
(step -> the replica's run is created), admission (created -> the tick opened its gate) and the
replica's start (gate -> registered, ready), against the target: under two scheduling ticks plus the
replica's start.

    .venv/bin/python bench/serving.py [--speed 600] [--peak-qps 12] [--tick 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from xirang_platform.assets.serving import SERVICE_TAG
from xirang_platform.autoscale.load import read_load
from xirang_platform.demo import DEMO_POOL, TRAINING
from xirang_platform.demo_cli import stdout_to_stderr
from xirang_platform.demo_serving import DEMO_SERVICES, SERVICE, write_services
from xirang_platform.embedded import TERMINAL, Embedded, embedded_platform, write_platform
from xirang_platform.serving.load import LoadReport, plan_load, run_load
from xirang_platform.serving.registry import endpoints, registry_dir

REPO = Path(__file__).resolve().parents[1]
REPLICA_GPUS = 1.0  # the demo pool's H100s are whole-GPU units: a 0.25-GPU replica holds one GPU
SD = REPO / "data/traces/alibaba_genai_sd_serving_2026/qps.csv"
PLATFORM = {
    "pool": "pool.yaml",
    "ledger_url": "sqlite:///ledger.sqlite",
    "launcher": "local",
    "tenants": {
        "research": {"quota_gpus": 4, "projects": {"vision": {}}},
        "product": {"quota_gpus": 6, "projects": {"serving": {}}},
    },
    "locations": {"research": "research", "product": "product"},
    "autoscaling": "autoscaling.yaml",
    "tick": {"interval_s": 1, "location": "research"},
    "scheduler": {"min_runtime_s": 0, "starvation_wait_s": 600},
}


def services(args: argparse.Namespace, fixed: int | None) -> dict[str, Any]:
    """The autoscaling file of a phase: autoscaled, or a fleet of `fixed` replicas."""
    service = dict(DEMO_SERVICES["services"][SERVICE])
    service.update(replica_qps=args.replica_qps, max_replicas=args.max_replicas, down_cooldown_s=30)
    if fixed is not None:
        service.update(min_replicas=fixed, max_replicas=fixed)
    return {"services": {SERVICE: service}}


def trace_file(root: Path, args: argparse.Namespace) -> tuple[Path, float]:
    """A t,qps file: `--step-s` s at 1 QPS, then the SD trace compressed and scaled; its wall span."""
    series = read_load(SD)
    qps = np.array(series.qps, dtype=float)
    for i in range(len(qps)):  # a window without a reading keeps the previous one (as `xirang load` does)
        if np.isnan(qps[i]):
            qps[i] = qps[i - 1] if i else 0.0
    qps *= args.peak_qps / series.peak()
    times = args.step_s + (series.times - series.start) / args.speed
    rows = [(0.0, 1.0), *zip(times.tolist(), qps.tolist(), strict=True)]
    end = args.step_s + series.span_s / args.speed
    path = root / "bench_load.csv"
    path.write_text("t,qps\n" + "".join(f"{t:.3f},{q:.4f}\n" for t, q in rows) + f"{end:.3f},0\n", encoding="utf-8")
    return path, end


class Sampler:
    """Ready replicas of the service, every second, in a thread."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.start = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic() - self.start, len(endpoints(registry_dir(), SERVICE))))
            self._stop.wait(1.0)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def replicas_live(platform: Embedded) -> list[Any]:
    return [r for r in platform.runs() if r.tags.get(SERVICE_TAG) and not r.is_finished]


def run_phase(platform: Embedded, root: Path, args: argparse.Namespace, fixed: int | None) -> dict[str, Any]:
    """One phase: the services file, the fleet at rest, the load replayed, the figures."""
    write_services(root, services(args, fixed))
    at_rest = fixed or 1
    platform.wait(f"{at_rest} ready replicas", lambda: len(endpoints(registry_dir(), SERVICE)) == at_rest, 600)
    trace, span = trace_file(root, args)
    plan = plan_load(trace, speed=1.0, duration_s=span)
    done: list[LoadReport] = []
    sender = threading.Thread(target=lambda: done.append(run_load(SERVICE, plan, wait_ready_s=30)), daemon=True)
    before = {r.run_id for r in platform.runs()}
    with Sampler() as sampler:
        sender.start()
        step_at = time.time() + args.step_s
        platform.wait("the load replayed", lambda: not sender.is_alive(), span + 600)
    report = done[0].to_dict()
    offered = [(t, float(plan.series.at(t) or 0.0)) for t, _ in sampler.samples if t < span]
    held = sum(n for _, n in sampler.samples) * 1.0  # one sample a second
    out: dict[str, Any] = {
        "requests": report["requests"],
        "requests_failed": report["requests_failed"],
        "errors_by_reason": report["errors_by_reason"],
        "latency_p50_ms": report["latency_p50_ms"],
        "latency_p99_ms": report["latency_p99_ms"],
        "replica_seconds": held,
        "gpu_seconds": round(held * REPLICA_GPUS, 1),
        "max_ready_replicas": max(n for _, n in sampler.samples),
        "over_time": [
            {"t": round(t), "qps": round(q, 2), "ready": n}
            for (t, n), (_, q) in zip(sampler.samples[:: args.every], offered[:: args.every], strict=False)
        ],
    }
    if fixed is None:
        out["step"] = step_reaction(platform, before, step_at, args.tick)
    return out


def step_reaction(platform: Embedded, before: set[str], step_at: float, tick_s: float) -> dict[str, Any]:
    """Seconds from the load step to the first new replica serving, and its parts."""
    new = [r for r in platform.runs() if r.tags.get(SERVICE_TAG) and r.run_id not in before]
    if not new:
        return {"problem": "the step asked for no new replica"}
    created_at = {r.run_id: _created(platform, r.run_id) for r in new}
    first = min(new, key=lambda r: (created_at[r.run_id], r.run_id))
    created = created_at[first.run_id]
    admitted = _event_time(platform, first.run_id, "admitted") or created
    ready = _event_time(platform, first.run_id, "serving ")
    reaction, admission = created - step_at, admitted - created
    start = (ready - admitted) if ready else None
    return {
        "reaction_s": round(reaction, 2),
        "admission_s": round(admission, 2),
        "replica_start_s": round(start, 2) if start is not None else None,
        "step_to_serving_s": round(ready - step_at, 2) if ready else None,
        "target_s": round(2 * tick_s + start, 2) if start is not None else None,
        "within_target": bool(start is not None and reaction + admission <= 2 * tick_s + 1.0),
    }


def _created(platform: Embedded, run_id: str) -> float:
    record = platform.instance.get_run_record_by_id(run_id)
    if record is None:
        raise RuntimeError(f"no run record for {run_id}")
    return float(record.create_timestamp.timestamp())


def _event_time(platform: Embedded, run_id: str, text: str) -> float | None:
    """The time of the run's first log message containing `text` (None when there is none)."""
    for entry in platform.instance.all_logs(run_id):
        if text in (entry.user_message or ""):
            return float(entry.timestamp)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", type=float, default=600.0, help="trace seconds per wall second")
    parser.add_argument("--peak-qps", type=float, default=12.0, help="the trace's peak, scaled to this QPS")
    parser.add_argument("--replica-qps", type=float, default=2.0)
    parser.add_argument("--max-replicas", type=int, default=6)
    parser.add_argument("--step-s", type=float, default=20.0, help="seconds at 1 QPS before the trace")
    parser.add_argument("--tick", type=int, default=1, help="scheduling tick and autoscaler interval, seconds")
    parser.add_argument("--every", type=int, default=5, help="keep every Nth second of the replicas-over-time series")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="xirang-bench-serving-") as tmp, stdout_to_stderr():
        root = Path(tmp)
        platform_doc = {**PLATFORM, "tick": {"interval_s": args.tick, "location": "research"}}
        write_services(root, services(args, None))
        config, home = write_platform(root, platform_doc, DEMO_POOL)
        with embedded_platform(config, home) as platform:
            deploy = platform.submit("product", "lifecycle", TRAINING)
            platform.wait("the first deployment", lambda: platform.status(deploy) in TERMINAL, 600)
            autoscaled = run_phase(platform, root, args, None)
            fixed = run_phase(platform, root, args, args.max_replicas)
            write_services(root, {"services": {}})
            for run in replicas_live(platform):
                platform.instance.run_coordinator.cancel_run(run.run_id)
            platform.wait("the replicas drained", lambda: not replicas_live(platform), 300)
    result = {
        "trace": f"{SD.name} {args.speed:g}x, peak {args.peak_qps:g} QPS, after {args.step_s:g} s at 1 QPS",
        "tick_s": args.tick,
        "replica_qps": args.replica_qps,
        "autoscaled": autoscaled,
        "fixed_fleet": {"replicas": args.max_replicas, **fixed},
        "gpu_seconds_saved": round(fixed["gpu_seconds"] - autoscaled["gpu_seconds"], 1),
    }
    json.dump(result, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
