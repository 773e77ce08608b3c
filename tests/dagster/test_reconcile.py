"""`reconcile.plan_repairs`: the ledger's live allocations against the runs' states (pure)."""

from __future__ import annotations

import pytest

from sensors.reconcile import Repairs, RunView, plan_repairs
from xirang_platform.scheduling.model import Allocation, GpuSlice, NodeShare, Placement, Request, Tier


def alloc(rid: str, *, placed: bool = True, confirmed: bool = True) -> Allocation:
    node = "h100-00" if placed else ""
    request = Request(rid, "research", "llm", Tier.OFFLINE_TRAINING, 0.0, gpus=1)
    return Allocation(
        request, Placement((GpuSlice(node, 0, 1000),), (NodeShare(node, 0, 0),)), 0.0, confirmed=confirmed
    )


def run(rid: str, status: str, gate: str = "open", gpus: bool = True) -> RunView:
    return RunView(rid, status, gate, gpus)


@pytest.mark.parametrize(
    ("allocations", "runs", "want"),
    [
        pytest.param([alloc("a")], [run("a", "STARTED")], Repairs(), id="a running run with its allocation: nothing"),
        pytest.param(
            [alloc("a")],
            [run("a", "SUCCESS")],
            Repairs(release={"a": "its run ended (success) without a release"}),
            id="finished run still holding: release",
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
    ],
)
def test_plan_repairs(allocations: list[Allocation], runs: list[RunView], want: Repairs) -> None:
    got = plan_repairs(allocations, {r.run_id: r for r in runs})
    assert got == want
    assert got.count == len(want.release) + len(want.open_gate) + len(want.close_gate) + len(want.stop)
    assert len(got.lines()) == got.count
