"""`reconcile.plan_repairs`: the ledger's live allocations against the runs' states (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xirang_platform.control.reconcile import (
    AFTER_NOTICE_OVER,
    AFTER_NOTICE_WAITING,
    IN_PROGRESS,
    Bounds,
    Repairs,
    RunView,
    plan_repairs,
)
from xirang_platform.scheduling.model import Allocation, GpuSlice, NodeShare, Placement, Request, Tier


def alloc(rid: str, *, placed: bool = True, confirmed: bool = True) -> Allocation:
    node = "h100-00" if placed else ""
    request = Request(rid, "research", "llm", Tier.OFFLINE_TRAINING, 0.0, gpus=1)
    return Allocation(
        request, Placement((GpuSlice(node, 0, 1000),), (NodeShare(node, 0, 0),)), 0.0, confirmed=confirmed
    )


def run(
    rid: str, status: str, gate: str = "open", gpus: bool = True, *, age_s: float = 0.0, worker: bool | None = None
) -> RunView:
    return RunView(rid, status, gate, gpus, age_s=age_s, worker=worker)


BOUNDS = Bounds(start_s=180, cancel_s=120)
GONE = "its run worker is gone (killed, or its host crashed)"


@pytest.mark.parametrize(
    ("allocations", "runs", "want"),
    [
        pytest.param([alloc("a")], [run("a", "STARTED")], Repairs(), id="a running run with its allocation: nothing"),
        pytest.param(
            [alloc("a")],
            [run("a", "SUCCESS")],
            Repairs(release_ended={"a": "finished"}),
            id="a run that succeeded still holding: released as its release sensor would, not a repair",
        ),
        pytest.param(
            [alloc("a"), alloc("b")],
            [run("a", "FAILURE"), run("b", "CANCELED")],
            Repairs(release_ended={"a": "failed", "b": "canceled"}),
            id="runs that failed or were cancelled: released with their sensors' causes, no repair",
        ),
        pytest.param([alloc("a")], [], Repairs(release={"a": "its run does not exist"}), id="no such run: release"),
        pytest.param(
            [alloc("a")],
            [run("a", "QUEUED", gate="closed")],
            Repairs(open_gate=["a"]),
            id="crash before the gate: open it",
        ),
        pytest.param(
            [alloc("a", placed=False)],
            [run("a", "QUEUED", gate="closed")],
            Repairs(release={"a": "admission was interrupted before the gate opened; the run is cycled again"}),
            id="crash before the gate, placement unknown: release and cycle again",
        ),
        pytest.param(
            [alloc("a")],
            [replace(run("a", "QUEUED", gate="closed"), after_notice=AFTER_NOTICE_WAITING)],
            Repairs(),
            id="a preemptor whose victims use their grace keeps its gate closed: not a crash to repair",
        ),
        pytest.param(
            [alloc("a")],
            [replace(run("a", "QUEUED", gate="closed"), after_notice=AFTER_NOTICE_OVER)],
            Repairs(after_notice=["a"]),
            id="its victims stopped or their grace ended: it launches, routinely (no repair counted)",
        ),
        pytest.param([], [run("a", "QUEUED")], Repairs(close_gate=["a"]), id="open gate, nothing held: close it"),
        pytest.param([], [run("a", "STARTED")], Repairs(stop=["a"]), id="running with nothing held: stop"),
        pytest.param([], [run("a", "STARTED", gate="none", gpus=False)], Repairs(), id="a CPU run holds nothing: fine"),
        pytest.param([], [run("a", "QUEUED", gate="closed")], Repairs(), id="waiting behind the gate: fine"),
        pytest.param(
            [alloc("a", confirmed=False)],
            [run("a", "STARTING")],
            Repairs(commit=["a"]),
            id="started: commit the reservation",
        ),
        pytest.param([alloc("a", confirmed=False)], [run("a", "QUEUED")], Repairs(), id="admitted, not launched: wait"),
        # issue 20 item 6: a run whose worker is gone never ended and kept its GPUs
        pytest.param(
            [alloc("a")],
            [run("a", "STARTED", worker=False)],
            Repairs(release={"a": GONE}, end={"a": GONE}),
            id="started, its worker killed: end the run and release",
        ),
        pytest.param(
            [alloc("a", confirmed=False)],
            [run("a", "STARTING", worker=False)],
            Repairs(release={"a": GONE}, end={"a": GONE}),
            id="starting, its worker killed: end the run and release (no commit)",
        ),
        pytest.param(
            [alloc("a")],
            [run("a", "CANCELING", worker=False)],
            Repairs(release={"a": GONE}, end={"a": GONE}),
            id="cancelling, its worker gone: end the run and release",
        ),
        pytest.param(
            [alloc("a")],
            [run("a", "STARTED", age_s=86400, worker=None)],
            Repairs(),
            id="started long ago, worker unknown (another host): Dagster's run monitoring decides",
        ),
        pytest.param(
            [alloc("a")],
            [run("a", "CANCELING", age_s=60, worker=True)],
            Repairs(),
            id="cancelling within the bound: wait",
        ),
        pytest.param(
            [alloc("a")],
            [run("a", "CANCELING", age_s=121, worker=None)],
            Repairs(
                release={"a": "it did not finish cancelling within 120 s"},
                end={"a": "it did not finish cancelling within 120 s"},
            ),
            id="cancelling past the bound, worker unknown: ended",
        ),
        pytest.param(
            [alloc("a")],
            [run("a", "CANCELING", age_s=600, worker=True)],
            Repairs(),
            id="cancelling past the bound with a live worker: it still holds the GPUs",
        ),
        pytest.param(
            [alloc("a", confirmed=False)],
            [run("a", "STARTING", age_s=181, worker=None)],
            Repairs(release={"a": "it did not start within 180 s"}, end={"a": "it did not start within 180 s"}),
            id="starting past the start timeout, no worker seen: ended",
        ),
        pytest.param(
            [alloc("a", confirmed=False)],
            [run("a", "STARTING", age_s=181, worker=True)],
            Repairs(commit=["a"]),
            id="starting past the start timeout with a live worker: it runs",
        ),
        pytest.param(
            [], [run("a", "STARTED", worker=False)], Repairs(end={"a": GONE}), id="open gate, nothing held, gone: end"
        ),
        pytest.param(
            [],
            [run("a", "CANCELING", gate="none", gpus=False, worker=False)],
            Repairs(end={"a": GONE}),
            id="a CPU run whose worker is gone: end it too",
        ),
    ],
)
def test_plan_repairs(allocations: list[Allocation], runs: list[RunView], want: Repairs) -> None:
    got = plan_repairs(allocations, {r.run_id: r for r in runs}, BOUNDS)
    assert got == want
    assert got.count == len(want.release) + len(want.open_gate) + len(want.close_gate) + len(want.stop) + len(want.end)
    assert len(got.lines()) == got.count


STATUSES = ["QUEUED", "STARTING", "STARTED", "CANCELING", "SUCCESS", "FAILURE", "CANCELED"]
views = st.builds(
    RunView,
    run_id=st.sampled_from("abcdef"),
    status=st.sampled_from(STATUSES),
    gate=st.sampled_from(["open", "closed", "none"]),
    asks_gpus=st.booleans(),
    age_s=st.floats(0, 1000),
    worker=st.sampled_from([True, False, None]),
)


@given(st.lists(views, unique_by=lambda v: v.run_id), st.sets(st.sampled_from("abcdefgh")))
def test_no_run_without_a_live_worker_keeps_units_and_no_run_with_one_is_ended(
    runs: list[RunView], held: set[str]
) -> None:
    by_id = {r.run_id: r for r in runs}
    repairs = plan_repairs([alloc(rid) for rid in sorted(held)], by_id, BOUNDS)
    for rid, run in by_id.items():
        if run.status in IN_PROGRESS and run.worker is False:
            assert rid in repairs.end
            assert rid not in repairs.stop
            assert rid not in repairs.commit
            assert (rid in repairs.release) == (rid in held)
        if run.worker is True or run.status not in IN_PROGRESS:
            assert rid not in repairs.end
    assert set(repairs.end) <= set(by_id)
