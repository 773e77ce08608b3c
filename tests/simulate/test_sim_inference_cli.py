"""`xirang simulate --inference-load ...`: both policies side by side, events that keep every invariant,
the report page, the load loop stated, `--keep-times`, and bad inference flags as clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.simulate.sim_builders import ITP_HEADER, csv_file
from xirang_platform.cli.simulate import simulate
from xirang_platform.pool.readers import read_pool
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.simulate.events import check_events, read_events

NODES = "sn,cpu_milli,memory_mib,gpu,model"
app = typer.Typer()
app.command()(simulate)
runner = CliRunner()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        # Four 2-GPU nodes; the peak asks for 5 one-GPU replicas: three nodes for inference in siloed.
        "nodes": csv_file(tmp_path, "nodes.csv", NODES, [f"n{i},32000,131072,2,T4" for i in range(4)]),
        # Six one-GPU jobs of 2000 s at t=100 s (on the file's own clock, which starts at 5000 s).
        "itp": csv_file(tmp_path, "itp.csv", ITP_HEADER, [f"j{i},{5100 if i else 5000},2000,1" for i in range(6)]),
        # Load 1 QPS, a burst of 4 QPS from 600 s to 1200 s, 1 QPS to 1800 s.
        "load": csv_file(tmp_path, "load.csv", "t,qps", ["0,1", "600,4", "1200,1", "1800,1"]),
    }


def run(files: dict[str, Path], *extra: str):
    args = ["--nodes", str(files["nodes"]), "--jobs", str(files["itp"]), "--inference-load", str(files["load"])]
    return runner.invoke(app, [*args, "--replica-qps", "1", *extra])


def test_both_policies_side_by_side_with_events_and_report(files, tmp_path):
    events, report = tmp_path / "ev.jsonl", tmp_path / "report"
    result = run(files, "--policy", "both", "--json", "--events", str(events), "--report", str(report))
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert set(out) == {"unified", "siloed"}
    for m in out.values():
        for key in ("utilization", "inference_wait_p99_s", "training_jct_mean_s", "preemptions", "lost_gpu_seconds"):
            assert key in m
        assert m["inference_gpus"] == 6  # peak 4 QPS x 1.2 headroom / 1 QPS = 5 replicas: three 2-GPU nodes
    pool = read_pool(files["nodes"])
    unified = read_events(tmp_path / "ev.unified.jsonl")
    book = QuotaBook({"default": 2000, "serving": 6000}, {("default", "default"): None, ("serving", "default"): None})
    assert check_events(unified, pool, book) == []
    assert any(e["event"] == "admit" and e["job"].startswith("inference/") for e in unified)
    assert (tmp_path / "ev.siloed.jsonl").is_file()
    page = (report / "index.html").read_text()
    assert "unified" in page
    assert "siloed" in page
    for name in ("tiers_unified.png", "tiers_siloed.png", "inference_unified.png", "training_queue.png"):
        assert (report / name).stat().st_size > 0
    # Unified lends the idle inference GPUs to training: more runs at once than siloed's 2 training GPUs allow.
    assert out["unified"]["training_jct_mean_s"] < out["siloed"]["training_jct_mean_s"]


def test_the_loop_is_stated_and_keep_times_keeps_the_files_clock(files):
    result = run(files, "--json", "--loop-load", "--keep-times")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    # Kept times: the last job arrives at 5100 s, so the 1800 s load is looped 3 times to cover it.
    assert "looped 3x" in out["inference_load"]
    rebased = json.loads(run(files, "--json", "--loop-load").output)
    assert "looped" not in rebased["inference_load"]  # rebased, the last job arrives at 100 s


def test_summary_names_the_policy_and_the_load(files):
    result = run(files, "--policy", "siloed")
    assert result.exit_code == 0, result.output
    assert "siloed:" in result.output
    assert "load.csv" in result.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        pytest.param(["--policy", "shared"], "--policy 'shared': write one of unified, siloed, both", id="bad-policy"),
        pytest.param(["--mode", "fill"], "does not apply to --mode fill", id="fill-mode"),
        pytest.param(["--replica-gpu-milli", "1500"], "multiple of 1000", id="bad-replica-size"),
    ],
)
def test_bad_inference_flags_are_clear_errors(files, extra, message):
    result = run(files, *extra)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_broken_load_row_names_file_and_line(files, tmp_path):
    files["load"] = csv_file(tmp_path, "bad.csv", "t,qps", ["0,1", "60,lots"])
    result = run(files)
    assert result.exit_code == 2
    assert "bad.csv:3: field qps is 'lots'" in " ".join(result.output.split())
