"""`xirang simulate` end to end on small files: JSON metrics, event log, report, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from sim_builders import ITP_HEADER, OPENB_HEADER, csv_file
from typer.testing import CliRunner

from xirang_platform.pool.readers import read_pool
from xirang_platform.simulate.cli import simulate
from xirang_platform.simulate.events import check_events, read_events
from xirang_platform.simulate.tenants import read_tenants

NODES = "sn,cpu_milli,memory_mib,gpu,model"

app = typer.Typer()
app.command()(simulate)
runner = CliRunner()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "nodes": csv_file(tmp_path, "nodes.csv", NODES, ["n0,32000,131072,2,T4", "n1,32000,131072,2,T4"]),
        "pods": csv_file(
            tmp_path,
            "pods.csv",
            OPENB_HEADER,
            [
                "p0,4000,8192,1,1000,,LS,Running,0,100,0",
                "p1,4000,8192,1,500,,BE,Running,10,60,10",
                "p2,4000,8192,8,1000,,BE,Running,20,30,20",
            ],
        ),
        "itp": csv_file(tmp_path, "itp.csv", ITP_HEADER, ["j0,1000,500,4", "j1,1010,100,1"]),
        "tenants": _tenants(tmp_path),
    }


def _tenants(tmp_path: Path) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  web: {quota_gpus: 2}\n  lab: {quota_gpus: 2, projects: {llm: {}}}\n")
    return path


def test_json_metrics_event_log_and_report(files: dict[str, Path], tmp_path: Path) -> None:
    events, report = tmp_path / "ev.jsonl", tmp_path / "report"
    result = runner.invoke(
        app,
        [
            "--nodes",
            str(files["nodes"]),
            "--tenants",
            str(files["tenants"]),
            "--jobs",
            f"{files['pods']}::web/default",
            "--jobs",
            f"{files['itp']}:online-training:lab/llm",
            "--json",
            "--events",
            str(events),
            "--report",
            str(report),
        ],
    )
    assert result.exit_code == 0, result.output
    m = json.loads(result.output)
    assert {
        "utilization",
        "inference_wait_p99_s",
        "training_wait_mean_s",
        "training_jct_mean_s",
        "preemptions",
        "lost_gpu_seconds",
        "jobs_finished",
    } <= set(m)
    # p2 asks 8 GPUs of 2-GPU nodes: rejected; the other four finish.
    assert (m["jobs_submitted"], m["jobs_finished"], m["jobs_rejected"]) == (5, 4, 1)
    log = read_events(events)
    assert {e["job"] for e in log if e["event"] == "submit"} == {"pods/p0", "pods/p1", "pods/p2", "itp/j0", "itp/j1"}
    pool = read_pool(files["nodes"])
    assert check_events(log, pool, read_tenants(files["tenants"], pool.gpu_milli)) == []
    page = (report / "index.html").read_text()
    assert "utilization" in page
    assert all((report / f).stat().st_size > 0 for f in ("utilization.png", "queue.png", "waits.png"))


def test_without_json_a_summary_table_is_printed(files: dict[str, Path]) -> None:
    result = runner.invoke(app, ["--nodes", str(files["nodes"]), "--jobs", str(files["pods"]), "--limit", "2"])
    assert result.exit_code == 0, result.output
    assert "replay of 2 jobs on 2 nodes, 4 GPUs" in result.output
    assert "jobs_finished" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--inference-load", "qps.csv"], "arrives with the autoscaling issue", id="inference load"),
        pytest.param(["--policy", "siloed"], "arrives with the autoscaling issue", id="siloed policy"),
        pytest.param(["--jobs", "{pods}:training"], "'training' is not a tier", id="bad jobs spec"),
        pytest.param(
            ["--jobs", "{pods}::web/default"], "give their quotas with --tenants", id="tenant without tenants"
        ),
        pytest.param(["--tenants", "{tenants}", "--jobs", "{pods}"], "say whose jobs these are", id="whose jobs"),
        pytest.param(["--tenants", "{tenants}", "--jobs", "{pods}::ops/x"], "no account ops/x", id="unknown account"),
        pytest.param(["--jobs", "{pods}", "--placement", "worstfit"], "unknown placement policy", id="bad scorer"),
        pytest.param(["--jobs", "/nonexistent.csv"], "no such trace file", id="missing trace"),
        pytest.param(
            ["--jobs", "{pods}", "--checkpoint", "0"], "checkpoint interval must be > 0", id="zero checkpoint"
        ),
        pytest.param(
            ["--jobs", "{pods}", "--tenants", "/nonexistent.yaml"], "no such tenants file", id="no tenants file"
        ),
        pytest.param(["--nodes", "/nonexistent.csv"], "nonexistent.csv", id="missing node file"),
    ],
)
def test_bad_input_is_a_clear_error(files: dict[str, Path], args: list[str], message: str) -> None:
    args = [a.format(**{k: str(v) for k, v in files.items()}) for a in args]
    result = runner.invoke(app, ["--nodes", str(files["nodes"]), *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_fill_mode_reports_the_allocation_ratio(files: dict[str, Path], tmp_path: Path) -> None:
    # 100-milli pods: arrived demand climbs in steps of 2.5% of the 4 GPUs, and all of it fits.
    rows = [f"p{i},100,128,1,100,,BE,Running,{i},{i + 10},{i}" for i in range(60)]
    pods = csv_file(tmp_path, "small.csv", OPENB_HEADER, rows)
    result = runner.invoke(app, ["--nodes", str(files["nodes"]), "--jobs", str(pods), "--mode", "fill", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["alloc_ratio_at_100"] == pytest.approx(100.0)
    assert (out["policy"], out["seed"]) == ("bestfit", 42)
