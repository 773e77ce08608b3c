"""`tag_parsing.parse`: the run tag contract of DESIGN.md section 7, without Dagster."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xirang_platform.control import run_allocation, tag_parsing
from xirang_platform.control import run_tags as rt
from xirang_platform.scheduling.model import Allocation, GpuSlice, NodeShare, Placement, Request, Tier

PROJECTS = ("llm", "vision")


def tags(**kw: str) -> dict[str, str]:
    """Run tags from keyword arguments: `gpu_milli="250"` is `xirang/gpu-milli: 250`."""
    return {f"xirang/{k.replace('_', '-')}": v for k, v in kw.items()}


def assert_problem(got: object, tag: str, fix: str) -> None:
    """`got` is a problem with tag `tag` whose message names the tag and says `fix`."""
    assert isinstance(got, rt.TagProblem), got
    assert got.tag == tag
    assert tag in got.message
    assert fix in got.message


def parse(t: dict[str, str], tenant: str | None = "research") -> Request | rt.TagProblem | None:
    return tag_parsing.parse(t, tenant, run_id="r1", submit_time=100.0, projects=PROJECTS)


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
            tags(tier="inference", gpus="-1", project="llm"),
            "research",
            rt.GPUS,
            "not a whole number in ASCII digits",
            id="negative GPUs",
        ),
        pytest.param(
            tags(tier="offline-training", gpus="1", project="llm", reclaims="-1"),
            "research",
            rt.RECLAIMS,
            "0..1000000",
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
            "1..999",
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
    assert_problem(parse(given, tenant), tag, fix)


def test_the_only_project_of_a_tenant_is_the_default() -> None:
    got = tag_parsing.parse(tags(tier="inference", gpus="1"), "product", projects=("serving",))
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


@pytest.mark.parametrize(
    ("hold_reason", "gate"),
    [
        pytest.param("capacity: no room for 4 GPUs now", "capacity", id="a capacity hold closes the gate as capacity"),
        pytest.param("quota: tenant research at its cap, 8 of 14.4 GPUs held", "quota", id="a quota hold"),
        pytest.param("reserved: its units are held for it while run v stops", "reserved", id="a preemptor waits"),
        pytest.param("queued: waiting for the next scheduling tick", "queued", id="the coordinator's text"),
        pytest.param("reconcile: back in the queue", "reconcile", id="reconcile's text"),
        pytest.param("deferred: the cycle's budget ran out before it", "deferred", id="a deferred request"),
        pytest.param("ledger: over capacity on node n1", "ledger", id="the ledger refused its reservation"),
        pytest.param("capacity", "closed", id="a kind without its colon is no kind"),
        pytest.param("something else: entirely", "closed", id="an unknown kind still closes the gate"),
        pytest.param("", "closed", id="no text still closes the gate"),
    ],
)
def test_a_closed_gate_names_the_kind_of_its_hold(hold_reason: str, gate: str) -> None:
    assert rt.closed_gate(hold_reason) == gate
    assert rt.is_closed(gate)


@pytest.mark.parametrize(
    ("gate", "closed"),
    [
        *[pytest.param(v, True, id=f"{v} holds the run") for v in rt.CLOSED_GATES],
        pytest.param(rt.GATE_OPEN, False, id="open launches"),
        pytest.param(rt.GATE_NONE, False, id="none (no GPU) launches"),
        pytest.param("", False, id="a blank gate is no gate"),
        pytest.param(None, False, id="no gate tag"),
    ],
)
def test_which_gate_values_hold_a_run(gate: str | None, closed: bool) -> None:
    assert rt.is_closed(gate) is closed


def test_the_allocation_tag_round_trips() -> None:
    request = Request("r1", "research", "llm", Tier.ONLINE_TRAINING, 0.0, gpus=2)
    placement = Placement(
        (GpuSlice("h100-00", 3, 1000, 81920), GpuSlice("h100-00", 5, 1000, 81920)),
        (NodeShare("h100-00", 4000, 8192),),
    )
    got = run_allocation.read_allocation_tag(
        run_allocation.allocation_tag(Allocation(request, placement, 0.0), True, "local")
    )
    assert got == run_allocation.RunAllocation(
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
    assert run_allocation.read_allocation_tag("") is None


# -- numbers (DESIGN.md section 7): ASCII decimal digits within `rt.BOUNDS` ---------------------------

GPU_RUN = tags(tier="offline-training", gpus="2", project="llm")
FRACTION_RUN = tags(tier="inference", gpu_milli="250", project="llm")


@pytest.mark.parametrize(
    ("key", "value", "fix"),
    [
        pytest.param(rt.GPUS, "inf", "0..100000", id="GPUs inf"),
        pytest.param(rt.GPUS, "nan", "0..100000", id="GPUs nan"),
        pytest.param(rt.GPUS, "1e3", "not a whole number in ASCII digits", id="GPUs with an exponent"),
        pytest.param(rt.GPUS, "+2", "not a whole number in ASCII digits", id="GPUs with a sign"),
        pytest.param(rt.GPUS, "1_0", "not a whole number in ASCII digits", id="GPUs with an underscore"),
        pytest.param(rt.GPUS, "4.0", "not a whole number in ASCII digits", id="GPUs with a decimal point"),
        pytest.param(rt.GPUS, "0x10", "not a whole number in ASCII digits", id="GPUs in hex"),
        pytest.param(rt.GPUS, "\uff14", "not a whole number in ASCII digits", id="GPUs in full-width digits"),
        pytest.param(rt.GPUS, "\u0661\u0662", "not a whole number in ASCII digits", id="GPUs in Arabic-Indic digits"),
        pytest.param(rt.GPUS, "100001", "out of range", id="GPUs past the bound"),
        pytest.param(rt.GPUS, "9" * 5000, "not a whole number", id="GPUs of 5,000 digits"),
        pytest.param(rt.GPUS, " 4", "spaces around its value: write '4'", id="GPUs padded before"),
        pytest.param(rt.GPUS, "4\n", "spaces around its value", id="GPUs with a trailing newline"),
        pytest.param(rt.GPUS, "   ", "blank", id="GPUs all spaces"),
        pytest.param(rt.PREEMPTED, "3000000000", "0..1000000", id="preemptions past a 32-bit column"),
        pytest.param(rt.PREEMPTED, "1e3", "whole number", id="preemptions with an exponent"),
        pytest.param(rt.RECLAIMS, "3000000000", "0..1000000", id="reclaims past a 32-bit column"),
        pytest.param(rt.SUBMIT_TIME, "1e308", "plain decimal number", id="submit time 1e308"),
        pytest.param(rt.SUBMIT_TIME, "-5", "plain decimal number", id="negative submit time"),
        pytest.param(rt.SUBMIT_TIME, "100000000001", "out of range", id="submit time past the year 5138"),
        pytest.param(rt.RECLAIMED_AT, "inf", "plain decimal number", id="reclaimed at inf"),
        pytest.param(rt.GPU_MEMORY_GB, "1e308", "plain decimal number", id="GPU memory 1e308"),
        pytest.param(rt.GPU_MEMORY_GB, "nan", "plain decimal number", id="GPU memory nan"),
        pytest.param(rt.GPU_MEMORY_GB, "-1", "plain decimal number", id="negative GPU memory"),
        pytest.param(rt.GPU_MEMORY_GB, ".5", "plain decimal number", id="GPU memory without a leading digit"),
        pytest.param(rt.GPU_MEMORY_GB, "5.", "plain decimal number", id="GPU memory ending in a point"),
        pytest.param(rt.GPU_MEMORY_GB, "1.2.3", "plain decimal number", id="GPU memory with two points"),
        pytest.param(rt.GPU_MEMORY_GB, "10001", "0..10000", id="GPU memory past the bound"),
        pytest.param(rt.MIN_COMPUTE_LEVEL, "100001", "0..100000", id="compute level past the bound"),
        pytest.param(rt.MIN_COMPUTE_LEVEL, "８", "whole number", id="compute level in full-width digits"),
        pytest.param(rt.EXPECTED_DURATION, "0", "out of range: give the seconds", id="an expected duration of 0"),
        pytest.param(rt.EXPECTED_DURATION, "-60", "plain decimal number", id="a negative expected duration"),
        pytest.param(rt.EXPECTED_DURATION, "1h", "plain decimal number", id="an expected duration with a unit"),
        pytest.param(rt.EXPECTED_DURATION, "inf", "3600 = an hour", id="an infinite expected duration"),
        pytest.param(rt.EXPECTED_DURATION, "31622401", "1..31622400", id="an expected duration past a year"),
    ],
)
def test_a_number_tag_is_ascii_digits_within_its_bound(key: str, value: str, fix: str) -> None:
    got = parse({**GPU_RUN, key: value})
    assert isinstance(got, rt.TagProblem), got
    assert (got.tag, got.value) == (key, value)
    assert got.message.startswith(key)
    assert fix in got.message


@pytest.mark.parametrize(
    ("given", "want"),
    [
        pytest.param({rt.EXPECTED_DURATION: "3600"}, 3600.0, id="whole seconds"),
        pytest.param({rt.EXPECTED_DURATION: "90.5"}, 90.5, id="with a decimal point"),
        pytest.param({}, None, id="no tag: unknown"),
        pytest.param({rt.EXPECTED_DURATION: ""}, None, id="a blanked tag: unknown"),
        pytest.param({rt.EXPECTED_DURATION: "soon"}, None, id="a value the coordinator refuses: unknown"),
    ],
)
def test_the_expected_duration_is_read_in_seconds(given: dict[str, str], want: float | None) -> None:
    assert tag_parsing.expected_duration({**GPU_RUN, **given}) == want


def test_an_expected_duration_leaves_the_request_as_it_is() -> None:
    # It informs the queue estimate only: admission, order and placement never read it.
    assert parse({**GPU_RUN, rt.EXPECTED_DURATION: "3600"}) == parse(GPU_RUN)
    assert parse({**tags(tier="inference"), rt.EXPECTED_DURATION: "60"}) is None  # a run without GPUs may state it


@pytest.mark.parametrize(
    ("value", "fix"),
    [
        pytest.param("0", "1..999 (500 = half; for whole GPUs use xirang/gpus)", id="no milli"),
        pytest.param("1000", "1..999", id="a whole GPU in milli"),
        pytest.param("250.5", "whole number", id="a decimal milli"),
    ],
)
def test_milli_is_a_fraction_of_one_gpu(value: str, fix: str) -> None:
    got = parse({**FRACTION_RUN, rt.GPU_MILLI: value})
    assert isinstance(got, rt.TagProblem), got
    assert got.tag == rt.GPU_MILLI
    assert fix in got.message


@pytest.mark.parametrize(
    ("given", "want"),
    [
        pytest.param({rt.GPU_MEMORY_GB: "0.5"}, dict(gpu_memory_mib=512), id="half a GB"),
        pytest.param({rt.GPU_MEMORY_GB: "0"}, dict(gpu_memory_mib=0), id="no GPU memory asked"),
        pytest.param({rt.GPU_MEMORY_GB: "10000"}, dict(gpu_memory_mib=10_240_000), id="memory at its bound"),
        pytest.param({rt.GPUS: "100000"}, dict(gpus=100_000), id="GPUs at their bound"),
        pytest.param({rt.GPUS: "08"}, dict(gpus=8), id="a leading zero is a digit"),
        pytest.param({rt.PREEMPTED: "1000000"}, dict(preempted=1_000_000), id="preemptions at their bound"),
        pytest.param({rt.SUBMIT_TIME: "1764547200.125"}, dict(submit_time=1764547200.125), id="a decimal time"),
    ],
)
def test_numbers_within_their_bounds_are_read(given: dict[str, str], want: dict[str, object]) -> None:
    got = parse({**GPU_RUN, **given})
    assert isinstance(got, Request), got
    assert {k: getattr(got, k) for k in want} == want


def test_the_stated_gpu_memory_reads_back_as_the_same_mib() -> None:
    for mib in [*range(0, 4096), 10_241, 81_920, 10_240_000]:
        assert math.ceil(float(rt.gb_text(mib)) * 1024) == mib, mib


# -- a submission: the user's request tags over the assets' declaration ------------------------------

NOW = rt.Lineage(500.0)
TRAIN = tags(tier="offline-training", gpus="4", project="llm", gpu_memory_gb="40")  # what an asset declares
REPLICA = tags(tier="inference", gpu_milli="250", project="llm")


def submit(
    given: dict[str, str], declared: dict[str, str] | None = None, lineage: rt.Lineage = NOW
) -> Request | rt.TagProblem | None:
    return tag_parsing.parse_submission(
        given, declared or {}, "research", run_id="r1", lineage=lineage, projects=PROJECTS
    )


@pytest.mark.parametrize(
    ("given", "declared", "want"),
    [
        pytest.param({}, TRAIN, dict(gpus=4, gpu_memory_mib=40960), id="the declaration alone"),
        pytest.param(
            tags(tier="online-training"),
            TRAIN,
            dict(gpus=4, tier=Tier.ONLINE_TRAINING, gpu_memory_mib=40960),
            id="a tag naming the tier keeps the declared GPUs",
        ),
        pytest.param(tags(gpus="8"), TRAIN, dict(gpus=8, gpu_memory_mib=40960), id="a tag may ask for more GPUs"),
        pytest.param(
            tags(gpus="1"), REPLICA, dict(gpus=1, milli_per_gpu=1000), id="whole GPUs over a declared fraction"
        ),
        pytest.param(
            tags(gpus="", gpu_milli="500"),
            REPLICA,
            dict(gpus=1, milli_per_gpu=500),
            id="the blank other spelling of a restated ask (a re-execution) is no ask",
        ),
        pytest.param(
            tags(preempted="3000000000", submit_time="1", reclaims="7", reclaimed_at="1", parent_run="victim"),
            TRAIN,
            dict(submit_time=500.0, preempted=0, reclaims=0, reclaimed_at=None),
            id="platform tags a user wrote are not read",
        ),
    ],
)
def test_a_submission_is_its_tags_over_the_declared_needs(
    given: dict[str, str], declared: dict[str, str], want: dict[str, object]
) -> None:
    got = submit(given, declared)
    assert isinstance(got, Request), got
    assert {k: getattr(got, k) for k in want} == want


def test_a_resumption_takes_the_lineage_the_platform_gives_it() -> None:
    lineage = rt.Lineage(42.5, preempted=2, reclaimed_at=4200.5, reclaims=1)
    got = submit(tags(preempted="0", submit_time="9999"), TRAIN, lineage)
    assert isinstance(got, Request), got
    assert rt.Lineage.of(got) == lineage


@pytest.mark.parametrize(
    ("given", "declared", "tag", "fix"),
    [
        pytest.param(tags(gpus="0"), TRAIN, rt.GPUS, "cannot drop a declared need", id="no GPU on a 4-GPU asset"),
        pytest.param(tags(gpus="2"), TRAIN, rt.GPUS, "(xirang/gpus=4)", id="fewer GPUs than declared"),
        pytest.param(
            tags(gpu_milli="100"), REPLICA, rt.GPU_MILLI, "(xirang/gpu-milli=250)", id="less milli than declared"
        ),
        pytest.param(tags(gpu_milli=""), REPLICA, rt.GPU_MILLI, "is empty: remove the tag", id="empty milli"),
        pytest.param(tags(gpus=""), TRAIN, rt.GPUS, "is empty", id="empty GPUs on a declared asset"),
        pytest.param(tags(gpus="", gpu_milli=""), {}, rt.GPU_MILLI, "is empty", id="both spellings empty"),
        pytest.param(tags(tier=""), TRAIN, rt.TIER, "is empty", id="empty tier"),
        pytest.param(tags(tier=" "), TRAIN, rt.TIER, "is empty", id="a tier of one space"),
        pytest.param(tags(project="llm "), TRAIN, rt.PROJECT, "write 'llm'", id="a padded project"),
        pytest.param(tags(gpu_memory_gb="20"), TRAIN, rt.GPU_MEMORY_GB, "at least 40", id="less memory than declared"),
        pytest.param(tags(tenant="product"), {}, rt.TENANT, "charged to 'research'", id="another tenant, no GPU"),
        pytest.param(tags(tenant=""), TRAIN, rt.TENANT, "is empty", id="an empty tenant"),
    ],
)
def test_a_bad_submission_is_a_problem_naming_the_tag_and_the_fix(
    given: dict[str, str], declared: dict[str, str], tag: str, fix: str
) -> None:
    assert_problem(submit(given, declared), tag, fix)


def test_a_run_without_gpus_cannot_name_another_tenant() -> None:
    got = parse(tags(tenant="product"))
    assert isinstance(got, rt.TagProblem)
    assert got.tag == rt.TENANT
    assert parse(tags(tenant="research")) is None


KEYS = [*rt.REQUEST_TAGS, *rt.LINEAGE_TAGS, rt.PARENT_RUN, rt.GATE]


@settings(max_examples=300, deadline=None)
@given(
    values=st.dictionaries(
        st.sampled_from(KEYS), st.text(max_size=12) | st.from_regex(r"[0-9.]{1,30}", fullmatch=True)
    ),
    declared=st.dictionaries(st.sampled_from(rt.REQUEST_TAGS), st.text(max_size=6)),
)
def test_any_tag_values_give_a_request_within_bounds_or_a_problem_never_an_error(
    values: dict[str, str], declared: dict[str, str]
) -> None:
    for got in (parse(values), submit(values, declared)):
        assert got is None or isinstance(got, (Request, rt.TagProblem))
        if isinstance(got, rt.TagProblem):
            assert got.message.startswith(got.tag) or got.tag in got.message
        if isinstance(got, Request):
            assert 1 <= got.gpus <= 100_000
            assert 1 <= got.milli_per_gpu <= 1000
            assert 0 <= got.preempted <= rt.MAX_COUNT
            assert 0 <= got.reclaims <= rt.MAX_COUNT
            assert 0 <= got.submit_time <= rt.MAX_UNIX_TIME
            assert 0 <= got.gpu_memory_mib <= 10_240_000
