"""The starvation bound (DESIGN.md 5.3) as a property over random multi-tenant replays: the oldest
blocked gang runs within the starvation wait plus the time for running work of its tier or below to
release enough units.

Each replay has one gang of tenant `a` (P1, or P2 that may need the heterogeneous fallback), submitted
first, that `a` could run in quota at the highest cap ratio; other tenants stream one- and two-GPU
P2 jobs over it, enough to fill the pool, so the ratio falls and the gang is starved by backfill unless
its hold holds. Multi-GPU P0 replicas of `ops` arrive too: inference goes first and may sit on the
held units, so the bound counts from the last replica admitted before the gang starts. A two-GPU job
that ran before the gang came and was preempted is requeued with its own submit time: it is then the
older starving gang and goes first (the oldest keeps where it fits), so the bound counts from its
admission too.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xirang_platform.pool.model import GpuModel, Node, Pool
from xirang_platform.scheduling.config import SchedulerConfig
from xirang_platform.scheduling.model import Request, Tier
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.simulate.events import check_events
from xirang_platform.simulate.replay import ReplayOptions, replay
from xirang_platform.simulate.traces import TraceJob

H100 = GpuModel("H100", 81559, 989)
WAIT_S = 900.0
LONGEST_S = 1_500.0  # the longest run of any job but the gang
CONFIG = SchedulerConfig(min_runtime_s=600, starvation_wait_s=WAIT_S)


def _job(job_id: str, tenant: str, tier: Tier, submit: float, gpus: int, duration: float, one_node: bool) -> TraceJob:
    request = Request(
        job_id, tenant, "default", tier, submit, gpus=gpus, cpu_milli=1000, memory_mib=1024, single_node=one_node
    )
    return TraceJob(request, duration)


def _stream_job(draw, k: int, submit: float, gpus: int) -> TraceJob:
    tenant = draw(st.sampled_from(["b", "c"]))
    return _job(
        f"s{k:03d}", tenant, Tier.OFFLINE_TRAINING, submit, gpus, draw(st.floats(100, LONGEST_S).map(round)), True
    )


@st.composite
def replays(draw) -> tuple[Pool, QuotaBook, list[TraceJob], str]:
    nodes = tuple(
        Node(f"n{i}", H100, draw(st.sampled_from([4, 8])), 64_000, 262_144, draw(st.sampled_from(["d0", "d1"])))
        for i in range(draw(st.integers(2, 4)))
    )
    pool = Pool(nodes, source="test")
    groups: dict[str, int] = {}
    for n in nodes:
        groups[n.domain] = groups.get(n.domain, 0) + n.gpus
    total = pool.gpu_milli // 1000
    # Work that was running before the gang came: 1-2 GPU jobs on about 60% of the pool.
    jobs, taken = [], 0
    while taken < 0.6 * total:
        gpus = draw(st.sampled_from([1, 2]))
        jobs.append(_stream_job(draw, len(jobs), 0.0, gpus))
        taken += gpus
    tier = draw(st.sampled_from([Tier.ONLINE_TRAINING, Tier.OFFLINE_TRAINING]))
    most = max(groups.values()) if tier is Tier.ONLINE_TRAINING else total
    gpus = draw(st.integers(min(most, total - taken + 1), most))  # mostly more than is free
    # a's quota: the gang fits a's cap at the highest ratio (1.2), maybe not at 1.0.
    a_quota = draw(st.integers(math.ceil(gpus / 1.2), gpus + 2))
    quotas = {"a": a_quota, "b": draw(st.integers(1, total)), "c": draw(st.integers(1, total)), "ops": 8}
    book = QuotaBook({t: q * 1000 for t, q in quotas.items()}, {(t, "default"): None for t in quotas})
    jobs.append(_job("gang", "a", tier, 10.0, gpus, 600.0, False))
    # Backfill from b and c, enough to keep the pool full for an hour.
    for _ in range(draw(st.integers(3 * total, 5 * total))):
        jobs.append(_stream_job(draw, len(jobs), draw(st.floats(10, 4_000).map(round)), draw(st.sampled_from([1, 2]))))
    for k in range(draw(st.integers(0, 3))):
        submit = draw(st.floats(0, 3_000).map(round))
        jobs.append(_job(f"p{k}", "ops", Tier.INFERENCE, submit, draw(st.integers(2, 4)), 300.0, True))
    return pool, book, sorted(jobs, key=lambda j: (j.request.submit_time, j.request.id)), tier.value


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replays())
def test_the_oldest_blocked_gang_runs_within_the_wait_plus_the_release_of_work_of_its_tier_or_below(case) -> None:
    pool, book, jobs, _ = case
    result = replay(pool, book, jobs, CONFIG, ReplayOptions(check_state=True))
    assert check_events(result.events, pool, book, CONFIG.overcommit) == []
    starts = [e["t"] for e in result.events if e["event"] == "admit" and e["job"] == "gang"]
    assert starts, "the gang never ran"
    older = {j.request.id for j in jobs if j.request.submit_time < 10.0 and j.request.gpus > 1}
    first = {e["job"]: e["t"] for e in reversed(result.events) if e["event"] == "admit"}
    goes_first = [
        e["t"]
        for e in result.events
        if e["event"] == "admit" and (e["job"].startswith("p") or (e["job"] in older and e["t"] > first[e["job"]]))
    ]
    held_from = max([10.0 + WAIT_S, *(t for t in goes_first if t <= starts[0])])
    assert starts[0] <= held_from + LONGEST_S
