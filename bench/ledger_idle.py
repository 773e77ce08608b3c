"""The live tick's idle-history read (`Ledger.idle_history`) against a long ledger, with the index on
`entries.at` (migration 0004) and, in the same run, without it (the baseline).

A SQLite ledger of two tenants gets `--allocations` allocations reserved, committed and released in
batches of 100, one batch every 1,000 s, so the last `lend_after_s` (1,800 s) holds two batches and
everything before it is history the read should not touch. Prints one JSON line: entries, then the
median read time with and without the index.

    .venv/bin/python bench/ledger_idle.py [--allocations 20000] [--repeat 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from sqlalchemy import func, select, text

from xirang_platform.ledger import Ledger
from xirang_platform.ledger.tables import ENTRIES
from xirang_platform.scheduling.model import Allocation, GpuSlice, NodeShare, Placement, Request, Tier

BATCH = 100
SPACING_S = 1000.0
LEND_AFTER_S = 1800.0


def _allocation(i: int) -> Allocation:
    tenant, project = ("acme", "vision") if i % 2 else ("beta", "web")
    request = Request(f"r{i}", tenant, project, Tier.OFFLINE_TRAINING, 0.0, gpus=1)
    node = f"n{i % BATCH}"
    return Allocation(request, Placement((GpuSlice(node, 0, 1000),), (NodeShare(node, 0, 0),)), 0.0, confirmed=False)


def _fill(ledger: Ledger, clock: list[float], allocations: int) -> None:
    for tenant, project in (("acme", "vision"), ("beta", "web")):
        ledger.add_tenant(tenant, 100_000)
        ledger.add_project(tenant, project)
    for start in range(0, allocations, BATCH):
        clock[0] = start / BATCH * SPACING_S
        batch = [_allocation(i) for i in range(start, min(start + BATCH, allocations))]
        ledger.reserve_allocations(batch)
        ledger.commit_many([a.id for a in batch])
        ledger.release_many([a.id for a in batch])


def _median_ms(ledger: Ledger, now: float, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        ledger.idle_history(now - LEND_AFTER_S).lasting_idle(now, LEND_AFTER_S)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 2)


def main() -> None:
    """Build the ledger, time the read with the index, drop it, time it again; print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allocations", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    clock = [0.0]
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(f"sqlite:///{tmp}/ledger.sqlite", clock=lambda: clock[0])
        _fill(ledger, clock, args.allocations)
        now = clock[0] + SPACING_S / 2
        with ledger.engine.connect() as conn:
            entries = conn.execute(select(func.count()).select_from(ENTRIES)).scalar()
        indexed = _median_ms(ledger, now, args.repeat)
        with ledger.engine.begin() as conn:
            conn.execute(text("DROP INDEX ix_entries_at"))
        baseline = _median_ms(ledger, now, args.repeat)
        ledger.close()
    print(json.dumps({"entries": entries, "read_ms_median": indexed, "baseline_no_index_ms_median": baseline}))


if __name__ == "__main__":
    main()
