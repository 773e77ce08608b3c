"""`run_tags.parse`: the run tag contract of DESIGN.md section 7, without Dagster."""

from __future__ import annotations

import pytest

from xirang_platform import run_tags as rt
from xirang_platform.scheduling.model import Allocation, GpuSlice, NodeShare, Placement, Request, Tier

PROJECTS = ("llm", "vision")


def tags(**kw: str) -> dict[str, str]:
    """Run tags from keyword arguments: `gpu_milli="250"` is `xirang/gpu-milli: 250`."""
    return {f"xirang/{k.replace('_', '-')}": v for k, v in kw.items()}


def parse(t: dict[str, str], tenant: str | None = "research") -> Request | rt.TagProblem | None:
    return rt.parse(t, tenant, run_id="r1", submit_time=100.0, projects=PROJECTS)


@pytest.mark.parametrize(
    ("given", "want"),
    [
        pytest.param(
            tags(tier="online-training", gpus="4", project="llm"),
            dict(gpus=4, milli_per_gpu=1000, tier=Tier.ONLINE_TRAINING, project="llm"),
            id="whole GPUs",
        ),
        pytest.param(
            tags(tier="inference", gpu_milli="250", project="vision", gpu_memory_gb="10"),
            dict(gpus=1, milli_per_gpu=250, gpu_memory_mib=10240, tier=Tier.INFERENCE),
            id="a fraction of one GPU with GPU memory",
        ),
        pytest.param(
            tags(tier="batch-inference", gpus="1", project="llm", min_compute_level="8", gpu_model="h100|a100-80"),
            dict(min_compute_level=8, gpu_models=frozenset({"H100-SXM", "A100-80"})),
            id="model aliases become catalog names",
        ),
        pytest.param(
            tags(tier="offline-training", gpus="2", project="llm", submit_time="42.5", preempted="2"),
            dict(submit_time=42.5, preempted=2),
            id="a resumption keeps its original submit time and preemption count",
        ),
        pytest.param(
            tags(tier="offline-training", gpus="2", project="llm", reclaimed_at="4200.5", reclaims="2"),
            dict(reclaimed_at=4200.5, reclaims=2),
            id="a resumption of reclaimed work keeps its reclaims (its borrow back-off)",
        ),
        pytest.param(
            tags(tier="offline-training", gpus="2", project="llm", tenant="research"),
            dict(tenant="research", submit_time=100.0),
            id="a tenant tag naming the bound tenant is accepted",
        ),
    ],
)
def test_parse_reads_a_request(given: dict[str, str], want: dict[str, object]) -> None:
    got = parse(given)
    assert isinstance(got, Request), got
    assert got.id == "r1"
    assert got.tenant == "research"
    assert {k: getattr(got, k) for k in want} == want


@pytest.mark.parametrize(
    "given",
    [
        pytest.param({}, id="no tags"),
        pytest.param(tags(tier="inference"), id="a tier but no GPU"),
        pytest.param(tags(gpus="0", tier="offline-training"), id="zero GPUs"),
        pytest.param({"team": "x", "dagster/priority": "5"}, id="only foreign tags"),
    ],
)
def test_a_run_asking_for_no_gpu_parses_to_none(given: dict[str, str]) -> None:
    assert parse(given) is None
    assert not rt.asks_for_gpus(given)


@pytest.mark.parametrize(
    ("given", "tenant", "tag", "fix"),
    [
        pytest.param(
            tags(tier="inference", gpus="x", project="llm"),
            "research",
            rt.GPUS,
            "whole number of GPUs",
            id="GPUs not a number",
        ),
        pytest.param(
            tags(tier="inference", gpus="-1", project="llm"), "research", rt.GPUS, "below 0", id="negative GPUs"
        ),
        pytest.param(
            tags(tier="offline-training", gpus="1", project="llm", reclaims="-1"),
            "research",
            rt.RECLAIMS,
            "below 0",
            id="negative reclaims",
        ),
        pytest.param(
            tags(tier="inference", gpus="1", gpu_milli="500", project="llm"),
            "research",
            rt.GPU_MILLI,
            "use xirang/gpus for whole GPUs",
            id="both GPUs and milli",
        ),
        pytest.param(
            tags(tier="inference", gpu_milli="1500", project="llm"),
            "research",
            rt.GPU_MILLI,
            "1..1000",
            id="milli over one GPU",
        ),
        pytest.param(
            tags(gpus="1", project="llm"), "research", rt.TIER, "one of inference, online-training", id="tier missing"
        ),
        pytest.param(
            tags(gpus="1", tier="urgent", project="llm"), "research", rt.TIER, "one of inference", id="unknown tier"
        ),
        pytest.param(
            tags(tier="inference", gpus="1", project="llm", tenant="product"),
            "research",
            rt.TENANT,
            "charged to 'research'",
            id="tenant tag naming another tenant",
        ),
        pytest.param(
            tags(tier="inference", gpus="1", project="llm"),
            None,
            rt.TENANT,
            "locations:",
            id="location bound to no tenant",
        ),
        pytest.param(
            tags(tier="inference", gpus="1"), "research", rt.PROJECT, "one of llm, vision", id="project missing"
        ),
        pytest.param(
            tags(tier="inference", gpus="1", project="ads"),
            "research",
            rt.PROJECT,
            "use one of llm, vision",
            id="unknown project",
        ),
        pytest.param(
            tags(tier="inference", gpus="1", project="llm", gpu_model="H10"),
            "research",
            rt.GPU_MODEL,
            "did you mean H100-SXM",
            id="unknown GPU model",
        ),
        pytest.param(
            tags(tier="inference", gpus="1", project="llm", gpu_memory_gb="0"),
            "research",
            rt.GPU_MEMORY_GB,
            "greater than 0",
            id="zero GPU memory",
        ),
        pytest.param(
            tags(tier="inference", gpu_memory_gb="10"),
            "research",
            rt.GPU_MEMORY_GB,
            "add xirang/gpus",
            id="memory without GPUs",
        ),
        pytest.param(
            {**tags(tier="inference", gpus="1", project="llm"), "xirang/gpu": "2"},
            "research",
            "xirang/gpu",
            "did you mean xirang/gpus",
            id="misspelt key",
        ),
    ],
)
def test_a_bad_tag_is_a_problem_naming_the_tag_and_the_fix(
    given: dict[str, str], tenant: str | None, tag: str, fix: str
) -> None:
    got = parse(given, tenant)
    assert isinstance(got, rt.TagProblem), got
    assert got.tag == tag
    assert tag in got.message
    assert fix in got.message


def test_the_only_project_of_a_tenant_is_the_default() -> None:
    got = rt.parse(tags(tier="inference", gpus="1"), "product", projects=("serving",))
    assert isinstance(got, Request)
    assert got.project == "serving"


@pytest.mark.parametrize(
    ("tier", "priority"),
    [
        pytest.param(Tier.INFERENCE, 200, id="P0"),
        pytest.param(Tier.ONLINE_TRAINING, 100, id="P1"),
        pytest.param(Tier.OFFLINE_TRAINING, 0, id="P2 offline"),
        pytest.param(Tier.BATCH_INFERENCE, 0, id="P2 batch"),
    ],
)
def test_dagster_priority_follows_the_tier(tier: Tier, priority: int) -> None:
    assert rt.priority_for(tier) == priority


def test_the_allocation_tag_round_trips() -> None:
    request = Request("r1", "research", "llm", Tier.ONLINE_TRAINING, 0.0, gpus=2)
    placement = Placement(
        (GpuSlice("h100-00", 3, 1000, 81920), GpuSlice("h100-00", 5, 1000, 81920)),
        (NodeShare("h100-00", 4000, 8192),),
    )
    got = rt.read_allocation_tag(rt.allocation_tag(Allocation(request, placement, 0.0), True, "local"))
    assert got == rt.RunAllocation(
        request="r1",
        gpus=(("h100-00", 3, 1000, 81920), ("h100-00", 5, 1000, 81920)),
        nodes=(("h100-00", 4000, 8192),),
        milli=2000,
        borrowed=True,
        launcher="local",
    )
    assert got.node == "h100-00"
    assert got.device_ids() == [3, 5]
    assert got.gpu_memory_mib == 163840
    assert rt.read_allocation_tag("") is None
