"""The preemption notice in the replay (`simulate/notice.py`): lost work and the preemptor's added wait
against hand-computed cases, the reservation, and notice 0 as today."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.simulate.sim_builders import book, job, node, pool
from xirang_platform.scheduling.model import GpuSlice, NodeShare, Placement
from xirang_platform.scheduling.snapshot import SchedulerConfig
from xirang_platform.simulate.events import check_events
from xirang_platform.simulate.metrics import compute_metrics
from xirang_platform.simulate.notice import NoticePolicy, drain_hold, notice_metrics
from xirang_platform.simulate.replay import ReplayOptions, replay
from xirang_platform.simulate.traces import TraceJob

CONFIG = SchedulerConfig(min_runtime_s=0)


def run(jobs: list[TraceJob], notice: float, cost: float, gpus: int = 2, tenants: dict | None = None):
    """Replay `jobs` on one node of `gpus` GPUs (tenant `default` owns them unless `tenants` says who
    does) with the notice; the invariant checker must find nothing."""
    p, b = pool(node("n0", gpus=gpus)), book(**(tenants or {"default": gpus}))
    options = ReplayOptions(checkpoint_interval_s=100, notice=NoticePolicy(notice, cost), check_state=True)
    result = replay(p, b, jobs, CONFIG, options)
    assert check_events(result.events, p, b) == []
    return result


def times(events: list[dict], kind: str, job_id: str) -> list[float]:
    return [e["t"] for e in events if e["event"] == kind and e["job"] == job_id]


# A 2-GPU P2 run from t=0 (1000 s of work, checkpoints every 100 s) and a 1-GPU P0 replica at t=250
# that preempts it (100 s of work).
TRAIN = job("train", duration=1000, gpus=2)
SERVE = job("serve", submit=250, duration=100, tier="inference")


@dataclass(frozen=True)
class Case:
    notice: float
    cost: float
    want_lost: float  # GPU-seconds
    want_serve_start: float
    want_train_finish: float


CASES = [
    pytest.param(
        # stopped at 250: 250 s run, 200 s checkpointed, 50 s x 2 GPUs lost; resumes at 350 with 800 s left
        Case(0, 0, want_lost=100.0, want_serve_start=250, want_train_finish=1150),
        id="no notice: the victim stops at once and loses the 50 s since its checkpoint at 200",
    ),
    pytest.param(
        # saves at 250 (all 250 s kept), stops at 265; serve 265-365; train resumes with 750 s left
        Case(60, 15, want_lost=0.0, want_serve_start=265, want_train_finish=1115),
        id="a checkpoint cost that fits the notice loses nothing and delays the preemptor by the cost",
    ),
    pytest.param(
        # runs to 310 and is killed: 310 s run, 300 s checkpointed, 10 s x 2 lost; serve 310-410, 700 s left
        Case(60, 90, want_lost=20.0, want_serve_start=310, want_train_finish=1110),
        id="a checkpoint cost past the notice runs out the grace and loses the work since its last checkpoint",
    ),
    pytest.param(
        # equal: it fits; saves at 250 and stops at 310
        Case(60, 60, want_lost=0.0, want_serve_start=310, want_train_finish=1160),
        id="a checkpoint cost equal to the notice still fits",
    ),
]


@pytest.mark.parametrize("tc", CASES)
def test_lost_work_and_added_wait_match_the_hand_computed_case(tc: Case) -> None:
    events = run([TRAIN, SERVE], tc.notice, tc.cost).events
    metrics = compute_metrics(events, 2) | notice_metrics(events, NoticePolicy(tc.notice, tc.cost))
    assert metrics["lost_gpu_seconds"] == pytest.approx(tc.want_lost)
    assert times(events, "admit", "serve") == [tc.want_serve_start]
    assert metrics["preemptor_wait_added_s_mean"] == pytest.approx(tc.want_serve_start - 250)
    assert metrics["preemption_notice_s"] == tc.notice
    assert times(events, "finish", "train") == [pytest.approx(tc.want_train_finish)]
    # the victim holds its GPUs until it stops: it is preempted then, not at the notice
    assert times(events, "preempt", "train") == [tc.want_serve_start]


def test_a_victim_whose_run_ends_within_the_grace_finishes_and_its_preemptor_starts_then() -> None:
    # train ends at 280, inside the grace (250-370) it would run out (cost 200 does not fit 120)
    events = run([job("train", duration=280, gpus=2), SERVE], 120, 200).events
    assert times(events, "finish", "train") == [280]
    assert times(events, "preempt", "train") == []
    assert times(events, "admit", "serve") == [280]
    assert compute_metrics(events, 2)["lost_gpu_seconds"] == 0.0


def test_nobody_takes_a_reserved_free_unit_during_the_grace() -> None:
    # 3 GPUs: train holds 0 and 1, GPU 2 is free. A 3-GPU replica preempts train at 250 and reserves
    # all three. `late` (1 GPU, at 255) would fit GPU 2: it is reserved, so late waits until the
    # replica finishes at 410 (train, resuming first, and late then share the node).
    late = job("late", submit=255, duration=50)
    serve = job("serve", submit=250, duration=100, gpus=3, tier="inference")
    events = run([TRAIN, serve, late], 60, 90, gpus=3).events
    reserved = [s["gpu"] for e in events if e["event"] == "reserve" for s in e["alloc"]]
    assert (times(events, "reserve", "serve"), sorted(reserved)) == ([250], [0, 1, 2])
    assert times(events, "admit", "serve") == [310]
    assert times(events, "admit", "late") == [410]


def test_nobody_takes_a_victims_unit_during_its_grace() -> None:
    # train holds both GPUs; the 1-GPU replica reserves one of them at 250, and train uses the other
    # until it is killed at 310. `late` (1 GPU, at 255) gets it then.
    late = job("late", submit=255, duration=50)
    events = run([TRAIN, SERVE, late], 60, 90).events
    assert times(events, "admit", "serve") == [310]
    assert times(events, "admit", "late") == [310]
    assert times(events, "preempt", "train") == [310]


def test_an_admission_of_the_preempting_cycle_on_a_victims_units_waits_for_it_to_stop() -> None:
    # `other` arrives with the replica: the cycle places it on train's second GPU, which train still
    # uses during its grace; it starts when train stops.
    other = job("other", submit=250, duration=50, tier="online-training")
    events = run([TRAIN, SERVE, other], 60, 15).events
    assert times(events, "admit", "other") == [265]
    assert times(events, "admit", "serve") == [265]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 600),  # submit
            st.integers(20, 800),  # duration
            st.integers(1, 2),  # gpus
            st.sampled_from(["inference", "online-training", "offline-training"]),
            st.sampled_from(["lab", "web"]),  # two tenants: reclaims of borrowed work too
        ),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from([(15, 5), (60, 30), (30, 60), (120, 15)]),
)
def test_any_workload_keeps_the_invariants_and_a_fitting_checkpoint_loses_nothing(specs, notice_cost) -> None:
    notice, cost = notice_cost
    jobs = [job(f"j{i}", submit=s, duration=d, gpus=g, tier=t, tenant=w) for i, (s, d, g, t, w) in enumerate(specs)]
    events = run(
        jobs, notice, cost, gpus=3, tenants={"lab": 1.5, "web": 1.5}
    ).events  # the checker finds nothing (in `run`)
    noticed: dict[str, dict] = {}  # victims told, not yet stopped
    for e in events:
        if e["event"] == "notice":
            noticed[e["job"]] = e
        elif e["event"] == "preempt" and e["job"] in noticed:
            assert e["t"] == noticed.pop(e["job"])["stops_at"]
            if cost <= notice:
                assert e["lost_gpu_s"] == 0.0
        elif e["event"] == "finish" and e["job"] in noticed:
            assert e["t"] <= noticed.pop(e["job"])["stops_at"]  # its run ended within its grace
    assert noticed == {}
    assert compute_metrics(events, 3)["jobs_unfinished"] == 0


def test_notice_zero_is_todays_replay() -> None:
    jobs = [job(f"j{i}", submit=37 * i, duration=300 + 11 * i, gpus=1 + i % 2, tier=t) for i, t in enumerate(TIERS)]
    today = replay(pool(node("n0", gpus=3)), book(default=3), jobs, CONFIG, ReplayOptions(checkpoint_interval_s=100))
    zero = run(jobs, 0, 0, gpus=3)
    assert zero.events == today.events
    assert not {"notice", "reserve"} & {e["event"] for e in zero.events}
    assert any(e["event"] == "preempt" for e in zero.events)  # the case preempts


TIERS = ["offline-training", "offline-training", "inference", "online-training", "inference", "offline-training"]


def test_the_hold_is_what_the_victims_use_beyond_the_reservations() -> None:
    victim = Placement((GpuSlice("n0", 0, 1000, 8), GpuSlice("n0", 1, 500, 4)), (NodeShare("n0", 4000, 100),))
    reserved = Placement((GpuSlice("n0", 0, 1000, 16), GpuSlice("n0", 2, 1000, 16)), (NodeShare("n0", 1000, 200),))
    hold = drain_hold([victim], [reserved])
    assert hold == Placement((GpuSlice("n0", 1, 500, 4),), (NodeShare("n0", 3000, 0),))


@pytest.mark.parametrize(
    ("notice", "cost"),
    [pytest.param(-1.0, 0.0, id="negative notice"), pytest.param(10.0, float("nan"), id="cost not a number")],
)
def test_a_bad_notice_is_refused(notice: float, cost: float) -> None:
    with pytest.raises(ValueError, match="must be a finite number of seconds >= 0"):
        NoticePolicy(notice, cost)


def test_a_reservation_preempted_before_it_starts_ends_at_once_and_its_units_stay_the_victims() -> None:
    # lab borrows both GPUs (quota 1 each); web's in-quota `reclaim` takes one back at 250 and waits
    # for `borrow` to stop at 310. At 260 lab's replica preempts the reservation (P2, never started):
    # it ends at once, losing nothing; its GPU is still borrow's until 310, so the replica starts then.
    p, b = pool(node("n0", gpus=2)), book(lab=1, web=1)
    jobs = [
        job("borrow", duration=1000, gpus=2, tenant="lab"),
        job("reclaim", submit=250, duration=100, tenant="web"),
        job("serve", submit=260, duration=100, tier="inference", tenant="lab"),
    ]
    options = ReplayOptions(checkpoint_interval_s=100, notice=NoticePolicy(60, 90), check_state=True)
    events = replay(p, b, jobs, CONFIG, options).events
    assert check_events(events, p, b) == []
    assert [(e["t"], e["lost_gpu_s"]) for e in events if e["event"] == "preempt" and e["job"] == "reclaim"] == [
        (260, 0.0)
    ]
    assert times(events, "admit", "serve") == [310]
    assert times(events, "preempt", "borrow") == [310]
