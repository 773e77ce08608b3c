"""The rules that make a run the same at every world size (`training/plan.py`), without torch."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from xirang_platform.training.plan import ElasticPlan, rank_shares


def plan(rows: int = 1437, global_batch: int = 64, epochs: int = 3, seed: int = 7) -> ElasticPlan:
    return ElasticPlan(rows=rows, global_batch=global_batch, epochs=epochs, seed=seed)


@pytest.mark.parametrize(
    ("rows", "world_size", "shares"),
    [
        pytest.param(64, 1, [64], id="one worker takes the whole global batch"),
        pytest.param(64, 2, [32, 32], id="a batch that divides is split evenly"),
        pytest.param(64, 3, [22, 21, 21], id="a batch that does not divide: the first rank takes the extra row"),
        pytest.param(29, 4, [8, 7, 7, 7], id="the short last step of an epoch is split the same way"),
        pytest.param(2, 3, [1, 1, 0], id="more workers than rows: a rank may get none"),
    ],
)
def test_each_rank_takes_its_share_of_a_step(rows: int, world_size: int, shares: list[int]) -> None:
    assert rank_shares(rows, world_size) == shares


@given(rows=st.integers(0, 500), world_size=st.integers(1, 64))
def test_shares_cover_the_step_and_differ_by_at_most_one_row(rows: int, world_size: int) -> None:
    shares = rank_shares(rows, world_size)
    assert sum(shares) == rows
    assert max(shares) - min(shares) <= 1
    assert shares == sorted(shares, reverse=True)


@given(world_size=st.integers(1, 16), step=st.integers(1, 3 * 23))
def test_the_ranks_rows_of_a_step_are_the_step_rows_in_order_at_any_world_size(world_size: int, step: int) -> None:
    p = plan()
    rows = p.step_rows(step)
    parts = [p.rank_rows(rows, rank, world_size) for rank in range(world_size)]
    np.testing.assert_array_equal(np.concatenate(parts), rows)


def test_an_epoch_visits_every_row_once_in_an_order_of_its_own() -> None:
    p = plan()
    assert (p.steps_per_epoch, p.total_steps) == (23, 69)  # 22 full steps of 64 and one of 29
    for epoch in (1, 2, 3):
        steps = range((epoch - 1) * 23 + 1, epoch * 23 + 1)
        visited = np.concatenate([p.step_rows(s) for s in steps])
        np.testing.assert_array_equal(np.sort(visited), np.arange(1437))
        np.testing.assert_array_equal(visited, p.epoch_order(epoch))
    assert not np.array_equal(p.epoch_order(1), p.epoch_order(2))
    assert [len(p.step_rows(s)) for s in (22, 23, 24)] == [64, 29, 64]


@pytest.mark.parametrize(
    ("step", "epoch", "ends_epoch"),
    [
        pytest.param(1, 1, False, id="the first step opens epoch 1"),
        pytest.param(23, 1, True, id="step 23 closes epoch 1"),
        pytest.param(24, 2, False, id="step 24 opens epoch 2"),
        pytest.param(69, 3, True, id="the last step closes the last epoch"),
    ],
)
def test_steps_are_numbered_across_epochs(step: int, epoch: int, ends_epoch: bool) -> None:
    assert (plan().epoch_of(step), plan().ends_epoch(step)) == (epoch, ends_epoch)


@given(world_size=st.integers(1, 8), rows=st.integers(1, 64))
def test_the_scaled_losses_average_to_the_mean_over_the_step(world_size: int, rows: int) -> None:
    losses = np.random.default_rng([world_size, rows]).random(rows)
    shares = rank_shares(rows, world_size)
    bounds = np.cumsum([0, *shares])
    per_rank = [losses[a:b].sum() * ElasticPlan.loss_scale(rows, world_size) for a, b in itertools.pairwise(bounds)]
    assert np.mean(per_rank) == pytest.approx(losses.mean())  # DDP averages the ranks' gradients


@pytest.mark.parametrize(
    ("finished", "first"),
    [
        pytest.param(0, 1, id="a fresh run starts at step 1"),
        pytest.param(23, 24, id="after the checkpoint of epoch 1 the run starts at the step after it"),
        pytest.param(5, 6, id="after a checkpoint saved mid-epoch on a notice, the next step"),
        pytest.param(69, 70, id="a finished run has no step left"),
    ],
)
def test_a_resumed_run_starts_at_the_step_after_its_checkpoint(finished: int, first: int) -> None:
    assert plan().first_step(finished) == first


@pytest.mark.parametrize(
    ("build", "message"),
    [
        pytest.param(lambda: plan(global_batch=0), "global batch 0: a step needs at least one row", id="no batch"),
        pytest.param(lambda: plan(epochs=0), "epochs 0: train at least one epoch", id="no epoch"),
        pytest.param(lambda: plan(rows=0), "no training rows", id="no rows"),
        pytest.param(lambda: rank_shares(64, 0), "a run needs at least one worker", id="no worker"),
        pytest.param(
            lambda: plan().first_step(70),
            "70 finished steps, outside this run's 0..69: resume with the run config it was trained with",
            id="a checkpoint past the run's end",
        ),
    ],
)
def test_bad_settings_are_refused_with_the_fix(build: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        build()
    assert message in str(raised.value)
