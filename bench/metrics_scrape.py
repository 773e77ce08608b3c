"""The exporter's scrape time and memory on PostgreSQL (DESIGN.md section 10; target: a scrape under 1 s).

Usage: .venv/bin/python bench/metrics_scrape.py [--allocations 10000] [--queued 5000] [--scrapes 7] [--url ...]

A fresh PostgreSQL database holds Dagster's storage (`--queued` runs behind the closed gate, with hold
reasons, and a tick-duration record) and, in schema `xirang_ledger`, the ledger: `--allocations` live
allocations of one GPU each over four tenants and eight projects (reserved in batches of 500, every
other one committed; past their caps they are borrowed), plus 10% released ones and some preemptions,
so the counters' GROUP BYs read a history. Each scrape is the whole `/metrics` text, as
`generate_latest` serves it. Prints one JSON object: scrape seconds (first, median, max), the Python
memory one more scrape allocates at its peak (tracemalloc, untimed), the process' peak RSS, the sizes,
and each read's median alone (the ledger, the waiting runs, the tick record) with the load average
(scrape times scale with a busy machine's share of a core). The database is dropped afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import time
import tracemalloc
import uuid

from dagster import DagsterRunStatus, instance_for_test
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from xirang_platform.control import run_tags as rt
from xirang_platform.dagster_compat import (
    GrpcServerCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
    create_run_for_test,
)
from xirang_platform.ledger import Ledger
from xirang_platform.ledger.read_only import read_figures
from xirang_platform.operations.exporter import XirangCollector, scrape
from xirang_platform.operations.tick_record import read_histograms, record_steps
from xirang_platform.operations.waiting import waiting_runs
from xirang_platform.pool.model import GpuModel, Node, Pool
from xirang_platform.scheduling.model import Allocation, GpuSlice, NodeShare, Placement, PreemptReason, Request, Tier
from xirang_platform.scheduling.quota import OvercommitPolicy

DEFAULT_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
TARGET_S = 1.0
TENANTS = {
    "research": ("llm", "vision"),
    "product": ("serving", "ranking"),
    "ads": ("ctr", "bids"),
    "lab": ("rl", "cv"),
}
TIERS = [Tier.OFFLINE_TRAINING, Tier.ONLINE_TRAINING, Tier.BATCH_INFERENCE]


def one_gpu(rid: str, i: int, tenant: str, project: str) -> Allocation:
    node = f"n{i // 8:05d}"
    request = Request(rid, tenant, project, TIERS[i % len(TIERS)], submit_time=float(i), gpus=1)
    return Allocation(
        request, Placement((GpuSlice(node, i % 8, 1000),), (NodeShare(node, 0, 0),)), start=float(i), confirmed=False
    )


def fill_ledger(ledger: Ledger, n: int) -> None:
    """`n` live allocations (every other one committed), 10% more released, 1% of those preempted."""
    for tenant, projects in TENANTS.items():
        ledger.add_tenant(tenant, n * 1000 // (2 * len(TENANTS)))  # half the demand fits in quota
        for p in projects:
            ledger.add_project(tenant, p)
    pairs = [(t, p) for t, ps in TENANTS.items() for p in ps]
    extra = n // 10
    total = n + extra
    ids = [f"run-{i:06d}" for i in range(total)]
    for start in range(0, total, 500):
        batch = [one_gpu(ids[i], i, *pairs[i % len(pairs)]) for i in range(start, min(total, start + 500))]
        ledger.reserve_allocations(batch)
        ledger.commit_many([a.id for a in batch[::2]])
    gone = ids[n:]
    for i, rid in enumerate(gone):
        if i % 10 == 0:
            ledger.preempt(rid, by="bench", reason=PreemptReason.PRIORITY, auto_return=False)
    ledger.release_many([rid for i, rid in enumerate(gone) if i % 10 != 0], auto_return=False)


def queue_runs(instance: object, n: int, now: float) -> None:
    pairs = [(t, p) for t, ps in TENANTS.items() for p in ps]
    location = GrpcServerCodeLocationOrigin(host="localhost", port=4000, location_name="bench")
    origin = RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), "bench_job")
    reasons = ["capacity: no room for 8 GPUs now; 3 ahead", "quota: tenant ads at its cap", "queued: waiting"]
    for i in range(n):
        tenant, project = pairs[i % len(pairs)]
        tags = {
            rt.GATE: rt.GATE_CLOSED,
            rt.TENANT: tenant,
            rt.PROJECT: project,
            rt.TIER: TIERS[i % len(TIERS)].value,
            rt.GPUS: "8",
            rt.HOLD_REASON: reasons[i % len(reasons)],
            rt.SUBMIT_TIME: f"{now - i:.3f}",
        }
        create_run_for_test(
            instance, job_name="bench_job", status=DagsterRunStatus.QUEUED, tags=tags, remote_job_origin=origin
        )


def bench_pool(allocations: int) -> Pool:
    model = GpuModel("H100-SXM", 80 * 1024, 90)
    nodes = tuple(
        Node(f"n{i:05d}", model, 8, 224_000, 2 * 1024 * 1024, f"d{i // 32}") for i in range(allocations // 8 + 1)
    )
    return Pool(nodes, "bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--allocations", type=int, default=10_000)
    parser.add_argument("--queued", type=int, default=5_000)
    parser.add_argument("--scrapes", type=int, default=7)
    parser.add_argument("--url", default=os.environ.get("XIRANG_TEST_POSTGRES_URL", DEFAULT_URL))
    args = parser.parse_args()

    base = make_url(args.url)
    name = f"xirang_bench_metrics_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    db_url = base.set(database=name).render_as_string(hide_password=False)
    try:
        engine = create_engine(db_url)
        with engine.begin() as conn:
            conn.execute(text("CREATE SCHEMA xirang_ledger"))
        engine.dispose()
        ledger_url = make_url(db_url).update_query_dict({"options": "-csearch_path=xirang_ledger"})
        ledger = Ledger(ledger_url.render_as_string(hide_password=False))
        now = time.time()
        t = time.perf_counter()
        fill_ledger(ledger, args.allocations)
        fill_s = time.perf_counter() - t
        with instance_for_test(overrides={"storage": {"postgres": {"postgres_url": db_url}}}) as instance:
            t = time.perf_counter()
            queue_runs(instance, args.queued, now)
            queue_s = time.perf_counter() - t
            for _ in range(10):
                record_steps(instance, {"read": 12.0, "reconcile": 3.0, "plan": 80.0, "ledger": 25.0, "gates": 9.0})
            collector = XirangCollector(ledger, instance, bench_pool(args.allocations), OvercommitPolicy())
            times, body = [], ""
            for _ in range(args.scrapes):
                t = time.perf_counter()
                body = scrape(collector)
                times.append(time.perf_counter() - t)
            parts: dict[str, list[float]] = {"ledger": [], "waiting_runs": [], "tick_record": []}
            for _ in range(args.scrapes):
                for part, read in (
                    ("ledger", lambda: read_figures(ledger)),
                    ("waiting_runs", lambda: waiting_runs(instance)),
                    ("tick_record", lambda: read_histograms(instance)),
                ):
                    t = time.perf_counter()
                    read()
                    parts[part].append(time.perf_counter() - t)
            # Memory in a scrape of its own: tracemalloc slows allocation-heavy code several times over.
            tracemalloc.start()
            scrape(collector)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        ledger.close()
        live = sum(1 for line in body.splitlines() if line.startswith("xirang_up "))
        print(
            json.dumps(
                {
                    "allocations_live": args.allocations,
                    "allocations_released": args.allocations // 10,
                    "queued_runs": args.queued,
                    "setup_s": {"ledger": round(fill_s, 1), "queued_runs": round(queue_s, 1)},
                    "scrape_s": {
                        "first": round(times[0], 4),
                        "median": round(statistics.median(times), 4),
                        "max": round(max(times), 4),
                        "scrapes": len(times),
                    },
                    "read_median_s": {k: round(statistics.median(v), 4) for k, v in parts.items()},
                    "target_s": TARGET_S,
                    "load_average_1m": round(os.getloadavg()[0], 2),
                    "within_target": statistics.median(times) < TARGET_S,
                    "scrape_python_peak_mib": round(peak / 2**20, 2),
                    "process_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                    "body_bytes": len(body),
                    "samples": sum(1 for line in body.splitlines() if line and not line.startswith("#")),
                    "up": live == 1 and "xirang_up 1.0" in body,
                    "python": platform.python_version(),
                    "cpus": os.cpu_count(),
                },
                sort_keys=True,
            )
        )
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
