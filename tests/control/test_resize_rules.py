"""The live platform's rules for an elastic run's resize (`control/resize.py`, pure): when its new
size is held for its resumption, what reconcile does with it, the grace, the size history and the tags."""

from __future__ import annotations

import json

import pytest

from xirang_platform.control import run_tags as rt
from xirang_platform.control.notice import PreemptionGrace
from xirang_platform.control.reconcile import Bounds, Repairs, RunView, plan_repairs
from xirang_platform.control.resize import (
    ResizeRecord,
    awaits_resumption,
    grace_for,
    inherited_history,
    notice_of,
    resize_tags,
    size_history,
)
from xirang_platform.control.tick_plan import settled
from xirang_platform.scheduling.model import (
    Allocation,
    GpuRange,
    GpuSlice,
    NodeShare,
    Placement,
    PreemptReason,
    Request,
    Resize,
    ResizeKind,
    Tier,
)

RESIZED = {rt.RESIZE: '{"kind": "grow"}', rt.RESUME: rt.RESUME_PENDING}


def elastic(gpus: int, confirmed: bool = False) -> Allocation:
    """Run `r`'s elastic allocation (2..8 GPUs) of `gpus` GPUs on h100-00."""
    request = Request("r", "research", "llm", Tier.OFFLINE_TRAINING, 0.0, gpus, elastic=GpuRange(2, 8))
    slices = tuple(GpuSlice("h100-00", g, 1000) for g in range(gpus))
    return Allocation(request, Placement(slices, (NodeShare("h100-00", 0, 0),)), 0.0, confirmed=confirmed)


def resized(old: int, new: int, kind: ResizeKind, by: str | None = None) -> Resize:
    reason = PreemptReason.PRIORITY if by else None
    return Resize(elastic(old, True), elastic(new), kind, 50.0, by, reason)


@pytest.mark.parametrize(
    ("status", "tags", "held"),
    [
        pytest.param("CANCELED", RESIZED, True, id="ended on its resize notice: held for its resumption"),
        pytest.param("FAILURE", RESIZED, True, id="failed while being stopped: held too"),
        pytest.param("STARTED", RESIZED, True, id="still stopping in its grace: held, not committed"),
        pytest.param("CANCELED", {**RESIZED, rt.RESUME: rt.RESUME_REQUESTED}, False, id="its resumption was requested"),
        pytest.param("SUCCESS", RESIZED, False, id="it finished its work: nothing to resume"),
        pytest.param("CANCELED", {rt.RESUME: rt.RESUME_PENDING}, False, id="a preempted run, not a resized one"),
    ],
)
def test_a_resized_runs_new_size_is_held_while_its_resumption_is_to_come(
    status: str, tags: dict[str, str], held: bool
) -> None:
    assert awaits_resumption(status, tags) is held
    view = RunView("r", status, "open", True, awaits_resumption=awaits_resumption(status, tags))
    repairs = plan_repairs([elastic(4)], {"r": view}, Bounds())
    if held:
        assert repairs == Repairs()  # neither released nor committed
    else:
        assert "r" in repairs.release_ended


@pytest.mark.parametrize(
    ("r", "grace_s"),
    [
        pytest.param(resized(8, 4, ResizeKind.SHRINK, by="serve"), 15.0, id="a shrink: the preemptor's tier's grace"),
        pytest.param(resized(4, 8, ResizeKind.GROW), 120.0, id="a grow: the run's own tier's grace"),
        pytest.param(resized(8, 4, ResizeKind.SHRINK, by="gone"), 120.0, id="a preemptor not in the cycle: its own"),
    ],
)
def test_the_grace_of_a_resize(r: Resize, grace_s: float) -> None:
    assert grace_for(r, PreemptionGrace(), {"serve": Tier.INFERENCE}) == grace_s


def test_the_tags_of_a_resized_run_record_it_and_its_size_history() -> None:
    r = resized(8, 4, ResizeKind.SHRINK, by="serve")
    tags = resize_tags({rt.SIZE_HISTORY: "2,8"}, r, notice_of(r, 15.0, 50.0))
    assert tags[rt.SIZE_HISTORY] == "2,8,4"
    assert tags[rt.RESUME] == rt.RESUME_PENDING
    assert json.loads(tags[rt.RESIZE]) == {
        "old_gpus": 8,
        "new_gpus": 4,
        "kind": "shrink",
        "by": "serve",
        "reason": "priority",
        "at": 50.0,
    }
    assert json.loads(tags[rt.NOTICE]) == {"by": "serve", "reason": "resize-shrink", "grace_s": 15.0, "at": 50.0}
    assert tags[rt.PREEMPTED_BY] == "resized from 8 to 4 GPUs (shrink) for run serve (priority)"
    assert size_history({}, resized(4, 8, ResizeKind.GROW)) == "4,8"
    assert ResizeRecord.of(resized(4, 8, ResizeKind.GROW)).why() == "resized from 4 to 8 GPUs (grow)"


def test_a_resumption_inherits_the_size_history_of_a_resized_run_only() -> None:
    assert inherited_history({**RESIZED, rt.SIZE_HISTORY: "8,4"}) == {rt.SIZE_HISTORY: "8,4"}
    assert inherited_history({rt.SIZE_HISTORY: "8,4"}) == {}  # a user's tag on a run never resized


@pytest.mark.parametrize(
    ("allocation", "elastic_seen"),
    [
        pytest.param(elastic(4, confirmed=True), True, id="a running elastic run may be resized"),
        pytest.param(elastic(4), False, id="one not yet started (or stopping for a resize) is offered as fixed"),
    ],
)
def test_the_cycle_resizes_only_runs_that_started(allocation: Allocation, elastic_seen: bool) -> None:
    seen = settled(allocation)
    assert (seen.request.elastic is not None) is elastic_seen
    assert (seen.id, seen.request.gpus, seen.placement) == (allocation.id, 4, allocation.placement)
