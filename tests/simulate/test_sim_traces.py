"""Trace readers: openb pods and ITP jobs become requests; every broken row names file:line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.simulate.sim_builders import ITP_HEADER, OPENB_HEADER, csv_file, job
from xirang_platform.scheduling.model import Tier
from xirang_platform.simulate.traces import (
    ITP_CPU_MILLI_PER_GPU,
    ITP_MEMORY_MIB_PER_GPU,
    JobsSpec,
    TraceError,
    limit_jobs,
    merge_traces,
    parse_jobs_spec,
    read_itp_jobs,
    read_jobs,
    read_openb_pods,
)

REPO = Path(__file__).resolve().parents[2]
OPENB_PODS = REPO / "data/traces/alibaba_openb_gpu_2023/openb_pod_list_default.csv"
ITP01 = REPO / "data/traces/microsoft_itp_elasticflow_2021/cluster01.csv"

GOOD_PODS = [
    "pod-a,12000,16384,1,1000,,LS,Running,100,600,100",
    "pod-b,6000,12288,1,460,T4|A100-80GB,BE,Succeeded,150,250,150",
    "pod-c,2000,4096,0,0,,Burstable,Failed,200,260,",
    "pod-d,64000,262144,8,1000,,Guaranteed,Running,300,,300",
]


def test_openb_rows_become_single_node_requests_rebased_to_the_first_creation(tmp_path: Path) -> None:
    jobs = read_openb_pods(csv_file(tmp_path, "pods.csv", OPENB_HEADER, GOOD_PODS))
    got = {
        j.request.id: (
            j.request.tier,
            j.request.submit_time,
            j.duration_s,
            j.request.gpus,
            j.request.milli_per_gpu,
            j.request.cpu_milli,
            j.request.memory_mib,
            j.request.gpu_models,
            j.request.single_node,
        )
        for j in jobs
    }
    assert got == {
        "pod-a": (Tier.INFERENCE, 0.0, 500.0, 1, 1000, 12000, 16384, frozenset(), True),
        "pod-b": (Tier.OFFLINE_TRAINING, 50.0, 100.0, 1, 460, 6000, 12288, frozenset({"T4", "A100-80"}), True),
        "pod-c": (Tier.ONLINE_TRAINING, 100.0, 60.0, 0, 1000, 2000, 4096, frozenset(), True),
        # No deletion time: still running when the trace was cut, so it runs to the file's latest time (600).
        "pod-d": (Tier.ONLINE_TRAINING, 200.0, 300.0, 8, 1000, 64000, 262144, frozenset(), True),
    }
    assert [j.request.id for j in jobs] == ["pod-a", "pod-b", "pod-c", "pod-d"]


def test_openb_tier_from_the_spec_overrides_qos(tmp_path: Path) -> None:
    path = csv_file(tmp_path, "pods.csv", OPENB_HEADER, GOOD_PODS)
    jobs = read_jobs(JobsSpec(path, Tier.BATCH_INFERENCE, "acme", "web"))
    assert {(j.request.tier, j.request.tenant, j.request.project) for j in jobs} == {
        (Tier.BATCH_INFERENCE, "acme", "web")
    }


def test_itp_rows_become_gangs_with_per_gpu_cpu_and_memory(tmp_path: Path) -> None:
    rows = ["j1,5000,100,1", "j2,5010,3600,8", "j0,5000,50,64"]
    jobs = read_itp_jobs(
        csv_file(tmp_path, "c.csv", ITP_HEADER, rows), tier=Tier.ONLINE_TRAINING, tenant="t", project="p"
    )
    got = [
        (
            j.request.id,
            j.request.submit_time,
            j.duration_s,
            j.request.gpus,
            j.request.cpu_milli,
            j.request.memory_mib,
            j.request.single_node,
            j.request.tier,
        )
        for j in jobs
    ]
    assert got == [
        ("j0", 0.0, 50.0, 64, 64 * ITP_CPU_MILLI_PER_GPU, 64 * ITP_MEMORY_MIB_PER_GPU, False, Tier.ONLINE_TRAINING),
        ("j1", 0.0, 100.0, 1, ITP_CPU_MILLI_PER_GPU, ITP_MEMORY_MIB_PER_GPU, False, Tier.ONLINE_TRAINING),
        ("j2", 10.0, 3600.0, 8, 8 * ITP_CPU_MILLI_PER_GPU, 8 * ITP_MEMORY_MIB_PER_GPU, False, Tier.ONLINE_TRAINING),
    ]


def test_read_jobs_recognises_the_format_by_header_and_defaults_itp_to_offline(tmp_path: Path) -> None:
    itp = read_jobs(JobsSpec(csv_file(tmp_path, "c.csv", ITP_HEADER, ["j1,10,5,2"])))
    pods = read_jobs(JobsSpec(csv_file(tmp_path, "p.csv", OPENB_HEADER, GOOD_PODS[:1])))
    assert (itp[0].request.tier, itp[0].request.tenant, itp[0].request.project) == (
        Tier.OFFLINE_TRAINING,
        "default",
        "default",
    )
    assert pods[0].request.tier is Tier.INFERENCE


def test_the_real_trace_files_read_whole() -> None:
    pods = read_openb_pods(OPENB_PODS)
    itp = read_itp_jobs(ITP01)
    assert (len(pods), len(itp)) == (8152, 1595)
    assert pods[0].request.submit_time == 0.0
    assert itp[0].request.submit_time == 0.0
    assert sum(j.request.tier is Tier.INFERENCE for j in pods) == 4647  # LS rows, per the trace README
    assert max(j.request.gpus for j in itp) == 64


@pytest.mark.parametrize(
    ("header", "rows", "where"),
    [
        pytest.param(
            OPENB_HEADER,
            ["p0,1000,1,1,1000,,LS,Running,0,5,0", "p1,abc,1,1,1000,,LS,Running,0,5,0"],
            ":3: field cpu_milli is 'abc'",
            id="non-numeric cpu on line 3",
        ),
        pytest.param(OPENB_HEADER, ["p0,1000,1,1,1000,,XX,Running,0,5,0"], ":2: field qos is 'XX'", id="unknown qos"),
        pytest.param(
            OPENB_HEADER,
            ["p0,1000,1,1,1200,,LS,Running,0,5,0"],
            ":2: field gpu_milli is '1200'",
            id="gpu_milli above one GPU",
        ),
        pytest.param(
            OPENB_HEADER,
            ["p0,1000,1,1,0,,LS,Running,0,5,0"],
            ":2: field gpu_milli is '0'",
            id="a one-GPU pod asking for none of it",
        ),
        pytest.param(
            OPENB_HEADER, ["p0,1000,1,-1,1000,,LS,Running,0,5,0"], ":2: field num_gpu is '-1'", id="negative GPU count"
        ),
        pytest.param(
            OPENB_HEADER,
            ["p0,1000,1,1,1000,,LS,Running,10,5,0"],
            ":2: field deletion_time is '5'",
            id="deleted before created",
        ),
        pytest.param(
            OPENB_HEADER,
            ["p0,1000,1,1,1000,,LS,Running,0,5,0", "p0,1000,1,1,1000,,LS,Running,0,5,0"],
            ":3: field name is 'p0'",
            id="duplicate pod name",
        ),
        pytest.param(
            OPENB_HEADER,
            ["p0,1000,1,1,1000,,LS,Running,0,5,0", "", "p2,1000,1,1,1000,,LS,Running,0,5,0"],
            ":3: field name is ''",
            id="blank line keeps numbering",
        ),
        pytest.param(
            OPENB_HEADER,
            ["p0,1000,1,1,1000,,LS,Running,,5,0"],
            ":2: field creation_time is ''",
            id="missing creation time",
        ),
        pytest.param(ITP_HEADER, ["j0,1,2,1", "j1,1,2,1.5"], ":3: field num_gpu is '1.5'", id="fractional GPU count"),
        pytest.param(ITP_HEADER, ["j0,1,-2,1"], ":2: field duration is '-2'", id="negative duration"),
        pytest.param(ITP_HEADER, ["j0,x,2,1"], ":2: field submission_time is 'x'", id="non-numeric submit"),
        pytest.param("job_id,submission_time,num_gpu", ["j0,1,1"], ":1: header", id="header lacks a column"),
        # issue 10, item 1: a row with more (or fewer) fields than columns would shift them silently.
        pytest.param(ITP_HEADER, ["j1,0,100,1,5", "j2,7,200,2,3"], ":2: 5 fields for 4 columns", id="extra field"),
        pytest.param(ITP_HEADER, ["j1,0,100,1", "j2,7,200"], ":3: 3 fields for 4 columns", id="missing field"),
        pytest.param(
            OPENB_HEADER, ["p0,1000,1,1,1000,,LS,Running,0,5,0,junk"], ":2: 12 fields for 11 columns", id="openb extra"
        ),
        # issue 7, item 8: gpu_spec names go through the catalog; an unknown one is named at read time.
        pytest.param(
            OPENB_HEADER,
            ["p0,1000,1,1,1000,V100M16,LS,Running,0,5,0", "p1,1000,1,1,1000,V100M16|X9,LS,Running,0,5,0"],
            ":3: field gpu_spec is 'V100M16|X9': unknown GPU model 'X9'",
            id="unknown model in gpu_spec",
        ),
    ],
)
def test_a_broken_row_names_file_line_and_field(tmp_path: Path, header: str, rows: list[str], where: str) -> None:
    path = csv_file(tmp_path, "t.csv", header, rows)
    reader = read_itp_jobs if header.startswith("job_id") else read_openb_pods
    with pytest.raises(TraceError) as err:
        reader(path)
    assert f"{path}{where}" in str(err.value)


@pytest.mark.parametrize("header", [OPENB_HEADER, ITP_HEADER], ids=["openb", "itp"])
def test_a_header_only_file_has_no_jobs(tmp_path: Path, header: str) -> None:
    assert read_jobs(JobsSpec(csv_file(tmp_path, "t.csv", header, []))) == []


def test_an_unknown_header_is_named_with_both_formats(tmp_path: Path) -> None:
    path = csv_file(tmp_path, "t.csv", "a,b,c", ["1,2,3"])
    with pytest.raises(TraceError, match="neither an openb pod list") as err:
        read_jobs(JobsSpec(path))
    assert f"{path}:1:" in str(err.value)


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        pytest.param("c.csv", JobsSpec(Path("c.csv")), id="file only"),
        pytest.param("c.csv:online-training", JobsSpec(Path("c.csv"), Tier.ONLINE_TRAINING), id="with tier"),
        pytest.param(
            "c.csv:inference:acme/web", JobsSpec(Path("c.csv"), Tier.INFERENCE, "acme", "web"), id="with account"
        ),
        pytest.param(
            "c.csv::acme/web", JobsSpec(Path("c.csv"), None, "acme", "web"), id="account keeping the trace tier"
        ),
    ],
)
def test_jobs_spec_parses(spec: str, want: JobsSpec) -> None:
    assert parse_jobs_spec(spec) == want


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param("c.csv:training", "'training' is not a tier", id="unknown tier"),
        pytest.param("c.csv:inference:acme", "'acme' is not TENANT/PROJECT", id="account without project"),
        pytest.param("c.csv:inference:acme/", "is not TENANT/PROJECT", id="empty project"),
        pytest.param("c.csv:a:b:c", "too many ':'", id="too many parts"),
        pytest.param(":inference", "no file", id="no file"),
    ],
)
def test_a_bad_jobs_spec_is_a_clear_error(spec: str, message: str) -> None:
    with pytest.raises(TraceError, match=message) as err:
        parse_jobs_spec(spec)
    assert "FILE[:TIER[:TENANT/PROJECT]]" in str(err.value)


def test_openb_gpu_spec_names_become_catalog_names(tmp_path: Path) -> None:
    rows = ["p0,1000,1,1,1000,V100M16|V100M32,LS,Running,0,5,0", "p1,1000,1,1,1000,g2| t4 ,LS,Running,0,5,0"]
    jobs = read_openb_pods(csv_file(tmp_path, "pods.csv", OPENB_HEADER, rows))
    assert [j.request.gpu_models for j in jobs] == [frozenset({"V100-16", "V100-32"}), frozenset({"G2", "T4"})]


@pytest.mark.parametrize("suffix", ["pods.csv", "itp.csv"])
def test_a_file_that_is_not_utf8_is_named(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / suffix
    path.write_bytes(bytes(range(128, 256)) * 4)
    with pytest.raises(TraceError, match=f"{suffix}: not UTF-8 text"):
        read_jobs(JobsSpec(path))


def test_a_missing_trace_file_is_named() -> None:
    with pytest.raises(TraceError, match="no such trace file"):
        read_jobs(JobsSpec(Path("/nonexistent/c.csv")))


def test_merging_traces_prefixes_ids_per_file_and_orders_by_submit() -> None:
    a = [job("x", submit=5.0), job("y", submit=0.0)]
    b = [job("x", submit=1.0)]
    merged = merge_traces([("c01", a), ("c01", b)])
    assert [(j.request.id, j.request.submit_time) for j in merged] == [("c01/y", 0.0), ("c01#2/x", 1.0), ("c01/x", 5.0)]
    assert [j.request.id for j in merge_traces([("c01", a)])] == ["y", "x"]


def test_limit_keeps_the_first_jobs_in_submit_order() -> None:
    jobs = [job("c", submit=2.0), job("a", submit=0.0), job("b", submit=0.0)]
    assert [j.request.id for j in limit_jobs(jobs, 2)] == ["a", "b"]
    assert len(limit_jobs(jobs, None)) == 3


SHORT_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli"  # FGD's multigpu* lists: no spec, qos or times
SHORT_PODS = ["pod-a,12000,16384,1,1000", "pod-b,6000,12288,1,460", "pod-c,64000,262144,8,1000", "pod-d,2000,4096,0,0"]


@pytest.mark.parametrize(
    ("tier", "want_tier"),
    [
        pytest.param(None, Tier.OFFLINE_TRAINING, id="no qos and no tier in the spec: offline-training"),
        pytest.param(Tier.INFERENCE, Tier.INFERENCE, id="no qos: the tier of the --jobs spec"),
    ],
)
def test_the_short_openb_header_is_read_for_fill_mode(tmp_path: Path, tier: Tier | None, want_tier: Tier) -> None:
    path = csv_file(tmp_path, "multigpu.csv", SHORT_HEADER, SHORT_PODS)
    jobs = read_jobs(JobsSpec(path, tier), times=False)
    got = {
        j.request.id: (
            j.request.tier,
            j.request.gpus,
            j.request.milli_per_gpu,
            j.request.cpu_milli,
            j.request.gpu_models,
        )
        for j in jobs
    }
    assert got == {
        "pod-a": (want_tier, 1, 1000, 12000, frozenset()),
        "pod-b": (want_tier, 1, 460, 6000, frozenset()),  # no gpu_spec column: any model
        "pod-c": (want_tier, 8, 1000, 64000, frozenset()),
        "pod-d": (want_tier, 0, 1000, 2000, frozenset()),
    }
    assert {(j.request.submit_time, j.duration_s) for j in jobs} == {(0.0, 0.0)}


def test_the_short_openb_header_is_refused_where_times_are_needed(tmp_path: Path) -> None:
    path = csv_file(tmp_path, "multigpu.csv", SHORT_HEADER, SHORT_PODS)
    with pytest.raises(TraceError, match=r"multigpu.csv:1: header lacks creation_time, deletion_time: a replay needs"):
        read_jobs(JobsSpec(path))
    with pytest.raises(TraceError, match="run it with --mode fill"):
        read_openb_pods(path)


def test_a_short_header_row_is_still_checked(tmp_path: Path) -> None:
    path = csv_file(tmp_path, "multigpu.csv", SHORT_HEADER, [*SHORT_PODS, "pod-e,1000,1024,1,0"])
    with pytest.raises(TraceError, match="multigpu.csv:6: field gpu_milli is '0': a one-GPU pod must ask"):
        read_openb_pods(path, times=False)


@pytest.mark.parametrize("workload", ["multigpu30", "gpushare60", "cpu100", "gpuspec20"])
def test_the_bundled_openb_variants_are_read(workload: str) -> None:
    pods = read_openb_pods(OPENB_PODS.with_name(f"openb_pod_list_{workload}.csv"), times=False)
    assert len(pods) == {"multigpu30": 8508, "gpushare60": 8152, "cpu100": 7853, "gpuspec20": 8152}[workload]
    constrained = sum(1 for j in pods if j.request.gpu_models)
    assert (constrained > 0) == (workload == "gpuspec20")
