"""What the tick's lease and the ledger's capacity check cost, on SQLite and PostgreSQL.

Usage: .venv/bin/python bench/tick_lease.py [--repeat 30] [--held 400] [--admits 50] [--pg-url ...]

- lease: taking and giving back `Ledger.tick_lease()` (milliseconds, median and max of `--repeat`);
- apply_cycle: one cycle of `--admits` one-GPU admissions over a ledger holding `--held` live
  allocations on a pool of 64 eight-GPU nodes, without the pool (no capacity check) and with it
  (median milliseconds of `--repeat`, the cycle released again after each run).

Prints one JSON object. PostgreSQL runs in a fresh schema, dropped afterwards.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from xirang_platform.ledger import Ledger
from xirang_platform.pool.model import GpuModel, Node, Pool
from xirang_platform.scheduling.model import (
    Admit,
    Allocation,
    GpuSlice,
    NodeShare,
    Placement,
    Request,
    Tier,
)
from xirang_platform.scheduling.result import CycleResult

POOL = Pool(tuple(Node(f"n{i:02d}", GpuModel("H100", 81559, 989), 8, 64_000, 512_000, "d0") for i in range(64)))


def one_gpu(rid: str, k: int) -> Allocation:
    """A whole GPU number `k` of the pool (node k // 8, GPU k % 8)."""
    node = f"n{k // 8:02d}"
    request = Request(rid, "acme", "vision", Tier.OFFLINE_TRAINING, submit_time=0.0, gpus=1)
    return Allocation(
        request, Placement((GpuSlice(node, k % 8, 1000),), (NodeShare(node, 100, 1024),)), start=0.0, confirmed=False
    )


def timed(call: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        call()
        out.append((time.perf_counter() - t) * 1000)
    return out


def measure(url: str, repeat: int, held: int, admits: int) -> dict[str, float]:
    ledger = Ledger(url)
    ledger.add_tenant("acme", 1_000_000)
    ledger.add_project("acme", "vision")
    ledger.reserve_allocations([one_gpu(f"held-{k}", k) for k in range(held)])

    def lease() -> None:
        with ledger.tick_lease() as busy:
            assert busy == ""

    def cycle(pool: Pool | None) -> Callable[[], object]:
        batch = [one_gpu(f"new-{k}", k) for k in range(held, held + admits)]

        def run() -> None:
            ledger.apply_cycle(CycleResult(admits=tuple(Admit(a) for a in batch)), pool=pool)
            ledger.release_many([a.id for a in batch])

        return run

    lease_ms = timed(lease, repeat)
    plain: list[float] = []
    checked: list[float] = []
    for _ in range(repeat):  # alternated, so both see the same number of released rows
        plain += timed(cycle(None), 1)
        checked += timed(cycle(POOL), 1)
    ledger.close()
    return {
        "lease_median_ms": round(statistics.median(lease_ms), 3),
        "lease_max_ms": round(max(lease_ms), 3),
        "apply_cycle_median_ms": round(statistics.median(plain), 2),
        "apply_cycle_with_pool_median_ms": round(statistics.median(checked), 2),
    }


def main() -> None:
    """Measure both backends and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--held", type=int, default=400)
    parser.add_argument("--admits", type=int, default=50)
    parser.add_argument("--pg-url", default="postgresql+psycopg2://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    out: dict[str, object] = {"held": args.held, "admits": args.admits, "repeat": args.repeat}
    with tempfile.TemporaryDirectory() as tmp:
        out["sqlite"] = measure(f"sqlite:///{Path(tmp) / 'ledger.sqlite'}", args.repeat, args.held, args.admits)
    schema = f"bench_tick_lease_{uuid.uuid4().hex[:8]}"
    admin = create_engine(args.pg_url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        url = make_url(args.pg_url).update_query_dict({"options": f"-csearch_path={schema}"})
        out["postgres"] = measure(url.render_as_string(hide_password=False), args.repeat, args.held, args.admits)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
