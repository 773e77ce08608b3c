"""Ledger throughput on PostgreSQL: reserve+commit+release cycles per second, 1 and 8 writers.

Usage: .venv/bin/python bench/ledger.py [--cycles 400] [--writers 1,8] [--batches 1,16] [--url ...]

Each writer is a process doing admission cycles (reserve a P0 request of 1-2 GPUs, commit it,
release it), each step a durable transaction; with `--batches 16` a writer reserves 16 requests in
one transaction (as one scheduling cycle's admissions would be), commits them in one and releases
them in one. Two layouts: every writer charging one shared tenant whose cap the writers' demand
slightly exceeds (they take turns on its row locks; some reserves are refused), and one tenant per
writer (no lock contention). After each run the entries are replayed
to count over-admissions (must be 0) and `rebuild()` must agree with the balances.

The baseline, measured in the same run on the same server: single-row insert+commit transactions
per second on one connection, the cost floor of any durable transaction here (WAL fsync).
Prints one JSON object. Runs in a fresh schema, dropped afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import uuid

import psycopg2
from sqlalchemy import create_engine, delete, text
from sqlalchemy.engine import make_url

from xirang_platform.ledger import Ledger
from xirang_platform.ledger.loadgen import Workload, run_writers
from xirang_platform.ledger.rebuild import cap_violations
from xirang_platform.ledger.tables import ledger_registry

DEFAULT_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
TARGET_ADMISSIONS_PER_S = 500


def baseline_commits_per_s(url: str, schema: str, n: int = 300) -> float:
    """Durable single-row insert+commit transactions per second on one connection."""
    u = make_url(url)
    conn = psycopg2.connect(
        host=u.host, port=u.port or 5432, user=u.username, password=u.password, dbname=u.database,
        options=f"-csearch_path={schema}",
    )  # fmt: skip
    cur = conn.cursor()
    cur.execute("CREATE TABLE baseline_probe (x int)")
    conn.commit()
    start = time.perf_counter()
    for i in range(n):
        cur.execute("INSERT INTO baseline_probe VALUES (%s)", (i,))
        conn.commit()
    elapsed = time.perf_counter() - start
    cur.execute("DROP TABLE baseline_probe")
    conn.commit()
    conn.close()
    return n / elapsed


def run_case(url: str, writers: int, cycles: int, layout: str, batch: int, seed: int) -> dict[str, object]:
    """One run on an empty ledger: its throughput and its over-admission count."""
    ledger = Ledger(url, migrate=False)
    with ledger.engine.begin() as conn:
        for table in reversed(ledger_registry.metadata.sorted_tables):  # children first
            conn.execute(delete(table))
    if layout == "shared":
        # In flight at once: writers x batch requests of 1.33 GPUs on average (1, 1 or 2) against a
        # cap of writers x batch x 1.2 GPUs: near the cap, some P0 reserves are refused.
        ledger.add_tenant("t0", 1000 * writers * batch)
        ledger.add_project("t0", "p0", 1000 * writers * batch)
        ledger.add_project("t0", "p1")
        accounts: tuple[tuple[str, str], ...] = (("t0", "p0"), ("t0", "p1"))
        per_writer = [accounts] * writers
    else:
        # One tenant per writer, with room for its whole batch: no contention, no refusals.
        per_writer = []
        for w in range(writers):
            ledger.add_tenant(f"t{w}", 2000 * batch)
            ledger.add_project(f"t{w}", f"p{w}", 2000 * batch)
            per_writer.append(((f"t{w}", f"p{w}"),))
        accounts = tuple(a for pw in per_writer for a in pw)
    work = Workload(url, accounts, calls=cycles, mode="cycles", seed=seed, per_writer=tuple(per_writer), batch=batch)
    reports, wall = run_writers(work, writers)
    entries = ledger.entries()
    over = len(cap_violations(entries)) + len(cap_violations(entries, ratio=ledger.policy.max_ratio))
    rebuild_ok = ledger.rebuild().ok
    ledger.close()
    done = sum(r.cycles for r in reports)
    return {
        "writers": writers,
        "layout": layout,
        "batch": batch,
        "cycles": done,
        "refused": sum(r.refused for r in reports),
        "transactions": sum(r.calls for r in reports),
        "seconds": round(wall, 3),
        "cycles_per_s": round(done / wall, 1),
        "transactions_per_s": round(sum(r.calls for r in reports) / wall, 1),
        "over_admissions": over,
        "rebuild_ok": rebuild_ok,
        "errors": [e for r in reports for e in r.errors],
    }


def main() -> None:
    """Run the bench and print its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("XIRANG_TEST_POSTGRES_URL", DEFAULT_URL))
    parser.add_argument("--cycles", type=int, default=400, help="admission cycles per writer")
    parser.add_argument("--writers", default="1,8", help="comma-separated writer counts")
    parser.add_argument("--batches", default="1,16", help="comma-separated requests per transaction")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    schema = f"xirang_ledger_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(args.url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = (
        make_url(args.url)
        .update_query_dict({"options": f"-csearch_path={schema}"})
        .render_as_string(hide_password=False)
    )
    try:
        Ledger(url).close()  # migrate the fresh schema
        baseline = baseline_commits_per_s(args.url, schema)
        runs = [
            run_case(url, writers, args.cycles, layout, batch, args.seed)
            for batch in (int(b) for b in args.batches.split(","))
            for writers in (int(w) for w in args.writers.split(","))
            for layout in ("shared", "per-tenant")
        ]
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()
    with psycopg2.connect(args.url.replace("postgresql+psycopg2", "postgresql")) as conn, conn.cursor() as cur:
        cur.execute("SHOW server_version")
        server = cur.fetchone()[0]
    best8 = max((r["cycles_per_s"] for r in runs if r["writers"] == 8), default=None)
    unbatched8 = max((r["cycles_per_s"] for r in runs if r["writers"] == 8 and r["batch"] == 1), default=None)
    print(
        json.dumps(
            {
                "bench": "ledger",
                "unit": "admission cycles (reserve+commit+release, 3 durable transactions) per second",
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "postgres": server},
                "baseline_commits_per_s": round(baseline, 1),
                "runs": runs,
                "target_admissions_per_s_8_writers": TARGET_ADMISSIONS_PER_S,
                "best_8_writers": best8,
                "best_8_writers_one_request_per_transaction": unbatched8,
                "meets_target": best8 is not None and best8 >= TARGET_ADMISSIONS_PER_S,
                "over_admissions": sum(r["over_admissions"] for r in runs),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
