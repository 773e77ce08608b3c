"""Random pools, requests and scenarios for the scheduler's property tests (hypothesis), and the one
scheduler config they run under: several tenants with small quotas (so work borrows, is reclaimed and
returned), fractional requests on nodes of mixed compute-unit sizes, P0 replicas with GPU memory, gangs."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from tests.scheduling.cycle_builders import MODELS
from xirang_platform.pool.model import Node, Pool
from xirang_platform.scheduling import quota
from xirang_platform.scheduling.config import SchedulerConfig
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.model import Allocation, PreemptReason, Request, Tier
from xirang_platform.scheduling.preemption.victims import victim_reason
from xirang_platform.scheduling.scorers import BestFit, RandomFit
from xirang_platform.scheduling.snapshot import Snapshot

TENANTS = ("a", "b", "c")
CYCLE_EVERY_S = 700.0
CONFIG = SchedulerConfig(min_runtime_s=600, starvation_wait_s=1_500, reclaim_backoff_s=1_000)


@st.composite
def pools(draw) -> Pool:
    """2-5 nodes of mixed models, GPU counts, memory, domains and compute-unit sizes."""
    nodes = []
    for i in range(draw(st.integers(2, 5))):
        model = draw(st.sampled_from(["H100", "A100", "L40S"]))
        nodes.append(
            Node(
                f"n{i}",
                MODELS[model],
                draw(st.sampled_from([2, 4, 8])),
                draw(st.sampled_from([32_000, 128_000])),
                512_000,
                draw(st.sampled_from(["d0", "d1"])),
                unit_milli=draw(st.sampled_from([1000, 250, 125])),
            )
        )
    return Pool(tuple(nodes))


@st.composite
def requests(draw, k: int) -> Request:
    """Request `r{k:03d}` of one of `TENANTS`: any tier, whole GPUs or one fraction, arriving at one of four times."""
    tier = draw(st.sampled_from(list(Tier)))
    fractional = draw(st.booleans())
    gpus = 1 if fractional else draw(st.integers(0, 12))
    return Request(
        id=f"r{k:03d}",
        tenant=draw(st.sampled_from(TENANTS)),
        project="default",
        tier=tier,
        submit_time=draw(st.sampled_from([0.0, 500.0, 1_500.0, 2_500.0])),
        gpus=gpus,
        milli_per_gpu=draw(st.sampled_from([125, 300, 500, 700])) if fractional else 1000,
        cpu_milli=draw(st.sampled_from([0, 2000, 16_000])),
        memory_mib=draw(st.sampled_from([0, 4096, 65_536])),
        gpu_memory_mib=draw(st.sampled_from([0, 20_000, 40_000, 60_000])) if tier is Tier.INFERENCE else 0,
        single_node=draw(st.booleans()),
    )


@st.composite
def scenarios(draw):
    """(pool, quota book, 1-25 requests, which allocation finishes after each of five cycles)."""
    pool = draw(pools())
    book = quota.QuotaBook(
        {t: draw(st.integers(1, 12)) * 1000 for t in TENANTS}, {(t, "default"): None for t in TENANTS}
    )
    reqs = [draw(requests(k)) for k in range(draw(st.integers(1, 25)))]
    finish_picks = draw(st.lists(st.integers(0, 1000), min_size=5, max_size=5))
    return pool, book, reqs, finish_picks


NOW = 5_000.0  # when `full_pools`' requests are planned


@st.composite
def full_pools(draw):
    """A pool filled by one cycle of random work started at random times, a request that may need
    a preemption, and the in-quota room its tenant has before any victim is relieved."""
    pool = draw(pools())
    book = quota.QuotaBook({t: 4000 for t in TENANTS}, {(t, "default"): None for t in TENANTS})
    work = [
        replace(
            r := draw(requests(k)),
            tier=draw(st.sampled_from([Tier.OFFLINE_TRAINING, Tier.BATCH_INFERENCE])),
            gpus=min(r.gpus, draw(st.sampled_from([1, 2, 4]))),  # small jobs fill the pool
        )
        for k in range(draw(st.integers(6, 14)))
    ]
    filled = cycle(Snapshot.build(pool, [], book), work, 0.0, replace(CONFIG, preemption=False))
    starts = draw(
        st.lists(
            st.sampled_from([0.0, 1_000.0, 2_500.0, 4_000.0]), min_size=len(filled.admits), max_size=len(filled.admits)
        )
    )
    running = [replace(a.allocation, start=t, confirmed=True) for a, t in zip(filled.admits, starts, strict=True)]
    urgent = replace(
        r := draw(requests(999)),
        id="urgent",
        gpus=min(max(r.gpus, 1), draw(st.sampled_from([1, 2, 4, 8]))),
        tier=draw(st.sampled_from([Tier.INFERENCE, Tier.ONLINE_TRAINING, Tier.OFFLINE_TRAINING])),
    )
    # The urgent tenant's quota: none, part of what it holds, all of it, far more (cap relief or not).
    share = draw(st.sampled_from([0.0, 0.5, 1.0, 1_000.0]))
    held = sum(a.milli for a in running if a.request.tenant == urgent.tenant and not a.borrowed)
    tenants = {t: (int(held * share) if t == urgent.tenant else 4000) for t in TENANTS}
    book = quota.QuotaBook(tenants, {(t, "default"): None for t in TENANTS})
    scorer = draw(st.sampled_from([BestFit(), RandomFit(3)]))
    return Snapshot.build(pool, running, book), urgent, scorer


def victims_of(snapshot: Snapshot, request: Request) -> list[tuple[Allocation, PreemptReason]]:
    """The running work `request` may preempt on `snapshot`, by id, with the reason (`victim_reason`)."""
    balances = quota.balances_from(snapshot.book, snapshot.allocations.values())
    found = []
    for a in sorted(snapshot.allocations.values(), key=lambda a: a.id):
        reason = victim_reason(request, a, snapshot.book, balances, 1.0)
        if reason is not None:
            found.append((a, reason))
    return found
