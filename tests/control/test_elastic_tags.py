"""The elastic range tags (`xirang/gpus-min`, `-max`, `-step`; DESIGN.md sections 7 and 11): a good
range becomes `Request.elastic` asking its max, a bad one is refused at submission with the tag and
the fix, and the coordinator restates the range so the tick reads back the same request."""

from __future__ import annotations

from pathlib import Path

import pytest

from xirang_platform.control import run_tags as rt
from xirang_platform.control import tag_parsing
from xirang_platform.control.platform_config import load_config
from xirang_platform.dagster_defs.coordinator import admission_tags
from xirang_platform.scheduling.model import GpuRange, Request

PROJECTS = ("llm", "vision")
PLATFORM = load_config(Path(__file__).resolve().parents[2] / "xirang.yaml")


def tags(**kw: str) -> dict[str, str]:
    """Run tags from keyword arguments: `gpus_min="2"` is `xirang/gpus-min: 2`."""
    return {f"xirang/{k.replace('_', '-')}": v for k, v in kw.items()}


def train(**kw: str) -> dict[str, str]:
    """An offline-training run of project llm with the given tags."""
    return tags(tier="offline-training", project="llm", **kw)


def submit(given: dict[str, str], declared: dict[str, str] | None = None) -> Request | rt.TagProblem | None:
    return tag_parsing.parse_submission(
        given, declared or {}, "research", run_id="r1", lineage=rt.Lineage(100.0), projects=PROJECTS
    )


@pytest.mark.parametrize(
    ("given", "declared", "gpus", "elastic"),
    [
        pytest.param(train(gpus_min="2", gpus_max="8"), {}, 8, GpuRange(2, 8), id="a range asks its max, step 1"),
        pytest.param(
            train(gpus_min="2", gpus_max="8", gpus_step="2"), {}, 8, GpuRange(2, 8, 2), id="a range with a step"
        ),
        pytest.param(train(gpus_min="4", gpus_max="4"), {}, 4, GpuRange(4, 4), id="a range of one size"),
        pytest.param(
            tags(tier="online-training", project="llm", gpus_min="1", gpus_max="3"),
            {},
            3,
            GpuRange(1, 3),
            id="online training may be elastic",
        ),
        pytest.param(
            tags(tier="offline-training"),
            train(gpus_min="2", gpus_max="6", gpus_step="4"),
            6,
            GpuRange(2, 6, 4),
            id="a range an asset declares, the run naming only its tier",
        ),
        pytest.param(
            train(gpus_min="4", gpus_max="8"),
            train(gpus="4"),
            8,
            GpuRange(4, 8),
            id="a range over a declared count it never drops below",
        ),
        pytest.param(
            train(gpus="8"), train(gpus_min="2", gpus_max="8"), 8, None, id="a count over a declared range is fixed"
        ),
        pytest.param(
            {**train(gpus_min="2", gpus_max="4"), rt.GPUS: ""},
            {},
            4,
            GpuRange(2, 4),
            id="a restated range with the count spelling blanked (a re-execution's copy)",
        ),
    ],
)
def test_a_range_becomes_an_elastic_request_asking_its_max(
    given: dict[str, str], declared: dict[str, str], gpus: int, elastic: GpuRange | None
) -> None:
    got = submit(given, declared)
    assert isinstance(got, Request), got
    assert (got.gpus, got.elastic) == (gpus, elastic)


@pytest.mark.parametrize(
    ("given", "declared", "tag", "fix"),
    [
        pytest.param(
            train(gpus_min="8", gpus_max="2"), {}, rt.GPUS_MIN, "is above xirang/gpus-max=2", id="min above max"
        ),
        pytest.param(
            train(gpus_min="2", gpus_max="8", gpus_step="4"),
            {},
            rt.GPUS_STEP,
            "does not divide xirang/gpus-max - xirang/gpus-min = 6: give a step that divides it, or set "
            "xirang/gpus-max=6",
            id="a step that does not divide max - min",
        ),
        pytest.param(
            tags(tier="inference", project="llm", gpus_min="1", gpus_max="2"),
            {},
            rt.GPUS_MIN,
            "an elastic range is for training runs, not inference: ask a fixed count with xirang/gpus",
            id="a range on inference",
        ),
        pytest.param(
            tags(tier="batch-inference", project="llm", gpus_min="1", gpus_max="2"),
            {},
            rt.GPUS_MIN,
            "not batch-inference",
            id="a range on batch inference",
        ),
        pytest.param(
            train(gpus="4", gpus_min="2", gpus_max="8"),
            {},
            rt.GPUS_MIN,
            "a fixed count (xirang/gpus) or a range (xirang/gpus-min and xirang/gpus-max), not both",
            id="a range together with xirang/gpus",
        ),
        pytest.param(
            tags(tier="inference", project="llm", gpu_milli="500", gpus_max="2"),
            {},
            rt.GPUS_MAX,
            "remove xirang/gpu-milli or the range tags",
            id="a range together with a fraction of a GPU",
        ),
        pytest.param(
            train(gpus_min="2"),
            {},
            rt.GPUS_MAX,
            "xirang/gpus-min is set, and an elastic range needs both",
            id="only the min",
        ),
        pytest.param(
            train(gpus_max="8"),
            {},
            rt.GPUS_MIN,
            "xirang/gpus-max is set, and an elastic range needs both",
            id="only the max",
        ),
        pytest.param(
            train(gpus_step="2"), {}, rt.GPUS_MIN, "xirang/gpus-step is set, and an elastic range", id="only a step"
        ),
        pytest.param(train(gpus_min="0", gpus_max="4"), {}, rt.GPUS_MIN, "1..100000", id="a min of zero GPUs"),
        pytest.param(
            train(gpus_min="2", gpus_max="4", gpus_step="0"), {}, rt.GPUS_STEP, "1..100000", id="a step of zero"
        ),
        pytest.param(train(gpus_min="1", gpus_max="2.5"), {}, rt.GPUS_MAX, "whole number", id="a fractional max"),
        pytest.param(
            train(gpus_min="2", gpus_max="8"),
            train(gpus="4"),
            rt.GPUS_MIN,
            "cannot drop a declared need",
            id="a range whose min is below the declared count",
        ),
    ],
)
def test_a_bad_range_is_refused_with_the_tag_and_the_fix(
    given: dict[str, str], declared: dict[str, str], tag: str, fix: str
) -> None:
    got = submit(given, declared)
    assert isinstance(got, rt.TagProblem), got
    assert got.tag == tag
    assert tag in got.message
    assert fix in got.message


@pytest.mark.parametrize(
    "given",
    [
        pytest.param(train(gpus_min="2", gpus_max="8"), id="step 1"),
        pytest.param(train(gpus_min="2", gpus_max="8", gpus_step="3"), id="step 3"),
        pytest.param(
            tags(tier="online-training", project="vision", gpus_min="1", gpus_max="4", gpu_model="h100"),
            id="a gang of one model",
        ),
    ],
)
def test_the_tick_reads_back_the_range_the_coordinator_admitted(given: dict[str, str]) -> None:
    written = admission_tags(given, "research", PLATFORM, "run-1", 1000.0)
    assert isinstance(written, dict), written
    assert rt.GPUS not in written
    admitted = tag_parsing.parse(given, "research", run_id="run-1", submit_time=1000.0)
    read_back = tag_parsing.parse({**given, **written}, "research", run_id="run-1")
    assert isinstance(read_back, Request)
    assert read_back == admitted
    assert read_back.elastic is not None


def test_a_range_asks_for_gpus_and_its_largest_size() -> None:
    ranged = train(gpus_min="2", gpus_max="8")
    assert rt.asks_for_gpus(ranged)
    assert tag_parsing.ask_milli(ranged) == 8000


def test_a_submitted_range_is_refused_before_anything_is_written() -> None:
    got = admission_tags(train(gpus_min="8", gpus_max="2"), "research", PLATFORM, "run-1", 1000.0)
    assert isinstance(got, rt.TagProblem)
    assert got.tag == rt.GPUS_MIN
