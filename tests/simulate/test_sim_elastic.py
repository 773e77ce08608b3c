"""Elastic replay (DESIGN.md section 8, `simulate/elastic.py`): work conserved across sizes at the
stated scaling curve, resizes logged and checked, and the JSON figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.simulate.sim_builders import ITP_HEADER, book, csv_file, job, node, pool
from xirang_platform.cli.simulate import simulate
from xirang_platform.scheduling.snapshot import SchedulerConfig
from xirang_platform.simulate.elastic import SCALING_EXPONENT, elastic_jobs, parse_range, speed
from xirang_platform.simulate.events import check_events, read_events
from xirang_platform.simulate.metrics import compute_metrics
from xirang_platform.simulate.replay import ReplayOptions, replay
from xirang_platform.simulate.traces import read_itp_jobs

REPO = Path(__file__).resolve().parents[2]
ITP01 = REPO / "data/traces/microsoft_itp_elasticflow_2021/cluster01.csv"
EIGHT = pool(node("n0", gpus=8))
CHECKED = ReplayOptions(check_state=True, resize_cost_s=30.0)


def run(p, jobs, config=None, options=CHECKED, quota=None):
    b = book(default=quota if quota is not None else p.gpus)
    result = replay(p, b, jobs, config or SchedulerConfig(), options)
    assert check_events(result.events, p, b) == []
    return result, compute_metrics(result.events, capacity_gpus=p.gpus)


def gang(job_id, *, submit=0.0, duration=1_000.0, gpus=4):
    return job(job_id, submit=submit, duration=duration, gpus=gpus, single_node=False)


def test_the_scaling_curve_is_the_stated_power_law() -> None:
    assert pytest.approx(0.9382, abs=1e-4) == SCALING_EXPONENT
    assert speed(4, 4) == 1.0
    assert speed(512, 1) == pytest.approx(0.68 * 512)
    assert speed(8, 4) == pytest.approx(2**SCALING_EXPONENT)


def test_a_job_alone_runs_at_its_largest_size_and_its_work_is_conserved() -> None:
    result, m = run(EIGHT, elastic_jobs([gang("a")], 0.5, 2))
    (finish,) = [e for e in result.events if e["event"] == "finish"]
    assert finish["t"] == pytest.approx(1_000 / 2**SCALING_EXPONENT)
    assert (m["resizes"], m["training_queue_mean_s"]) == (0, 0.0)


def test_a_second_job_shrinks_the_first_instead_of_waiting_and_both_conserve_their_work() -> None:
    jobs = elastic_jobs([gang("a"), gang("b", submit=100)], 0.5, 2)
    result, m = run(EIGHT, jobs)
    resizes = [e for e in result.events if e["event"] == "resize"]
    assert [(e["job"], e["kind"], e["old_gpus"], e["new_gpus"], e["by"]) for e in resizes][:1] == [
        ("a", "shrink", 8, 6, "b")
    ]
    assert m["shrinks"] >= 1
    assert m["lost_gpu_seconds"] == pytest.approx(m["resize_lost_gpu_seconds"]) == 30 * 6
    # a did 100 s at 8 GPUs, then restarts at 6 for 30 s: what is left takes its time at 6.
    a_finish = next(e["t"] for e in result.events if e["event"] == "finish" and e["job"] == "a")
    assert a_finish == pytest.approx(130 + (1_000 - 100 * speed(8, 4)) / speed(6, 4))
    (b_admit,) = [e for e in result.events if e["event"] == "admit" and e["job"] == "b"]
    assert (b_admit["t"], len(b_admit["alloc"])) == (100, 2)


def test_growth_waits_out_the_idle_span_then_takes_the_units() -> None:
    config = SchedulerConfig(elastic_grow_idle_s=600)
    jobs = elastic_jobs([gang("a", duration=50_000), gang("b", duration=1_000)], 0.5, 2)
    result, m = run(EIGHT, jobs, config)
    (grow,) = [e for e in result.events if e["event"] == "resize" and e["kind"] == "grow"]
    b_finish = next(e["t"] for e in result.events if e["event"] == "finish" and e["job"] == "b")
    assert (grow["job"], grow["t"]) == ("a", pytest.approx(b_finish + 600))
    assert m["grows"] == 1


def test_elastic_and_fixed_replays_of_a_real_trace_keep_every_invariant() -> None:
    jobs = read_itp_jobs(ITP01)[:120]
    p = pool(*(node(f"n{i}", gpus=8, domain=f"d{i // 2}") for i in range(4)))
    _, fixed = run(p, jobs)
    result, elastic = run(p, elastic_jobs(jobs, 0.5, 2))
    # Jobs larger than the pool never fit at their trace size; at half of it some do.
    assert elastic["jobs_finished"] + elastic["jobs_rejected"] == fixed["jobs_finished"] + fixed["jobs_rejected"] == 120
    assert elastic["jobs_finished"] >= fixed["jobs_finished"]
    assert elastic["resizes"] == elastic["grows"] + elastic["shrinks"] > 0
    for e in result.events:
        if e["event"] in ("admit", "resize"):
            assert len(e["alloc"]) >= 1


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("0.5:2", (0.5, 2.0), id="the issue's range"),
        pytest.param("1:1", (1.0, 1.0), id="fixed sizes"),
        pytest.param("2:0.5", None, id="min above max"),
        pytest.param("0:2", None, id="min of 0"),
        pytest.param("0.5", None, id="one number"),
        pytest.param("a:b", None, id="not numbers"),
        pytest.param("nan:2", None, id="nan"),
    ],
)
def test_parse_range(text, want) -> None:
    if want is None:
        with pytest.raises(ValueError, match="MIN:MAX"):
            parse_range(text)
    else:
        assert parse_range(text) == want


def test_elastic_jobs_round_to_whole_gpus_at_least_one_and_leave_inference_alone() -> None:
    jobs = [gang("a", gpus=1), gang("b", gpus=3), job("i", tier="inference", milli=500)]
    a, b, i = elastic_jobs(jobs, 0.5, 2)
    assert (a.request.elastic.min, a.request.elastic.max, a.request.gpus, a.trace_gpus) == (1, 2, 2, 1)
    assert (b.request.elastic.min, b.request.elastic.max) == (2, 6)
    assert i == jobs[2]


CLI = typer.Typer()
CLI.command()(simulate)


def test_the_cli_replays_elastic_and_writes_resize_events(tmp_path: Path) -> None:
    nodes = csv_file(tmp_path, "nodes.csv", "sn,cpu_milli,memory_mib,gpu,model", ["n0,64000,262144,8,T4"])
    itp = csv_file(tmp_path, "itp.csv", ITP_HEADER, ["j0,0,1000,4", "j1,100,500,4"])
    events = tmp_path / "ev.jsonl"
    args = ["--nodes", str(nodes), "--jobs", str(itp), "--elastic", "0.5:2", "--resize-cost", "30", "--json"]
    result = CliRunner().invoke(CLI, [*args, "--events", str(events)])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout.splitlines()[0])
    assert {"resizes", "grows", "shrinks", "training_queue_mean_s"} <= metrics.keys()
    assert metrics["jobs_finished"] == 2
    assert [e["kind"] for e in read_events(events) if e["event"] == "resize"][:1] == ["shrink"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        pytest.param(["--elastic", "2:0.5"], "0 < MIN <= 1 <= MAX", id="a range the wrong way round"),
        pytest.param(
            ["--elastic", "0.5:2", "--resize-cost", "-1"], "how long a resize stops a job", id="negative cost"
        ),
        pytest.param(
            ["--elastic", "0.5:2", "--preemption-notice", "60"], "drop one of them", id="with a preemption notice"
        ),
    ],
)
def test_the_cli_refuses_bad_elastic_flags(tmp_path: Path, args, says) -> None:
    itp = csv_file(tmp_path, "itp.csv", ITP_HEADER, ["j0,0,1000,4"])
    result = CliRunner().invoke(CLI, ["--jobs", str(itp), *args])
    assert result.exit_code == 2
    assert says in " ".join(result.output.split())
