"""The rolling redeploy step (scheduling/rollout.py): table cases and, with hypothesis, whole rollouts
where replicas become ready in any order and at any pace."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xirang_platform.scheduling.rollout import Fleet, RolloutStep, rollout_step


def fleet(old: int = 0, old_waiting: int = 0, new: int = 0, new_waiting: int = 0) -> Fleet:
    """A fleet of numbered replicas: o1.. ready old, w1.. waiting old, n1.. ready new, s1.. starting new."""
    return Fleet(
        [f"o{i}" for i in range(1, old + 1)],
        [f"w{i}" for i in range(1, old_waiting + 1)],
        [f"n{i}" for i in range(1, new + 1)],
        [f"s{i}" for i in range(1, new_waiting + 1)],
    )


@pytest.mark.parametrize(
    ("given_fleet", "target", "want"),
    [
        pytest.param(fleet(old=2), 2, RolloutStep(1, (), False), id="a new version starts one surge replica"),
        pytest.param(fleet(old=2, new_waiting=1), 2, RolloutStep(0, (), False), id="no old goes before a new is ready"),
        pytest.param(fleet(old=2, new=1), 2, RolloutStep(1, ("o1",), False), id="a ready new replica lets one old go"),
        pytest.param(fleet(old=1, new=2), 2, RolloutStep(0, ("o1",), True), id="the last old goes once target are new"),
        pytest.param(
            fleet(old=1, old_waiting=2), 1, RolloutStep(1, ("w1", "w2"), False), id="old not ready stop at once"
        ),
        pytest.param(fleet(old=1), 0, RolloutStep(1, (), False), id="a target of zero still keeps one ready"),
        pytest.param(fleet(old=3, new=1), 2, RolloutStep(1, ("o1", "o2"), False), id="a lower target lets two old go"),
    ],
)
def test_rollout_step(given_fleet: Fleet, target: int, want: RolloutStep) -> None:
    assert rollout_step(given_fleet, target) == want


@settings(max_examples=200, deadline=None)
@given(
    old=st.integers(1, 6),
    target=st.integers(1, 6),
    readiness=st.lists(st.booleans(), min_size=1, max_size=200),
)
def test_a_rollout_never_has_fewer_ready_than_its_target_and_ends_all_new(
    old: int, target: int, readiness: list[bool]
) -> None:
    """Each evaluation applies the step; then each starting replica becomes ready or not, as drawn
    (ready for good after the drawn list)."""
    ready_old = [f"o{i}" for i in range(old)]
    ready_new: list[str] = []
    starting: list[str] = []
    floor = min(old, target)
    draws = itertools.chain(readiness, itertools.repeat(True))  # every replica is ready in the end
    for step_no in range(400):
        step = rollout_step(Fleet(ready_old, (), ready_new, starting), target)
        ready_old = [r for r in ready_old if r not in step.stop]
        starting += [f"n{step_no}.{i}" for i in range(step.start)]
        assert len(ready_old) + len(ready_new) >= floor  # never fewer ready than before, never zero
        assert len(ready_old) + len(ready_new) + len(starting) <= max(old, target) + 1  # one surge at most
        if step.done:
            break
        became = [s for s in starting if next(draws)]
        ready_new += became
        starting = [s for s in starting if s not in became]
    else:
        pytest.fail("the rollout never ended")
    assert ready_old == []
    assert len(ready_new) + len(starting) >= target
