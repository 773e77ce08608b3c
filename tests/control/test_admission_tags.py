"""What the coordinator writes on a run is read back by the tick as the same request."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xirang_platform.control import run_tags as rt
from xirang_platform.control import tag_parsing
from xirang_platform.control.platform_config import load_config
from xirang_platform.dagster_defs.coordinator import admission_tags
from xirang_platform.scheduling.model import Request

PLATFORM = load_config(Path(__file__).resolve().parents[2] / "xirang.yaml")


@pytest.mark.parametrize(
    "tags",
    [
        pytest.param({rt.TIER: "inference", rt.GPU_MILLI: "250", rt.PROJECT: "llm"}, id="a quarter GPU"),
        pytest.param(
            {rt.TIER: "inference", rt.GPUS: "", rt.GPU_MILLI: "999", rt.PROJECT: "llm"},
            id="a restated ask with its other spelling blanked (a re-execution's copy)",
        ),
        pytest.param(
            {rt.TIER: "offline-training", rt.GPUS: "2", rt.GPU_MEMORY_GB: "10.0009765625", rt.PROJECT: "llm"},
            id="GPU memory that is not a round number of GB",
        ),
        pytest.param({rt.TIER: "online-training", rt.GPUS: "4", rt.PROJECT: "llm"}, id="whole GPUs"),
        pytest.param(
            {rt.TIER: "batch-inference", rt.GPUS: "1", rt.GPU_MODEL: "a100-80", rt.GPU_MEMORY_GB: "40"},
            id="model alias and memory, default project missing",
        ),
    ],
)
def test_the_tick_reads_back_the_request_the_coordinator_admitted(tags: dict[str, str]) -> None:
    projects = PLATFORM.projects_of("research")
    tags = tags if rt.PROJECT in tags or len(projects) == 1 else {**tags, rt.PROJECT: "vision"}
    written = admission_tags(tags, "research", PLATFORM, "run-1", 1000.0)
    assert isinstance(written, dict), written
    assert written[rt.GATE] == "queued"

    on_run = {**tags, **written}  # Dagster merges the new tags into the run's
    admitted = tag_parsing.parse(tags, "research", run_id="run-1", submit_time=1000.0, projects=projects)
    read_back = tag_parsing.parse(on_run, "research", run_id="run-1", projects=projects)
    assert read_back == admitted


@pytest.mark.parametrize(
    ("given", "declared", "want"),
    [
        pytest.param({rt.EXPECTED_DURATION: "600"}, {}, "600", id="the run's own tag stays"),
        pytest.param({}, {rt.EXPECTED_DURATION: "7200"}, "7200", id="its assets' declaration is written on the run"),
        pytest.param({rt.EXPECTED_DURATION: "60"}, {rt.EXPECTED_DURATION: "7200"}, "60", id="the run's tag wins"),
        pytest.param({}, {}, None, id="none stated: none written"),
    ],
)
def test_the_expected_duration_is_on_the_run_where_the_queue_view_reads_it(
    given: dict[str, str], declared: dict[str, str], want: str | None
) -> None:
    tags = {rt.TIER: "offline-training", rt.GPUS: "2", rt.PROJECT: "llm", **given}
    written = admission_tags(tags, "research", PLATFORM, "run-1", 1000.0, declared=declared)
    assert isinstance(written, dict), written
    assert {**tags, **written}.get(rt.EXPECTED_DURATION) == want


def test_a_bad_expected_duration_fails_the_submission_with_the_tag_and_the_fix() -> None:
    tags = {rt.TIER: "offline-training", rt.GPUS: "2", rt.PROJECT: "llm", rt.EXPECTED_DURATION: "2 hours"}
    got = admission_tags(tags, "research", PLATFORM, "run-1", 1000.0)
    assert isinstance(got, rt.TagProblem)
    assert got.message == (
        "xirang/expected-duration='2 hours' is not a plain decimal number: give the seconds the run is expected "
        "to take, 1..31622400 (3600 = an hour)"
    )


asks = st.one_of(
    st.integers(1, 16).map(lambda g: {rt.GPUS: str(g)}), st.integers(1, 999).map(lambda m: {rt.GPU_MILLI: str(m)})
)
extras = st.fixed_dictionaries(
    {},
    optional={
        rt.GPU_MEMORY_GB: st.one_of(st.integers(0, 80).map(str), st.integers(1, 80_000).map(lambda m: f"{m / 1000:g}")),
        rt.MIN_COMPUTE_LEVEL: st.integers(0, 1000).map(str),
        rt.GPU_MODEL: st.sampled_from(["h100", "a100-80|H100-SXM", "L40S"]),
        rt.PREEMPTED: st.sampled_from(["1", "3000000000"]),
    },
)


@settings(max_examples=80, deadline=None)
@given(ask=asks, extra=extras, tier=st.sampled_from(["inference", "online-training", "batch-inference"]))
def test_the_tick_reads_back_exactly_what_the_coordinator_admitted(ask: dict, extra: dict, tier: str) -> None:
    tags = {rt.TIER: tier, rt.PROJECT: "llm", **ask, **extra}
    written = admission_tags(tags, "research", PLATFORM, "run-1", 1000.0)
    assert isinstance(written, dict), written
    admitted = tag_parsing.parse_submission(
        tags, {}, "research", run_id="run-1", lineage=rt.Lineage(1000.0), projects=PLATFORM.projects_of("research")
    )
    assert (
        tag_parsing.parse({**tags, **written}, "research", run_id="run-1", projects=PLATFORM.projects_of("research"))
        == admitted
    )
    assert isinstance(admitted, Request)
    assert admitted.preempted == 0  # a user's preempted mark is not read, and reset on the run
