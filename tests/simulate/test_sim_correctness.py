"""Issue 7 through the replay and the event-log checker: multi-cycle cases and the two new invariants
(per-GPU memory, the cap on the placement an admission finally gets)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.simulate.sim_builders import admit, book, job, node, pool, preempt, submit
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.scheduling.snapshot import SchedulerConfig
from xirang_platform.simulate.events import check_events
from xirang_platform.simulate.replay import ReplayOptions, replay
from xirang_platform.simulate.traces import TraceJob

CHECKED = ReplayOptions(check_state=True)


def _run(p, b: QuotaBook, jobs: list[TraceJob], config: SchedulerConfig | None = None):
    result = replay(p, b, jobs, config, CHECKED)
    assert check_events(result.events, p, b) == []
    return result


def _times(events: list[dict], kind: str, job_id: str) -> list[float]:
    return [e["t"] for e in events if e["event"] == kind and e["job"] == job_id]


def test_12_a_victim_resumes_in_the_same_instant_on_idle_units() -> None:
    # Quota 1 GPU: the P0 at t=1,000 preempts its own tenant's P2 to get under the cap; nine GPUs
    # are idle, so the victim resumes (borrowed) at once, not when the next event comes at 1,600.
    trace = [
        job("batch", submit=0, duration=5_000),
        job("web", submit=1_000, duration=600, tier="inference"),
    ]
    result = _run(pool(node("n0", gpus=10)), book(default=1), trace, SchedulerConfig(min_runtime_s=600))
    assert _times(result.events, "preempt", "batch") == [1_000]
    assert _times(result.events, "admit", "batch") == [0, 1_000]
    assert [e["borrowed"] for e in result.events if e["event"] == "admit" and e["job"] == "batch"] == [False, True]


def test_11_a_p0_larger_than_its_whole_cap_is_rejected_with_the_reason() -> None:
    result = _run(pool(node("n0", gpus=4)), book(default=1), [job("huge", gpus=2, tier="inference")])
    assert [(e["event"], e.get("reason")) for e in result.events] == [("submit", None), ("reject", "exceeds-cap")]
    assert "may never hold more than 1200" in result.events[-1]["message"]


def test_3_a_starving_gang_is_not_starved_by_a_lower_share_tenants_stream() -> None:
    # a holds 1 of its 16 GPUs (share 1/16); b holds ~10 of its 200 (share ~1/20): b's one-GPU jobs,
    # one every 60 s for 6 hours, always come before a's 16-GPU gang in the order.
    stream = [job(f"b{k:03d}", submit=60.0 * k, duration=600, tenant="b") for k in range(360)]
    trace = [
        job("a-long", submit=0, duration=100_000, tenant="a"),
        job("gang", submit=700, duration=1_000, gpus=16, tenant="a", single_node=False),
        *stream,
    ]
    p = pool(*(node(f"n{i}", gpus=8) for i in range(3)))
    result = _run(p, book(a=16, b=200), trace, SchedulerConfig(starvation_wait_s=1_800))
    (start,) = _times(result.events, "admit", "gang")
    # At 700 b runs ten jobs: 13 GPUs are free, the gang waits. The hold starts at 2,500 and b's
    # running jobs drain within their 600 s.
    assert 2_500 <= start <= 2_500 + 600


def _gpu_memory_log(second_mib: int) -> list[dict[str, Any]]:
    first = admit(0, "r0", [("n0", 0, 250)], borrowed=False)
    second = admit(0, "r1", [("n0", 0, 250)], borrowed=False)
    first["alloc"][0]["gpu_memory_mib"] = 10_000
    second["alloc"][0]["gpu_memory_mib"] = second_mib
    return [
        submit(0, "r0", tier="inference", milli_per_gpu=250),
        submit(0, "r1", tier="inference", milli_per_gpu=250),
        first,
        second,
    ]


@pytest.mark.parametrize(
    ("second_mib", "problems"),
    [
        pytest.param(5_000, [], id="10 + 5 GB on a 15 GB T4: fits"),
        pytest.param(
            6_000,
            ["event 3 (t=0, admit r1): GPU 0 of n0 holds 16000 MiB of GPU memory > 15360 MiB"],
            id="10 + 6 GB on a 15 GB T4: over the GPU's memory",
        ),
    ],
)
def test_the_checker_holds_gpu_memory_per_gpu(second_mib: int, problems: list[str]) -> None:
    assert check_events(_gpu_memory_log(second_mib), pool(node("n0")), book(default=2)) == problems


def test_the_checker_flags_an_admission_past_its_cap_right_after_its_preemption() -> None:
    # Issue 7 case 2 as the old core logged it: b (cap 1,200) holds 1,000, its P2 is preempted,
    # then its P0 is admitted in quota on a whole GPU: 1,500.
    p = pool(node("frac", model="A100", gpus=2), node("whole", gpus=1))
    log = [
        submit(0, "b-batch", tenant="b", milli_per_gpu=500),
        submit(0, "b-serve", tenant="b", milli_per_gpu=500, tier="inference"),
        admit(0, "b-batch", [("frac", 0, 500)]),
        admit(0, "b-serve", [("frac", 1, 500)]),
        submit(1_000, "b-new", tenant="b", milli_per_gpu=125, tier="inference"),
        preempt(1_000, "b-batch", "b-new"),
        admit(1_000, "b-new", [("whole", 0, 1000)]),
    ]
    for e in log:
        if e["event"] == "admit":
            e["shares"] = []
    problems = check_events(log, p, book(b=1, x=8))
    assert problems == ["event 6 (t=1000, admit b-new): b in-quota 500 + 1000 milli exceeds its cap 1200 (ratio 1.200)"]


def test_4_a_borrowing_gang_backs_off_and_never_holds_the_lenders_in_quota_work() -> None:
    # a (quota 8) can run its 16-GPU gang only borrowed; b (quota 16) runs waves of in-quota work
    # with idle gaps between them. b never waits for the gang longer than the gang's minimum
    # runtime; every reclaim doubles the time before the gang borrows again out of b's gaps, and
    # once b's waves are over the gang borrows again as soon as b's quota has been idle long enough.
    trace = [job("a-gang", submit=0, duration=20_000, gpus=16, tenant="a", single_node=False)]
    trace += [
        job(f"b{wave:02d}-{k}", submit=wave * 4_000 + 10 * k + 5, duration=3_000, gpus=4, tenant="b", single_node=False)
        for wave in range(12)
        for k in range(2)
    ]
    config = SchedulerConfig(min_runtime_s=600, reclaim_backoff_s=1_800)
    result = _run(pool(node("n0", gpus=8), node("n1", gpus=8)), book(a=8, b=16), trace, config)
    events = result.events
    submitted = {e["job"]: e["t"] for e in events if e["event"] == "submit"}
    first_admit: dict[str, float] = {}
    for e in events:
        if e["event"] == "admit":
            first_admit.setdefault(e["job"], e["t"])
    assert max(first_admit[j] - t for j, t in submitted.items() if j.startswith("b")) <= config.min_runtime_s
    reclaims = [e["t"] for e in events if e["event"] == "preempt" and e["job"] == "a-gang"]
    assert all(e["reason"] == "reclaim" for e in events if e["event"] == "preempt")
    readmits = _times(events, "admit", "a-gang")[1:]
    b_done = max(e["t"] for e in events if e["event"] == "finish" and e["job"].startswith("b"))
    for n, (reclaimed, back) in enumerate(zip(reclaims, readmits, strict=False), start=1):
        assert back - reclaimed >= config.borrow_backoff_s(n) or back >= b_done + config.lend_after_s
    assert len(reclaims) <= 5  # the old core reclaimed it 14 times in this trace
    # The last back-off would end at reclaim + 8 x 1,800 s; b's idle quota is lent once it lasted.
    assert reclaims[-1] + config.borrow_backoff_s(len(reclaims)) > b_done + config.lend_after_s
    assert readmits[-1] == b_done + config.lend_after_s
