"""A seeded random workload of concurrent ledger writers (the concurrency test and `bench/ledger.py`).

Each writer is its own process with its own connections, as several Dagster processes would be.
A writer either runs random reserve/commit/release calls (`random_calls`) or full admission cycles
(`cycles`: reserve, commit, release, optionally a batch per transaction as one scheduling cycle
would), and reports what it did. All writers start together at a
barrier so they contend for the same accounts.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from xirang_platform.ledger.ledger import Ledger
from xirang_platform.scheduling.model import Allocation, GpuSlice, NodeShare, Placement, Request, Tier

TIERS = (Tier.INFERENCE, Tier.ONLINE_TRAINING, Tier.OFFLINE_TRAINING)
FRACTIONS = (0.0, 0.0, 0.8, 0.95)
START_TIMEOUT_S = 300


@dataclass
class WriterReport:
    """What one writer did: counts per outcome, errors, and its busy seconds."""

    writer: int
    calls: int = 0  # ledger calls, each one transaction
    in_quota: int = 0
    borrowed: int = 0
    refused: int = 0
    commits: int = 0
    releases: int = 0
    returned: int = 0
    cycles: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True)
class Workload:
    """Who the writers charge and how: `accounts` are (tenant, project) pairs picked at random."""

    url: str
    accounts: tuple[tuple[str, str], ...]
    calls: int
    mode: str = "random"  # "random": reserve/commit/release mix; "cycles": reserve+commit+release
    gpus: tuple[int, ...] = (1, 1, 2)
    hold: int = 3  # random mode: live allocations a writer aims to hold
    seed: int = 0
    per_writer: tuple[tuple[tuple[str, str], ...], ...] = ()  # writer i charges only per_writer[i]
    batch: int = 1  # cycles mode: requests per transaction

    def accounts_of(self, writer: int) -> tuple[tuple[str, str], ...]:
        """The (tenant, project) pairs writer `writer` charges."""
        return self.per_writer[writer] if self.per_writer else self.accounts


def placed(request: Request, writer: int) -> Allocation:
    """`request` admitted on the writer's own node (the ledger stores a placement; where is immaterial here)."""
    node = f"node-{writer}"
    slices = tuple(GpuSlice(node, g, request.milli_per_gpu) for g in range(request.gpus))
    return Allocation(request, Placement(slices, (NodeShare(node, 0, 0),)), start=0.0, confirmed=False)


def random_calls(ledger: Ledger, work: Workload, writer: int, report: WriterReport) -> None:
    """`work.calls` random reserve/commit/release calls, keeping about `work.hold` allocations live."""
    rng = random.Random(f"{work.seed}-{writer}")
    reserved: list[str] = []
    committed: list[str] = []
    for i in range(work.calls):
        live = len(reserved) + len(committed)
        roll = rng.random()
        fraction = rng.choice(FRACTIONS)
        if live == 0 or (live < work.hold and roll < 0.5) or roll < 0.3:
            tenant, project = rng.choice(work.accounts_of(writer))
            r = Request(f"w{writer}-{i}", tenant, project, rng.choice(TIERS), 0.0, gpus=rng.choice(work.gpus))
            got = ledger.reserve(placed(r, writer), fraction)
            if got.borrowed:
                report.borrowed += 1
            elif got.admitted:
                report.in_quota += 1
            else:
                report.refused += 1
            if got.admitted:
                reserved.append(r.id)
        elif reserved and roll < 0.65:
            rid = reserved.pop(rng.randrange(len(reserved)))
            ledger.commit(rid)
            committed.append(rid)
            report.commits += 1
        else:
            pool = committed if committed and (not reserved or rng.random() < 0.7) else reserved
            rid = pool.pop(rng.randrange(len(pool)))
            report.returned += len(ledger.release(rid, allocated_fraction=fraction))
            report.releases += 1
        report.calls += 1


def cycles(ledger: Ledger, work: Workload, writer: int, report: WriterReport) -> None:
    """`work.calls` admission cycles of P0 requests, `work.batch` at a time: reserve the batch in one
    transaction, commit the admitted ones in one, release them in one."""
    rng = random.Random(f"{work.seed}-{writer}")
    for first in range(0, work.calls, work.batch):
        batch = []
        for i in range(first, min(first + work.batch, work.calls)):
            tenant, project = rng.choice(work.accounts_of(writer))
            r = Request(f"c{writer}-{i}", tenant, project, Tier.INFERENCE, 0.0, gpus=rng.choice(work.gpus))
            batch.append(placed(r, writer))
        got = ledger.reserve_allocations(batch)
        admitted = [r.request_id for r in got if r.admitted]
        report.refused += len(batch) - len(admitted)
        report.calls += 1
        if admitted:
            ledger.commit_many(admitted)
            ledger.release_many(admitted)
            report.calls += 2
        report.in_quota += len(admitted)
        report.cycles += len(admitted)


def _writer(work: Workload, writer: int, barrier: Any, out: Any) -> None:
    report = WriterReport(writer)
    ledger = Ledger(work.url, migrate=False)
    try:
        ledger.accounts()  # connect before the start line
        barrier.wait(timeout=START_TIMEOUT_S)
        start = time.perf_counter()
        (cycles if work.mode == "cycles" else random_calls)(ledger, work, writer, report)
        report.seconds = time.perf_counter() - start
    except Exception as e:  # noqa: BLE001 - reported to the parent, which fails
        report.errors.append(f"{type(e).__name__}: {e}")
    finally:
        ledger.close()
        out.put(asdict(report))


def run_writers(work: Workload, writers: int) -> tuple[list[WriterReport], float]:
    """Run `writers` processes on `work` together; their reports and the wall seconds from the
    start line to the last one done."""
    # A fork server imports the ledger once and forks clean writers from it: quick to start, and
    # no writer inherits the caller's open database connections.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    barrier = ctx.Barrier(writers + 1)
    out = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(work, w, barrier, out)) for w in range(writers)]
    for p in procs:
        p.start()
    # A writer that dies before the start line breaks the barrier instead of hanging the parent.
    barrier.wait(timeout=START_TIMEOUT_S)
    start = time.perf_counter()
    reports = [WriterReport(**out.get()) for _ in procs]
    wall = time.perf_counter() - start
    for p in procs:
        p.join()
    return sorted(reports, key=lambda r: r.writer), wall
