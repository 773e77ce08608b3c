"""Replay: small synthetic traces with known answers, invariants on random traces, and real-trace slices."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.simulate.sim_builders import book, job, node, pool
from xirang_platform.pool.model import Pool
from xirang_platform.pool.openb_csv import read_openb_nodes
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.scheduling.snapshot import SchedulerConfig
from xirang_platform.simulate.events import check_events
from xirang_platform.simulate.metrics import compute_metrics
from xirang_platform.simulate.replay import ReplayOptions, TraceSource, replay
from xirang_platform.simulate.traces import TraceJob, read_itp_jobs, read_openb_pods

REPO = Path(__file__).resolve().parents[2]
OPENB = REPO / "data/traces/alibaba_openb_gpu_2023"
ITP01 = REPO / "data/traces/microsoft_itp_elasticflow_2021/cluster01.csv"
CHECKED = ReplayOptions(check_state=True)


def _run(
    p: Pool, b: QuotaBook, jobs: list[TraceJob], config: SchedulerConfig | None = None, options: ReplayOptions = CHECKED
):
    result = replay(p, b, jobs, config, options)
    assert check_events(result.events, p, b) == []
    return result


def _timeline(events: list[dict]) -> list[tuple]:
    return [(e["t"], e["event"], e["job"]) for e in events]


ONE_GPU = pool(node("n0", gpus=1))


def test_two_jobs_on_one_gpu_queue_and_the_second_starts_when_the_first_finishes() -> None:
    result = _run(ONE_GPU, book(default=1), [job("a", submit=0, duration=100), job("b", submit=10, duration=50)])
    assert _timeline(result.events) == [
        (0, "submit", "a"),
        (0, "admit", "a"),
        (10, "submit", "b"),
        (100, "finish", "a"),
        (100, "admit", "b"),
        (150, "finish", "b"),
    ]
    m = compute_metrics(result.events, capacity_gpus=1)
    # Training waits 0 and 90 s; JCTs 100 and 140 s; the GPU is busy 0..150 of 150 s.
    assert (m["training_wait_mean_s"], m["training_jct_mean_s"], m["utilization"]) == (45.0, 120.0, 1.0)
    assert result.waiting == []


@pytest.mark.parametrize(
    ("trace", "reason"),
    [
        pytest.param([job("big", gpus=4)], "never-fits", id="more GPUs than any node has"),
        pytest.param([job("stranger", tenant="nobody")], "unknown-account", id="an account the book lacks"),
    ],
)
def test_a_request_that_can_never_run_is_rejected_at_once(trace: list[TraceJob], reason: str) -> None:
    result = _run(pool(node("n0", gpus=2)), book(default=2), trace)
    assert [(e["t"], e["event"]) for e in result.events] == [(0, "submit"), (0, "reject")]
    assert result.events[-1]["reason"] == reason


# One minimum runtime for every preemptor, P0 included (the default spares P0 from it).
ONE_MIN_RUNTIME = SchedulerConfig(min_runtime_s=600, min_runtime_by_level=())


def test_inference_preempts_batch_once_it_outlives_the_minimum_runtime_and_the_victim_restarts() -> None:
    trace = [job("batch", submit=0, duration=5000), job("web", submit=100, duration=50, tier="inference")]
    result = _run(ONE_GPU, book(default=1), trace, ONE_MIN_RUNTIME)
    assert _timeline(result.events) == [
        (0, "submit", "batch"),
        (0, "admit", "batch"),
        (100, "submit", "web"),
        # No event at 600: the replay's timer wakes a cycle when the batch job becomes preemptible.
        (600, "preempt", "batch"),
        (600, "admit", "web"),
        (650, "finish", "web"),
        (650, "admit", "batch"),
        (5650, "finish", "batch"),  # work lost: the whole 5000 s again
    ]
    pre = result.events[3]
    assert (pre["by"], pre["reason"], pre["lost_gpu_s"]) == ("web", "priority", 600.0)
    assert compute_metrics(result.events, 1)["inference_wait_p99_s"] == pytest.approx(500.0)


def test_by_default_inference_does_not_wait_for_its_victim_to_reach_the_training_minimum_runtime() -> None:
    trace = [job("batch", submit=0, duration=5000), job("web", submit=100, duration=50, tier="inference")]
    result = _run(ONE_GPU, book(default=1), trace, SchedulerConfig(min_runtime_s=600))
    assert _timeline(result.events) == [
        (0, "submit", "batch"),
        (0, "admit", "batch"),
        (100, "submit", "web"),
        (100, "preempt", "batch"),
        (100, "admit", "web"),
        (150, "finish", "web"),
        (150, "admit", "batch"),
        (5150, "finish", "batch"),  # work lost: the 100 s it had run
    ]
    assert result.events[3]["lost_gpu_s"] == 100.0
    assert compute_metrics(result.events, 1)["inference_wait_p99_s"] == 0.0


def test_with_checkpoints_a_victim_resumes_from_its_last_checkpoint() -> None:
    trace = [job("batch", submit=0, duration=5000), job("web", submit=100, duration=50, tier="inference")]
    result = _run(
        ONE_GPU,
        book(default=1),
        trace,
        ONE_MIN_RUNTIME,
        ReplayOptions(checkpoint_interval_s=250, check_state=True),
    )
    # Ran 600 s, checkpoints at 250 and 500: 100 s lost, 4500 s left after the restart at 650.
    assert result.events[3]["lost_gpu_s"] == 100.0
    assert _timeline(result.events)[-1] == (5150, "finish", "batch")


def test_a_positive_interval_runs_cycles_on_its_ticks_only() -> None:
    result = _run(ONE_GPU, book(default=1), [job("a", submit=3, duration=20)], options=ReplayOptions(interval_s=10))
    assert _timeline(result.events) == [(3, "submit", "a"), (10, "admit", "a"), (30, "finish", "a")]


def test_a_gang_spreads_over_nodes_of_one_domain() -> None:
    p = pool(node("n0", gpus=2), node("n1", gpus=2), node("m0", gpus=2, domain="d1"))
    gang = replace(job("g", gpus=4, single_node=False, tier="online-training"), duration_s=10)
    result = _run(p, book(default=6), [gang])
    admit = result.events[1]
    assert sorted({s["node"] for s in admit["alloc"]}) == ["n0", "n1"]
    assert len(admit["alloc"]) == 4


def test_a_borrowed_allocation_returns_when_its_tenant_is_back_under_its_cap() -> None:
    trace = [job("a1", duration=100, tenant="acme"), job("a2", duration=1000, tenant="acme")]
    result = _run(pool(node("n0", gpus=2)), book(acme=1, other=1), trace)
    admits = {e["job"]: e["borrowed"] for e in result.events if e["event"] == "admit"}
    assert admits == {"a1": False, "a2": True}  # 2 GPUs > cap 1.2: the second runs borrowed
    assert (100, "return", "a2") in _timeline(result.events)


def test_load_sources_can_be_combined() -> None:
    sources = [TraceSource([job("a", submit=0)]), TraceSource([job("b", submit=5)])]
    result = replay(pool(node("n0", gpus=2)), book(default=2), sources)
    assert [e["job"] for e in result.events if e["event"] == "admit"] == ["a", "b"]


def test_a_job_id_submitted_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="submitted twice"):
        replay(ONE_GPU, book(default=1), [TraceSource([job("a")]), TraceSource([job("a", submit=1)])])


# --- invariants on random traces -------------------------------------------------------------------

SMALL = pool(
    node("n0", gpus=2, cpu=16000, mem=65536),
    node("n1", gpus=2, cpu=16000, mem=65536),
    node("m0", model="A100", gpus=4, domain="d1"),
)
TIERS = ["inference", "online-training", "offline-training"]


@st.composite
def traces(draw) -> list[TraceJob]:
    n = draw(st.integers(1, 12))
    out = []
    for i in range(n):
        gpus = draw(st.sampled_from([0, 1, 1, 2, 4]))
        milli = draw(st.sampled_from([250, 500, 1000])) if gpus == 1 else 1000
        out.append(
            job(
                f"j{i}",
                submit=float(draw(st.integers(0, 2000))),
                duration=float(draw(st.integers(0, 3000))),
                gpus=gpus,
                milli=milli,
                tier=draw(st.sampled_from(TIERS)),
                tenant=draw(st.sampled_from(["acme", "beta"])),
                cpu=draw(st.sampled_from([500, 4000, 12000])),
                single_node=draw(st.booleans()),
            )
        )
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trace=traces(),
    min_runtime=st.sampled_from([0.0, 300.0]),
    interval=st.sampled_from([0.0, 60.0]),
    checkpoint=st.sampled_from([None, 100.0]),
)
def test_random_traces_keep_every_invariant_and_every_job_ends(
    trace: list[TraceJob], min_runtime: float, interval: float, checkpoint: float | None
) -> None:
    b = book(acme=4, beta=5)  # caps (x1.0 when full) hold the biggest request: P0 never borrows
    options = ReplayOptions(interval_s=interval, checkpoint_interval_s=checkpoint)
    result = _run(SMALL, b, trace, SchedulerConfig(min_runtime_s=min_runtime), replace(options, check_state=True))
    m = compute_metrics(result.events, SMALL.gpus)
    assert result.waiting == []
    again = replay(SMALL, b, list(reversed(trace)), SchedulerConfig(min_runtime_s=min_runtime), options)
    assert again.events == result.events  # deterministic, whatever order the jobs were listed in
    assert m["jobs_finished"] + m["jobs_rejected"] == len(trace)
    assert 0.0 <= m["utilization"] <= 1.0


# --- slices of the real traces ----------------------------------------------------------------------


def test_a_slice_of_the_openb_trace_with_two_tenants_keeps_the_invariants() -> None:
    nodes = read_openb_nodes(OPENB / "openb_node_list_gpu_node.csv", domain_size=8, unit_milli=1).nodes
    p = Pool(nodes[::100], source="openb every 100th node")  # 13 nodes, 56 GPUs of four models
    pods = read_openb_pods(OPENB / "openb_pod_list_default.csv")[:500]
    trace = [replace(j, request=replace(j.request, tenant="acme" if k % 3 else "beta")) for k, j in enumerate(pods)]
    b = QuotaBook(
        {"acme": p.gpu_milli * 6 // 10, "beta": p.gpu_milli * 4 // 10},
        {("acme", "default"): None, ("beta", "default"): None},
    )
    result = _run(p, b, trace)
    m = compute_metrics(result.events, p.gpus)
    assert m["jobs_finished"] + m["jobs_rejected"] == 500
    # The long-running pods of one tenant borrow, the other reclaims: the log exercises both.
    assert m["preemptions"] > 0
    assert m["returns"] > 0


def test_a_slice_of_the_itp_trace_with_two_tenants_queues_gangs_and_keeps_the_invariants() -> None:
    nodes = read_openb_nodes(OPENB / "openb_node_list_gpu_node.csv", domain_size=8, unit_milli=1).nodes
    g2 = [n for n in nodes if n.model_name == "G2"][:16]  # 128 GPUs in two domains of 8 nodes
    p = Pool(tuple(g2), source="16 G2 nodes")
    jobs = read_itp_jobs(ITP01)[:300]
    trace = [
        replace(
            j,
            request=replace(
                j.request,
                tenant="research" if k % 2 else "product",
                tier=j.request.tier if k % 4 else type(j.request.tier)("online-training"),
            ),
        )
        for k, j in enumerate(jobs)
    ]
    b = book(research=64, product=64)
    result = _run(p, b, trace)
    m = compute_metrics(result.events, p.gpus)
    assert m["jobs_finished"] + m["jobs_rejected"] == 300
    assert m["training_wait_mean_s"] > 0  # 64-GPU gangs make others wait
    assert m["preemptions"] > 0
    assert m["returns"] > 0
