"""`xirang simulate` end to end on small files: JSON metrics, event log, report, and clear errors."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.simulate.sim_builders import ITP_HEADER, OPENB_HEADER, csv_file
from xirang_platform.cli.simulate import simulate
from xirang_platform.control.tenants import read_tenants
from xirang_platform.pool.readers import read_pool
from xirang_platform.simulate.events import EventLog, check_events, read_events

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
        "extra": csv_file(tmp_path, "x.csv", ITP_HEADER, ["j1,0,100,1,5", "j2,7,200,2,3"]),
        "garbage": _undecodable(tmp_path / "g.csv"),
        "garbage_yaml": _undecodable(tmp_path / "g.yaml"),
        "empty_itp": csv_file(tmp_path, "none.csv", ITP_HEADER, []),
        "a_file": csv_file(tmp_path, "taken.txt", "not a folder", []),
        "dir": tmp_path,
    }


def _undecodable(path: Path) -> Path:
    """A file of bytes that are not UTF-8 text (a binary file given by mistake)."""
    path.write_bytes(bytes(range(128, 256)) * 8)
    return path


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
    m = json.loads(result.stdout)  # stdout is the JSON object alone; where the files went is on stderr
    assert f"report: {report / 'index.html'}" in result.stderr
    assert f"event log: {events}" in result.stderr
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
    # The page records what it shows: traces, tenants, pool, placement and seed.
    assert "<h2>Inputs</h2>" in page
    for given in (f"{files['itp']}:online-training:lab/llm", str(files["tenants"]), "2 nodes, 4 GPUs", "xirang"):
        assert given in page
    assert "utilization" in page
    assert all((report / f).stat().st_size > 0 for f in ("utilization.png", "queue.png", "waits.png"))


def test_without_json_a_summary_table_is_printed(files: dict[str, Path]) -> None:
    result = runner.invoke(app, ["--nodes", str(files["nodes"]), "--jobs", str(files["pods"]), "--limit", "2"])
    assert result.exit_code == 0, result.output
    assert "replay of 2 jobs on 2 nodes, 4 GPUs" in result.output
    assert "jobs_finished" in result.output


TOO_LONG = "x" * 500

BAD_INPUT = [
    pytest.param(["--inference-load", "qps.csv"], "needs --replica-qps", id="inference load without replica qps"),
    pytest.param(["--policy", "siloed"], "need --inference-load FILE", id="policy without inference load"),
    pytest.param(["--jobs", "{pods}:training"], "'training' is not a tier", id="bad jobs spec"),
    pytest.param(["--jobs", "{pods}::web/default"], "give their quotas with --tenants", id="tenant without tenants"),
    pytest.param(["--tenants", "{tenants}", "--jobs", "{pods}"], "say whose jobs these are", id="whose jobs"),
    pytest.param(["--tenants", "{tenants}", "--jobs", "{pods}::ops/x"], "no account ops/x", id="unknown account"),
    pytest.param(["--jobs", "{pods}", "--placement", "worstfit"], "unknown placement policy", id="bad scorer"),
    pytest.param(["--jobs", "/nonexistent.csv"], "no such trace file", id="missing trace"),
    pytest.param(
        ["--jobs", "{pods}", "--checkpoint", "0"],
        "Invalid value for '--checkpoint': 0.0 is not a positive number of seconds",
        id="zero checkpoint names the flag",
    ),
    pytest.param(["--jobs", "{pods}", "--tenants", "/nonexistent.yaml"], "no such tenants file", id="no tenants file"),
    pytest.param(["--nodes", "/nonexistent.csv"], "nonexistent.csv", id="missing node file"),
    # issue 10, item 1: an extra trailing field must not shift the columns (pandas made it the index).
    pytest.param(["--jobs", "{extra}"], "x.csv:2: 5 fields for 4 columns", id="extra trailing field"),
    # item 2: every file option names the file that is not text.
    pytest.param(["--jobs", "{garbage}"], "g.csv: not UTF-8 text", id="undecodable jobs file"),
    pytest.param(["--nodes", "{garbage}"], "g.csv: file: not UTF-8 text", id="undecodable node file"),
    pytest.param(
        ["--jobs", "{pods}", "--tenants", "{garbage_yaml}"], "g.yaml: not UTF-8 text", id="undecodable tenants"
    ),
    # item 4: an interval that never ends, or one longer than the whole trace.
    pytest.param(
        ["--jobs", "{pods}", "--interval", "inf"],
        "Invalid value for '--interval': inf is not a number of seconds",
        id="infinite interval",
    ),
    pytest.param(
        ["--jobs", "{pods}", "--interval", "1e12"],
        "--interval 1e+12 s is longer than the trace, which spans 100 s",
        id="interval past the trace span",
    ),
    # item 5: fill mode has no timeline; a flag it would ignore is refused by name.
    pytest.param(
        ["--jobs", "{pods}", "--mode", "fill", "--events", "{dir}/e.jsonl"],
        "--events: only --mode replay",
        id="fill events",
    ),
    pytest.param(
        ["--jobs", "{pods}", "--mode", "fill", "--report", "{dir}/rep"],
        "--report: only --mode replay",
        id="fill report",
    ),
    pytest.param(
        ["--jobs", "{pods}", "--mode", "fill", "--interval", "5"], "--interval: only --mode replay", id="fill interval"
    ),
    pytest.param(
        ["--jobs", "{pods}", "--mode", "fill", "--checkpoint", "60", "--min-runtime", "5"],
        "--min-runtime, --checkpoint: only --mode replay uses these flags",
        id="fill checkpoint and min runtime",
    ),
    # issue 23: the preemption notice and checkpoint cost are seconds >= 0, the cost needs a notice.
    pytest.param(
        ["--jobs", "{pods}", "--preemption-notice", "-5"],
        "Invalid value for '--preemption-notice': -5.0 is not a number of seconds >= 0: give how long a "
        "preempted victim may run on",
        id="negative preemption notice",
    ),
    pytest.param(
        ["--jobs", "{pods}", "--preemption-notice", "60", "--checkpoint-cost", "-1"],
        "Invalid value for '--checkpoint-cost': -1.0 is not a number of seconds >= 0",
        id="negative checkpoint cost",
    ),
    pytest.param(
        ["--jobs", "{pods}", "--checkpoint-cost", "15"],
        "--checkpoint-cost 15 needs a notice to save in: give --preemption-notice S > 0",
        id="checkpoint cost without a notice",
    ),
    pytest.param(
        ["--jobs", "{pods}", "--mode", "fill", "--preemption-notice", "60"],
        "--preemption-notice: only --mode replay",
        id="fill preemption notice",
    ),
    # issue 31: the estimate is scored every S > 0 simulated seconds, on a replay only.
    pytest.param(
        ["--jobs", "{pods}", "--eta-every", "0"],
        "Invalid value for '--eta-every': 0.0 is not a positive number of seconds: give how often to score",
        id="the estimate scored every 0 s",
    ),
    pytest.param(
        ["--jobs", "{pods}", "--mode", "fill", "--eta-every", "60"],
        "--eta-every: only --mode replay",
        id="fill eta-every",
    ),
    # item 6: output paths are checked before the replay, not after it.
    pytest.param(
        ["--jobs", "{pods}", "--events", "/nonexistent/d/e.jsonl"],
        "--events /nonexistent/d/e.jsonl: the folder /nonexistent/d does not exist",
        id="events in a missing folder",
    ),
    pytest.param(["--jobs", "{pods}", "--events", "{dir}"], "is a folder; give a file path", id="events on a folder"),
    pytest.param(
        ["--jobs", "{pods}", "--report", "{a_file}"], "taken.txt: is a file; give a folder", id="report on a file"
    ),
    pytest.param(
        ["--jobs", "{pods}", "--report", "{a_file}/rep"], "cannot create the folder", id="report under a file"
    ),
    # item 9: user input is printed verbatim (no emoji, no markup) and long values are cut short.
    pytest.param(["--jobs", "{pods}:a:"], "--jobs '{pods}:a:': 'a' is not a tier", id="emoji code printed verbatim"),
    pytest.param(["--jobs", "{pods}:[/]"], "'[/]' is not a tier", id="markup printed verbatim"),
    pytest.param(["--jobs", f"{{pods}}:{TOO_LONG}"], "(500 characters) is not a tier", id="long value cut short"),
    # minor: the flag is named.
    pytest.param(
        ["--jobs", "{pods}", "--seed", "-1"],
        "Invalid value for '--seed': Input should be greater than or equal to 0",
        id="negative seed",
    ),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUT)
def test_bad_input_is_a_clear_error(files: dict[str, Path], args: list[str], message: str) -> None:
    args = [a.format(**{k: str(v) for k, v in files.items()}) for a in args]
    message = message.format(**{k: str(v) for k, v in files.items()})
    before = sorted(files["dir"].rglob("*"))
    result = runner.invoke(app, ["--nodes", str(files["nodes"]), *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.replace("│", " ").split())  # unwrap rich's error box
    assert "Traceback" not in result.output
    assert sorted(files["dir"].rglob("*")) == before  # nothing written


def test_a_header_only_trace_is_a_warning(files: dict[str, Path]) -> None:
    result = runner.invoke(app, ["--nodes", str(files["nodes"]), "--jobs", str(files["empty_itp"]), "--json"])
    assert result.exit_code == 0, result.output
    assert f"warning: {files['empty_itp']}: no jobs in it (a header only)" in " ".join(result.stderr.split())
    assert json.loads(result.stdout)["jobs_submitted"] == 0


def test_an_extra_field_does_not_shift_columns_even_with_a_valid_header(files: dict[str, Path]) -> None:
    # The case: before, this exited 0 with jobs named "0" and "7" of 5 and 3 GPUs.
    result = runner.invoke(app, ["--nodes", str(files["nodes"]), "--jobs", str(files["extra"]), "--json"])
    assert (result.exit_code, result.stdout) == (2, "")


def test_fill_mode_honours_limit(files: dict[str, Path], tmp_path: Path) -> None:
    rows = [f"p{i},100,128,1,100,,BE,Running,{i},{i + 10},{i}" for i in range(60)]
    pods = csv_file(tmp_path, "small.csv", OPENB_HEADER, rows)
    args = ["--nodes", str(files["nodes"]), "--jobs", str(pods), "--mode", "fill", "--json"]
    limited, whole = runner.invoke(app, [*args, "--limit", "10"]), runner.invoke(app, args)
    assert (limited.exit_code, whole.exit_code) == (0, 0), limited.output + whole.output
    # All 60 pods (6 GPUs of demand) pass 130% of the 4 GPUs without draws; the first 10 (1 GPU) are
    # topped up with 42 draws among themselves to 5.2 GPUs.
    assert (json.loads(limited.stdout)["pods"], json.loads(whole.stdout)["pods"]) == (52, 60)


def test_fill_mode_reports_the_allocation_ratio(files: dict[str, Path], tmp_path: Path) -> None:
    # 100-milli pods: arrived demand climbs in steps of 2.5% of the 4 GPUs, and all of it fits.
    rows = [f"p{i},100,128,1,100,,BE,Running,{i},{i + 10},{i}" for i in range(60)]
    pods = csv_file(tmp_path, "small.csv", OPENB_HEADER, rows)
    result = runner.invoke(app, ["--nodes", str(files["nodes"]), "--jobs", str(pods), "--mode", "fill", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["alloc_ratio_at_100"] == pytest.approx(100.0)
    assert (out["policy"], out["seed"]) == ("xirang", 42)  # the default policy


def test_an_openb_pod_asking_for_openb_model_names_fits_their_nodes(tmp_path: Path) -> None:
    # issue 7, item 8: before, node models were mapped to catalog names and gpu_spec was not: never-fits.
    nodes = csv_file(tmp_path, "v100.csv", NODES, ["v0,32000,131072,2,V100M16", "v1,32000,131072,2,V100M32"])
    pods = csv_file(tmp_path, "pods.csv", OPENB_HEADER, ["p0,4000,8192,1,1000,V100M16|V100M32,LS,Running,0,100,0"])
    result = runner.invoke(app, ["--nodes", str(nodes), "--jobs", str(pods), "--json"])
    assert result.exit_code == 0, result.output
    m = json.loads(result.stdout)
    assert (m["jobs_finished"], m["jobs_rejected"]) == (1, 0)


def test_a_write_that_fails_after_the_replay_keeps_the_metrics(
    files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Paths are checked first; a disk that fills up during the run can still fail the write itself.
    events = tmp_path / "ev.jsonl"

    def disk_full(self: EventLog, path: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(EventLog, "write", disk_full)
    result = runner.invoke(
        app, ["--nodes", str(files["nodes"]), "--jobs", str(files["pods"]), "--json", "--events", str(events)]
    )
    assert result.exit_code == 2
    assert json.loads(result.stdout)["jobs_submitted"] == 3
    assert f"cannot write {events}: No space left on device; the metrics above are complete" in " ".join(
        result.stderr.split()
    )


def test_the_short_openb_header_fills_but_does_not_replay(files: dict[str, Path], tmp_path: Path) -> None:
    rows = [f"p{i},100,128,1,100" for i in range(60)]
    pods = csv_file(tmp_path, "multigpu.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli", rows)
    args = ["--nodes", str(files["nodes"]), "--jobs", str(pods)]
    fill = runner.invoke(app, [*args, "--mode", "fill", "--json"])
    assert fill.exit_code == 0, fill.output
    assert json.loads(fill.stdout)["alloc_ratio_at_100"] == pytest.approx(100.0)
    replayed = runner.invoke(app, args)
    assert replayed.exit_code != 0
    assert "header lacks creation_time, deletion_time: a replay needs" in replayed.output
    assert "Traceback" not in replayed.output


def test_the_notice_flags_report_the_lost_work_and_the_added_wait(files: dict[str, Path]) -> None:
    # p0 (LS, inference) and p1 (BE) share the pool; the JSON carries the notice's figures either way.
    args = ["--nodes", str(files["nodes"]), "--jobs", str(files["pods"]), "--json"]
    plain = json.loads(runner.invoke(app, args).output)
    zero = json.loads(runner.invoke(app, [*args, "--preemption-notice", "0"]).output)
    given = runner.invoke(app, [*args, "--preemption-notice", "60", "--checkpoint-cost", "15"])
    assert given.exit_code == 0, given.output
    noticed = json.loads(given.output)
    assert zero == plain
    assert plain["preemption_notice_s"] == 0.0
    assert noticed["preemption_notice_s"] == 60.0
    assert {"lost_gpu_seconds", "preemptor_wait_added_s_mean", "inference_wait_p99_s"} <= set(noticed)


def test_eta_every_scores_the_estimate_beside_the_baselines(tmp_path: Path) -> None:
    # Four T4s. j0 takes all four for 500 s; j1 (1 GPU) and j2 (2 GPUs) arrive behind it and start when
    # it ends, which the forward estimate says exactly; "starts now" is wrong by the wait left.
    nodes = csv_file(tmp_path, "nodes.csv", NODES, ["n0,32000,131072,2,T4", "n1,32000,131072,2,T4"])
    itp = csv_file(tmp_path, "itp.csv", ITP_HEADER, ["j0,0,500,4", "j1,10,100,1", "j2,20,50,2"])
    result = runner.invoke(app, ["--nodes", str(nodes), "--jobs", str(itp), "--json", "--eta-every", "10"])
    assert result.exit_code == 0, result.output
    eta = json.loads(result.output)["eta"]
    assert set(eta) == {
        "every_s",
        "samples",
        "never_started",
        "unknown",
        "median_abs_error_s",
        "p90_abs_error_s",
        "starts_now",
        "declared_ends",
    }
    baseline = {"median_abs_error_s", "p90_abs_error_s", "unknown", "forward"}
    assert set(eta["starts_now"]) == set(eta["declared_ends"]) == baseline
    assert (eta["samples"], eta["unknown"], eta["median_abs_error_s"], eta["p90_abs_error_s"]) == (3, 0, 0.0, 0.0)
    # j1 sampled at 10 and 20, j2 at 20: all start at 500.
    assert (eta["starts_now"]["median_abs_error_s"], eta["declared_ends"]["median_abs_error_s"]) == (480.0, 0.0)
