"""`xirang check-config`: a config that loads is checked for likely mistakes, one that does not is
reported with the loader's reason; each case a small config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from xirang_platform.cli import app
from xirang_platform.control.live_config import read_live
from xirang_platform.ledger.ledger import Ledger
from xirang_platform.operations.config_check import check_config

POOL_FILE = Path(__file__).resolve().parents[1] / "dagster" / "pool.yaml"  # 16 H100-SXM + 4 L40S: 20 GPUs
WORKSPACE = "load_from:\n" + "".join(
    f"  - python_module: {{module_name: defs, attribute: {a}, location_name: {a}}}\n" for a in ("research", "product")
)


def config(**over: object) -> dict:
    doc: dict = {
        "pool": str(POOL_FILE),
        "tenants": {"research": {"quota_gpus": 12, "projects": {"llm": {}}}, "product": {"quota_gpus": 8}},
        "locations": {"research": "research", "product": "product"},
    }
    doc.update(over)
    return doc


def tenants(research: int, product: int = 8, llm: int | None = None) -> dict:
    projects = {"llm": {} if llm is None else {"quota_gpus": llm}}
    return {"research": {"quota_gpus": research, "projects": projects}, "product": {"quota_gpus": product}}


def write(tmp_path: Path, doc: dict, workspace: str = WORKSPACE) -> tuple[Path, Path]:
    (tmp_path / "xirang.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    (tmp_path / "workspace.yaml").write_text(workspace, encoding="utf-8")
    return tmp_path / "xirang.yaml", tmp_path / "workspace.yaml"


@pytest.mark.parametrize(
    ("doc", "want"),
    [
        pytest.param(config(), [], id="quotas within the pool, every location mapped: nothing"),
        pytest.param(
            config(tenants=tenants(16)),
            [("warning", "quota-past-pool", "sum to 24 GPUs, past the pool's 20")],
            id="quotas that sum past the pool",
        ),
        pytest.param(
            config(tenants=tenants(10, llm=11)),
            [
                (
                    "warning",
                    "project-past-tenant-quota",
                    "project research/llm has 11 GPUs, more than tenant research's 10",
                )
            ],
            id="a project past its tenant's quota (within its cap)",
        ),
        pytest.param(
            config(locations={"research": "research"}),
            [
                ("warning", "location-without-tenant", "code location 'product' of the workspace has no tenant"),
                ("warning", "tenant-without-location", "tenant 'product' has no code location"),
            ],
            id="a location without a tenant, and so a tenant without a location",
        ),
        pytest.param(
            config(scheduler={"gpu_model_order": {"inference": ["A10"]}}),
            [("error", "loads", "scheduler.gpu_model_order.inference names GPU model 'A10', which the pool lacks")],
            id="a tier preference naming a model the pool lacks",
        ),
        pytest.param(
            config(tenants=tenants(4, llm=6)),
            [("error", "loads", "research")],
            id="projects past their tenant's cap do not load",
        ),
    ],
)
def test_check_config_finds(tmp_path: Path, doc: dict, want: list[tuple[str, str, str]]) -> None:
    path, ws = write(tmp_path, doc)
    found = check_config(path, ws)
    assert [(f.severity, f.check) for f in found] == [(s, c) for s, c, _ in want]
    for f, (_, _, text) in zip(found, want, strict=True):
        assert text in f.message


def test_the_command_exits_1_on_errors_and_on_warnings_only_when_strict(tmp_path: Path) -> None:
    runner = CliRunner()
    path, ws = write(tmp_path, config(tenants=tenants(16)))
    warned = runner.invoke(app, ["check-config", "--config", str(path), "--workspace", str(ws)])
    assert warned.exit_code == 0
    assert warned.output.startswith("warning: ")
    strict = runner.invoke(app, ["check-config", "--config", str(path), "--workspace", str(ws), "--strict", "--json"])
    assert strict.exit_code == 1
    assert [f["check"] for f in json.loads(strict.output)["findings"]] == ["quota-past-pool"]
    missing = runner.invoke(app, ["check-config", "--config", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 1
    assert "no platform config here" in missing.output
    assert "Traceback" not in missing.output


def test_a_config_warning_prints_as_one_line_on_any_command(tmp_path: Path) -> None:
    path, _ = write(tmp_path, config(tenants=tenants(16)))
    ledger = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    Ledger(ledger).close()
    command = [sys.executable, "-m", "xirang_platform.cli", "usage", "--config", str(path), "--ledger-url", ledger]
    result = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"warning: {path}: tenant quotas sum to 24 GPUs, more than the pool's 20: tenants cannot all use their quota "
        "at once (past the pool, admission waits or preempts); lower a tenant's quota_gpus if that is not meant"
    ]
    json.loads(result.stdout)  # stdout stays the command's own output


def test_a_bad_edit_is_named_with_the_last_good_config_the_platform_keeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, ws = write(tmp_path, config())
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    read_live(path)  # the running platform read it good, and saved it
    path.write_text(path.read_text().replace("quota_gpus: 12", "quota_gpus: 12 GPUs"), encoding="utf-8")

    result = CliRunner().invoke(app, ["check-config", "--config", str(path), "--workspace", str(ws)])

    assert result.exit_code == 1
    [line] = result.output.splitlines()
    assert line.startswith(
        f"error: {path}: tenants.research: quota '12 GPUs' is not a number of GPUs: write it like 8 or 0.5; "
        "the running platform keeps its last good config (saved "
    )
    assert line.endswith(" UTC) until this is fixed [loads]")
