"""Serving under a real trace on the embedded platform: the autoscaled service against a fixed fleet.

One temporary embedded platform (the demo's: 2 nodes x 4 H100, research 4 GPUs, product 6; a
scheduling tick and an autoscaler evaluation every `--tick` seconds) deploys product's digits model
(its `lifecycle` job, real training), then, in the same run of this script:

1. autoscaled: product's service scales from its replicas' scraped `/metrics` (`autoscaling.yaml`:
   min 1, max `--max-replicas`, `--replica-qps` each) while `xirang load`'s `run_load` replays the load:
   `--step-s` seconds at the SD serving trace's (Alibaba, 22 h) low, then a step at once to its peak
   (`--peak-qps`, which asks for more replicas) held `--hold-s` seconds, then the whole trace
   compressed `--speed` times, scaled to `--peak-qps` at its peak;
2. fixed fleet: the same load against `--max-replicas` replicas held from the start (min = max: the
   fleet sized to the peak), the way a siloed inference cluster serves it.

Reported per phase: requests, failed requests, latency p50/p99 (ms, from the planned send time), the
ready replicas over time beside the offered QPS (sampled every second), replica-seconds held (the
GPU time: replicas x seconds x their GPU share). For the autoscaled phase, `step`: from the instant
the offered load jumps, the autoscaler's reaction (its first scale-up decision, and the new
replica's run created), admission (the scheduling tick opened its gate: the ledger's reservation),
the replica's start (registered in the file_sd registry, then `/ready` 200) and the total, against
the target: under two scheduling ticks plus the replica's start (`target_met`).

    .venv/bin/python bench/serving.py [--speed 1200] [--peak-qps 12] [--hold-s 60] [--tick 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from dagster import AssetKey, DagsterEventType
from sqlalchemy import func, select

from xirang_platform.cli.demo import stdout_to_stderr
from xirang_platform.control.service_scaling import SERVICE_TAG
from xirang_platform.devtools.demo import DEMO_PLATFORM, DEMO_POOL, TRAINING
from xirang_platform.devtools.demo_serving import DEMO_SERVICES, SERVICE, write_services
from xirang_platform.devtools.embedded import TERMINAL, Embedded, embedded_platform, write_platform
from xirang_platform.ledger.db import make_engine
from xirang_platform.ledger.tables import ALLOCATIONS
from xirang_platform.load.generator import LoadReport, plan_load, run_load
from xirang_platform.load.traces import read_load
from xirang_platform.serving.registry import endpoints, registry_dir

REPO = Path(__file__).resolve().parents[1]
REPLICA_GPUS = 1.0  # the demo pool's H100s are whole-GPU units: a 0.25-GPU replica holds one GPU
SD = REPO / "data/traces/alibaba_genai_sd_serving_2026/qps.csv"
DECISIONS = AssetKey([SERVICE, "inference_service"])  # where the autoscaler observes its decisions
PLATFORM = DEMO_PLATFORM  # the demo's two tenants, its services file, a 1 s tick


def services(args: argparse.Namespace, fixed: int | None) -> dict[str, Any]:
    """The autoscaling file of a phase: autoscaled, or a fleet of `fixed` replicas."""
    service = dict(DEMO_SERVICES["services"][SERVICE])
    service.update(replica_qps=args.replica_qps, max_replicas=args.max_replicas, down_cooldown_s=30)
    if fixed is not None:
        service.update(min_replicas=fixed, max_replicas=fixed)
    return {"services": {SERVICE: service}}


def trace_file(root: Path, args: argparse.Namespace) -> tuple[Path, float, float]:
    """A t,qps file: `--step-s` s at the trace's low, a step to its peak held `--hold-s` s, then the SD
    trace compressed and scaled; its wall span and the low QPS."""
    series = read_load(SD)
    qps = np.array(series.qps, dtype=float)
    for i in range(len(qps)):  # a window without a reading keeps the previous one (as `xirang load` does)
        if np.isnan(qps[i]):
            qps[i] = qps[i - 1] if i else 0.0
    qps *= args.peak_qps / series.peak()
    low = float(qps.min())
    begin = args.step_s + args.hold_s
    times = begin + (series.times - series.start) / args.speed
    rows = [(0.0, low), (args.step_s, args.peak_qps), *zip(times.tolist(), qps.tolist(), strict=True)]
    end = begin + series.span_s / args.speed
    path = root / "bench_load.csv"
    path.write_text("t,qps\n" + "".join(f"{t:.3f},{q:.4f}\n" for t, q in rows) + f"{end:.3f},0\n", encoding="utf-8")
    return path, end, low


class Watcher:
    """The service's replicas, polled in a thread: when each run's endpoint registered and first
    answered `/ready` 200 (wall time), and the registered count sampled every second."""

    def __init__(self, poll_s: float = 0.2) -> None:
        self.samples: list[tuple[float, int]] = []
        self.registered: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        next_sample = time.time()
        with httpx.Client(timeout=1.0) as client:
            while not self._stop.is_set():
                now = time.time()
                live = endpoints(registry_dir(), SERVICE)
                for e in live:
                    self.registered.setdefault(e.run_id, now)
                    if e.run_id not in self.ready and _answers_ready(client, e.url):
                        self.ready[e.run_id] = time.time()
                if now >= next_sample:
                    self.samples.append((now, len(live)))
                    next_sample += 1.0
                self._stop.wait(self._poll_s)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _answers_ready(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(f"{url}/ready").status_code == 200
    except httpx.HTTPError:
        return False


def replicas_live(platform: Embedded) -> list[Any]:
    """The service's replica runs not yet finished."""
    return [r for r in platform.runs() if r.tags.get(SERVICE_TAG) and not r.is_finished]


def run_phase(platform: Embedded, root: Path, args: argparse.Namespace, fixed: int | None) -> dict[str, Any]:
    """One phase: the services file, the fleet at rest, the load replayed, the figures."""
    write_services(root, services(args, fixed))
    at_rest = fixed or 1
    platform.wait(f"{at_rest} ready replicas", lambda: len(endpoints(registry_dir(), SERVICE)) == at_rest, 600)
    trace, span, _ = trace_file(root, args)
    plan = plan_load(trace, speed=1.0, duration_s=span)
    done: list[tuple[LoadReport, float]] = []
    sender = threading.Thread(target=lambda: done.append((run_load(SERVICE, plan, wait_ready_s=30), time.time())))
    before = {r.run_id for r in platform.runs()}
    with Watcher() as watcher:
        sender.start()
        platform.wait("the load replayed", lambda: not sender.is_alive(), span + 600)
    if not done:
        raise SystemExit("the load generator stopped with an error (its traceback is above); nothing measured")
    load, returned = done[0]
    load_start = returned - load.wall_s  # the wall time of the load's second 0
    report = load.to_dict()
    kept = [(t - load_start, n) for t, n in watcher.samples if load_start <= t < load_start + span]
    held = sum(n for _, n in kept) * 1.0  # one sample a second
    out: dict[str, Any] = {
        "requests": report["requests"],
        "requests_failed": report["requests_failed"],
        "errors_by_reason": report["errors_by_reason"],
        "latency_p50_ms": report["latency_p50_ms"],
        "latency_p99_ms": report["latency_p99_ms"],
        "replica_seconds": held,
        "gpu_seconds": round(held * REPLICA_GPUS, 1),
        "max_ready_replicas": max((n for _, n in kept), default=0),
        "over_time": [
            {"t": round(t), "qps": round(float(plan.series.at(t) or 0.0), 2), "ready": n}
            for t, n in kept[:: args.every]
        ],
    }
    if fixed is None:
        wanted = min(args.max_replicas, int(np.ceil(args.peak_qps / args.replica_qps - 1e-9)))
        step = Step(platform, root, before, load_start + args.step_s, watcher)
        out["step"] = step.figures(args.tick, wanted, load_start + args.step_s + args.hold_s)
    return out


class Step:
    """The load step of the autoscaled phase (at wall time `at`) and what the platform did from then."""

    def __init__(self, platform: Embedded, root: Path, before: set[str], at: float, watcher: Watcher) -> None:
        self.platform, self.root, self.before, self.at, self.watcher = platform, root, before, at, watcher

    def figures(self, tick_s: float, wanted: int, until: float) -> dict[str, Any]:
        """Seconds from the step to the first new replica serving and its parts, against the target;
        `wanted`: the replicas the step's load asks for; `until`: when the step's load ends."""
        at = self.at
        decisions = [(t, m) for t, m in self.decisions() if at <= t <= until]
        ups = [(t, m) for t, m in decisions if int(m.get("scale_up_runs", 0)) > 0]
        runs = [r for r in self.platform.runs() if r.tags.get(SERVICE_TAG) and r.run_id not in self.before]
        created = {r.run_id: _created(self.platform, r.run_id) for r in runs}
        new = sorted((c, run_id) for run_id, c in created.items() if at <= c <= until)
        if not ups or not new:
            return {"problem": "the step asked for no new replica: raise --peak-qps or lower --replica-qps"}
        first = new[0][1]
        admitted, ready = self.reserved_at(first), self.watcher.ready.get(first)
        registered = self.watcher.registered.get(first)
        if admitted is None or ready is None or registered is None:
            return {"problem": f"the first new replica {first} was not admitted or never answered /ready"}
        start, total = ready - admitted, ready - at
        target = 2 * tick_s + start
        up_at, up = ups[0]
        readies = sorted(t for _, run_id in new if (t := self.watcher.ready.get(run_id)) is not None)
        gaps = [b - a for (a, _), (b, _) in zip(decisions, decisions[1:], strict=False)]
        return {
            "wanted_replicas": wanted,
            "tick_s": tick_s,
            "evaluation_interval_s": round(statistics.median(gaps), 2) if gaps else None,
            "decision_s": round(up_at - at, 2),
            "decision": {k: up.get(k) for k in ("qps", "replicas", "target_replicas", "scale_up_runs")},
            "reaction_s": round(new[0][0] - at, 2),
            "admission_s": round(admitted - new[0][0], 2),
            "registered_s": round(registered - admitted, 2),
            "replica_start_s": round(start, 2),
            "step_to_serving_s": round(total, 2),
            "target_s": round(target, 2),
            "target_met": total < target,
            "all_serving_s": round(readies[wanted - 2] - at, 2) if len(readies) >= wanted - 1 >= 1 else None,
        }

    def decisions(self) -> list[tuple[float, dict[str, Any]]]:
        """(wall time, metadata) of every autoscaler decision observed on the service's asset, in order."""
        records = self.platform.instance.fetch_observations(DECISIONS, limit=10_000).records
        out = []
        for record in sorted(records, key=lambda r: r.storage_id):
            event = record.event_log_entry.dagster_event
            if event is None or event.event_type != DagsterEventType.ASSET_OBSERVATION:
                continue
            metadata = event.asset_observation_data.asset_observation.metadata
            out.append((float(record.event_log_entry.timestamp), {k: v.value for k, v in metadata.items()}))
        return out

    def reserved_at(self, run_id: str) -> float | None:
        """When a scheduling tick admitted `run_id` (opened its gate): its ledger reservation."""
        engine = make_engine(f"sqlite:///{self.root / 'ledger.sqlite'}")
        try:
            with engine.connect() as conn:
                query = select(func.min(ALLOCATIONS.c.reserved_at)).where(ALLOCATIONS.c.request_id == run_id)
                value = conn.execute(query).scalar()
        finally:
            engine.dispose()
        return None if value is None else float(value)


def _created(platform: Embedded, run_id: str) -> float:
    record = platform.instance.get_run_record_by_id(run_id)
    if record is None:
        raise RuntimeError(f"no run record for {run_id}")
    return float(record.create_timestamp.timestamp())


def main() -> None:
    """Run both phases on one embedded platform and print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", type=float, default=1200.0, help="trace seconds per wall second")
    parser.add_argument("--peak-qps", type=float, default=12.0, help="the trace's peak, scaled to this QPS")
    parser.add_argument("--replica-qps", type=float, default=2.0)
    parser.add_argument("--max-replicas", type=int, default=6)
    parser.add_argument("--step-s", type=float, default=20.0, help="seconds at the trace's low before the step")
    parser.add_argument("--hold-s", type=float, default=60.0, help="seconds at the peak after the step")
    parser.add_argument("--tick", type=int, default=1, help="scheduling tick and autoscaler interval, seconds")
    parser.add_argument("--every", type=int, default=5, help="keep every Nth second of the replicas-over-time series")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="xirang-bench-serving-") as tmp, stdout_to_stderr():
        root = Path(tmp)
        platform_doc = {**PLATFORM, "tick": {"interval_s": args.tick, "location": "research"}}
        write_services(root, services(args, None))
        config, home = write_platform(root, platform_doc, DEMO_POOL)
        _, _, low = trace_file(root, args)
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
        "load": (
            f"{args.step_s:g} s at the trace's low {low:.2f} QPS, a step to {args.peak_qps:g} QPS held "
            f"{args.hold_s:g} s, then {SD.name} {args.speed:g}x (peak {args.peak_qps:g} QPS)"
        ),
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
