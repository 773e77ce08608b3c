"""`xirang pool show` and `xirang discover` through typer's CliRunner, registered as the lead will."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pynvml
import pytest
import typer
from typer.testing import CliRunner

from tests.ledger.ledger_helpers import alloc
from tests.pool.nvml_fake import FakeNvml, gb200, h100
from xirang_platform.cli.pool import discover_command, pool_app
from xirang_platform.control.platform_config import CONFIG_ENV
from xirang_platform.ledger import Ledger
from xirang_platform.ledger.db import URL_ENV
from xirang_platform.pool.discover import NO_DRIVER
from xirang_platform.pool.yaml_inventory import read_inventory
from xirang_platform.scheduling.model import Tier

TRACE = Path(__file__).resolve().parents[2] / "data" / "traces" / "alibaba_openb_gpu_2023"
OPENB = str(TRACE / "openb_node_list_gpu_node.csv")
POOL_FILE = Path(__file__).resolve().parents[1] / "dagster" / "pool.yaml"

app = typer.Typer()
app.add_typer(pool_app, name="pool")
app.command("discover")(discover_command)
runner = CliRunner()


def run(*args: str, backend: FakeNvml | None = None):
    obj = {"nvml_backend": backend} if backend is not None else None
    return runner.invoke(app, list(args), obj=obj)


def test_pool_show_defaults_to_the_bundled_pool():
    result = run("pool", "show")
    assert result.exit_code == 0, result.output
    assert "22 nodes, 128 GPUs, 352 units" in result.output
    for model in ("H100-SXM", "A100-80", "L40S", "A10", "(cpu only)"):
        assert model in result.output


def test_pool_show_json_summarises_models_and_domains():
    result = run("pool", "show", "--json")
    summary = json.loads(result.output)
    assert (summary["name"], summary["nodes"], summary["gpus"], summary["units"]) == ("default", 22, 128, 352)
    h100 = next(row for row in summary["models"] if row["model"] == "H100-SXM")
    assert h100 == h100 | {
        "domains": 2,
        "nodes": 8,
        "gpus": 64,
        "gpu_memory_mib": 81559,
        "compute_level": 989,
        "unit_milli": [1000],
        "units": 64,
    }
    l40s_domains = [row for row in summary["domains"] if row["model"] == "L40S"]
    assert len(l40s_domains) == 6
    assert all(row["units"] == 32 for row in l40s_domains)  # 4 GPUs x 8 eighths


def test_pool_show_reads_the_openb_csv():
    summary = json.loads(run("pool", "show", OPENB, "--json").output)
    assert (summary["nodes"], summary["gpus"]) == (1213, 6212)
    assert [row["model"] for row in summary["models"]] == ["A10", "G2", "G3", "P100", "T4", "V100-16", "V100-32"]
    assert all(row["nodes"] <= 8 for row in summary["domains"])


def test_pool_show_domain_size_changes_the_domains():
    eight = json.loads(run("pool", "show", OPENB, "--json").output)
    four = json.loads(run("pool", "show", OPENB, "--json", "--domain-size", "4").output)
    assert (len(eight["domains"]), len(four["domains"])) == (154, 306)  # ceil(n/4): 138+101+34+14+10+8+1
    assert all(row["nodes"] <= 4 for row in four["domains"])


def test_pool_show_table_flags_assumed_models():
    result = run("pool", "show", OPENB)
    assert result.exit_code == 0
    assert "G2 *" in result.output
    assert "ASSUMED: undisclosed openb code" in result.output


def test_pool_show_domains_lists_one_row_per_domain():
    result = run("pool", "show", "--domains")
    assert "h100-a" in result.output
    assert "l40s-05" in result.output


NOT_UTF8 = bytes(range(128, 256)) * 8


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        pytest.param(
            "nodes.csv", b"sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1024,2,T5\n", ":2: model: unknown GPU model 'T5'",
            id="unknown model",
        ),
        pytest.param("g.csv", NOT_UTF8, ": file: not UTF-8 text", id="node CSV not UTF-8"),
        pytest.param("g.yaml", NOT_UTF8, ": file: not UTF-8 text", id="inventory not UTF-8"),
        pytest.param(
            "nodes.csv", b"sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1024,2,[bold]T5:a:\n",
            ":2: model: unknown GPU model '[bold]T5:a:'", id="markup and emoji codes printed verbatim",
        ),
    ],
)  # fmt: skip
def test_pool_show_bad_file_exits_2_naming_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    result = run("pool", "show", str(path))
    assert result.exit_code == 2
    assert f"{path}{message}" in result.output.replace("\n", "")
    assert "Traceback" not in result.output


def test_pool_show_prints_domain_names_verbatim(tmp_path):
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model,domain\nn0,1000,1024,2,T4,[red]rack:a:\n")
    result = run("pool", "show", str(path), "--domains")
    assert result.exit_code == 0, result.output
    assert "[red]rack:a:" in result.output


def test_discover_json_describes_node_and_gpus():
    result = run("discover", "--json", backend=FakeNvml([h100(i) for i in range(8)]))
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert (found["node"]["model"], found["node"]["gpus"], found["node"]["compute_level"]) == ("H100-SXM", 8, 989)
    assert [g["uuid"] for g in found["gpus"]] == [f"GPU-h100-{i:04d}" for i in range(8)]
    assert found["gpus"][0] == found["gpus"][0] | {
        "compute_capability": "9.0",
        "mig_capable": True,
        "mig_enabled": False,
        "nvlink_links": 18,
    }


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param(FakeNvml([h100(i) for i in range(8)]), id="H100 x8"),
        pytest.param(FakeNvml([gb200(i) for i in range(4)]), id="unknown model in a clique"),
    ],
)
def test_discover_yaml_is_an_inventory_read_inventory_accepts(tmp_path, backend):
    result = run("discover", "--yaml", "--unit-milli", "500", backend=backend)
    assert result.exit_code == 0, result.output
    path = tmp_path / "node.yaml"
    path.write_text(result.output)
    pool = read_inventory(path)
    assert len(pool.nodes) == 1
    node = pool.nodes[0]
    assert (node.gpus, node.unit_milli) == (len(backend.gpus), 500)
    assert node.gpu_uuids == tuple(g.uuid for g in backend.gpus)


def test_discover_table_shows_each_gpu_and_warns_about_unknown_models():
    result = run("discover", backend=FakeNvml([gb200(i) for i in range(2)]))
    assert result.exit_code == 0
    assert "NVIDIA GB200" in result.output
    assert "GPU-gb200-0001" in result.output
    assert "warning: not in the GPU catalog" in result.output.replace("\n", " ")


def test_discover_prints_what_the_driver_reports_verbatim():
    # A GPU name is text from outside: rich markup or emoji codes in it are shown, not rendered.
    odd = [dataclasses.replace(gb200(i), name="NVIDIA [bold]X1:a:") for i in range(2)]
    result = run("discover", backend=FakeNvml(odd))
    assert result.exit_code == 0, result.output
    assert "NVIDIA [bold]X1:a:" in result.output
    assert "reported by NVML as 'NVIDIA [bold]X1:a:'" in " ".join(result.output.split())


def test_discover_without_driver_exits_2_with_the_fix():
    result = run("discover", backend=FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound()))
    assert result.exit_code == 2
    assert NO_DRIVER in result.output.replace("\n", " ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(("--json", "--yaml"), "choose one output format", id="two formats"),
        pytest.param(("--unit-milli", "300"), "does not divide 1000", id="bad unit"),
    ],
)
def test_discover_bad_options_exit_2(args, message):
    result = run("discover", *args, backend=FakeNvml([h100(0)]))
    assert result.exit_code == 2
    assert message in result.output


@pytest.fixture
def platform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A platform config on the engine suite's pool (16 H100-SXM, 4 L40S) and its ledger, holding a
    4-GPU training gang and an 8-GPU one on the H100s and a half-GPU replica on an L40S."""
    config = tmp_path / "xirang.yaml"
    config.write_text(
        f"pool: {POOL_FILE}\nledger_url: sqlite:///ledger.sqlite\n"
        "tenants: {acme: {quota_gpus: 20, projects: {vision: {}}}}\n",
        encoding="utf-8",
    )
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    ledger.add_tenant("acme", 20000)
    ledger.add_project("acme", "vision")
    ledger.reserve(alloc("train", tier=Tier.ONLINE_TRAINING, gpus=4, node="h100-00"))
    ledger.reserve(alloc("sweep", tier=Tier.OFFLINE_TRAINING, gpus=8, node="h100-01"))
    ledger.reserve(alloc("replica", tier=Tier.INFERENCE, gpus=1, milli=500, node="l40s-00"))
    ledger.close()
    monkeypatch.setenv(CONFIG_ENV, str(config))
    monkeypatch.delenv(URL_ENV, raising=False)
    return config


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["pool"], id="xirang pool alone shows the pool"),
        pytest.param(["pool", "show"], id="xirang pool show"),
    ],
)
def test_pool_shows_what_each_tier_holds_per_gpu_model(platform: Path, args: list[str]) -> None:
    result = run(*args)
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]] for line in occupancy(result.output)}
    # GPUs, then inference, online-training, offline-training, batch-inference, idle
    assert rows == {
        "H100-SXM": ["16", "0", "4", "8", "0", "4"],
        "L40S": ["4", "0.5", "0", "0", "0", "3.5"],
    }


def occupancy(output: str) -> list[str]:
    """The body rows of the 'allocated now' table."""
    table = output[output.index("allocated now") :]
    return [line for line in table.splitlines() if line.startswith("│")]


def test_pool_show_json_has_the_occupancy_by_model_and_tier(platform: Path) -> None:
    result = run("pool", "show", "--json")
    assert result.exit_code == 0, result.output
    occupied = json.loads(result.output)["occupancy"]
    assert occupied["gpus_by_model_and_tier"] == {
        "H100-SXM": {"inference": 0.0, "online-training": 4.0, "offline-training": 8.0, "batch-inference": 0.0},
        "L40S": {"inference": 0.5, "online-training": 0.0, "offline-training": 0.0, "batch-inference": 0.0},
    }
    assert occupied["ledger"].startswith("ledger sqlite:///")


def test_pool_show_says_when_there_is_no_ledger_to_read(platform: Path, tmp_path: Path) -> None:
    (tmp_path / "ledger.sqlite").unlink()
    result = run("pool")
    assert result.exit_code == 0, result.output
    assert "allocated now: unknown (no quota ledger at" in " ".join(result.output.split())
    assert not (tmp_path / "ledger.sqlite").exists()
