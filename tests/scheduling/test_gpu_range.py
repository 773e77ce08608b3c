"""An elastic run's range of sizes (DESIGN.md section 11): what it holds, and what it refuses."""

import pytest

from xirang_platform.scheduling.model import GpuRange, Request, Tier


@pytest.mark.parametrize(
    ("gpu_range", "sizes"),
    [
        (GpuRange(2, 8), (8, 7, 6, 5, 4, 3, 2)),
        (GpuRange(2, 8, 2), (8, 6, 4, 2)),
        (GpuRange(4, 4), (4,)),
    ],
)
def test_sizes_run_largest_first_in_steps_from_the_minimum(gpu_range, sizes):
    assert gpu_range.sizes() == sizes
    assert all(gpu_range.contains(n) for n in sizes)
    assert not gpu_range.contains(gpu_range.max + gpu_range.step)
    assert not gpu_range.contains(gpu_range.min - 1)


@pytest.mark.parametrize(
    ("low", "high", "step", "says"),
    [(4, 2, 1, "min <= max"), (0, 2, 1, "min <= max"), (2, 7, 2, "must divide"), (2, 6, 0, "must divide")],
)
def test_a_range_that_holds_no_size_is_refused(low, high, step, says):
    with pytest.raises(ValueError, match=says):
        GpuRange(low, high, step)


def test_a_request_asks_for_a_size_inside_its_range():
    Request("a", "t", "p", Tier.ONLINE_TRAINING, 0.0, gpus=6, elastic=GpuRange(2, 8, 2))
    with pytest.raises(ValueError, match="outside its elastic range"):
        Request("a", "t", "p", Tier.ONLINE_TRAINING, 0.0, gpus=5, elastic=GpuRange(2, 8, 2))
