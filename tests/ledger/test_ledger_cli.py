"""`xirang quota` through typer's CliRunner on a temporary SQLite ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ledger_helpers import alloc
from typer.testing import CliRunner

from xirang_platform.ledger import Ledger
from xirang_platform.ledger.cli import quota_app
from xirang_platform.ledger.db import URL_ENV
from xirang_platform.scheduling.model import Tier


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh SQLite ledger named by XIRANG_LEDGER_URL."""
    url = f"sqlite:///{tmp_path / 'cli.sqlite'}"
    monkeypatch.setenv(URL_ENV, url)
    return url


def run(*args: str, ok: bool = True) -> str:
    result = CliRunner().invoke(quota_app, list(args))
    assert (result.exit_code == 0) == ok, result.output
    return result.output


def test_tenant_and_project_commands_store_quotas_in_milli(url: str) -> None:
    assert run("tenant", "add", "acme", "--quota", "8") == "tenant acme: quota 8 GPUs\n"
    run("project", "add", "acme", "vision", "--quota", "0.5")
    run("project", "add", "acme", "nlp")
    run("project", "set", "acme", "nlp", "--quota", "2.125")
    run("tenant", "set", "acme", "--quota", "10")
    ledger = Ledger(url)
    assert ledger.quota_book().tenants == {"acme": 10000}
    assert ledger.quota_book().projects == {("acme", "vision"): 500, ("acme", "nlp"): 2125}
    ledger.close()


def test_show_json_has_cap_and_headroom_of_every_account(url: str) -> None:
    run("tenant", "add", "acme", "--quota", "8")
    run("project", "add", "acme", "vision", "--quota", "4")
    run("project", "add", "acme", "nlp")
    ledger = Ledger(url)
    ledger.reserve(alloc("r1", tier=Tier.INFERENCE, gpus=3))
    ledger.commit("r1")
    ledger.reserve(alloc("r2", tier=Tier.OFFLINE_TRAINING, gpus=3))  # 6 > 4.8: borrowed
    ledger.close()

    shown = json.loads(run("show", "--json"))
    assert shown["ratio"] == 1.2
    assert shown["accounts"] == [
        {"account": "acme", "tenant": "acme", "project": None, "quota": 8000, "cap": 9600, "used": 3000,
         "reserved": 0, "borrowed": 3000, "headroom": 6600},
        {"account": "acme/nlp", "tenant": "acme", "project": "nlp", "quota": None, "cap": None, "used": 0,
         "reserved": 0, "borrowed": 0, "headroom": None},
        {"account": "acme/vision", "tenant": "acme", "project": "vision", "quota": 4000, "cap": 4800,
         "used": 3000, "reserved": 0, "borrowed": 3000, "headroom": 1800},
    ]  # fmt: skip
    # At 95% cluster allocation the ratio is 1.0: acme's cap is its quota.
    assert json.loads(run("show", "--json", "--allocated", "0.95"))["accounts"][0]["cap"] == 8000
    table = run("show")
    assert "acme/vision" in table
    assert "9.6" in table
    assert "6.6" in table


def test_history_filters_by_tenant_project_and_kind(url: str) -> None:
    run("tenant", "add", "acme", "--quota", "8")
    run("tenant", "add", "beta", "--quota", "2")
    run("project", "add", "acme", "vision", "--quota", "4")
    run("project", "add", "beta", "web")
    ledger = Ledger(url)
    ledger.reserve(alloc("r1", tier=Tier.INFERENCE, gpus=1))
    ledger.close()

    def lines(*args: str) -> list[dict]:
        return [json.loads(line) for line in run("history", "--json", *args).splitlines()]

    assert [(e["kind"], e["account"]) for e in lines("--tenant", "beta")] == [("quota", "beta"), ("quota", "beta/web")]
    assert [(e["kind"], e["account"]) for e in lines("--project", "vision")] == [
        ("quota", "acme/vision"),
        ("reserve", "acme/vision"),
    ]
    assert [e["request_id"] for e in lines("--kind", "reserve")] == ["r1", "r1"]
    assert len(lines("--limit", "2")) == 2
    assert "reserve" in run("history", "--tenant", "acme")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["tenant", "add", "x", "--quota", "eight"], "'eight' is not a number of GPUs", id="non-numeric"),
        pytest.param(["tenant", "add", "x", "--quota", "-2"], "is negative", id="negative"),
        pytest.param(["tenant", "add", "x", "--quota", "0.0005"], "at most 3 decimals", id="finer than a milli"),
        pytest.param(["tenant", "add", "x", "--quota", "nan"], "not a number of GPUs", id="nan"),
        pytest.param(["tenant", "add", "acme", "--quota", "1"], "already exists", id="tenant twice"),
        pytest.param(["tenant", "set", "ghost", "--quota", "1"], "xirang quota tenant add ghost", id="unknown tenant"),
        pytest.param(["project", "add", "ghost", "p"], "unknown tenant 'ghost'", id="project of unknown tenant"),
        pytest.param(
            ["project", "add", "beta", "vision"], "already belongs to tenant 'acme'", id="project in two tenants"
        ),
        pytest.param(
            ["project", "set", "acme", "ghost", "--quota", "1"], "project add acme ghost", id="unknown project"
        ),
        pytest.param(["project", "set", "acme", "vision", "--quota", "10"], "0.4 GPUs more", id="past tenant cap"),
        pytest.param(["history", "--kind", "refund"], "unknown entry kind 'refund'", id="unknown kind"),
        pytest.param(["show", "--allocated", "2"], "not in 0..1", id="allocation past 1"),
    ],
)
def test_bad_input_exits_nonzero_with_the_fix_and_changes_nothing(url: str, args: list[str], message: str) -> None:
    run("tenant", "add", "acme", "--quota", "8")
    run("tenant", "add", "beta", "--quota", "2")
    run("project", "add", "acme", "vision", "--quota", "4")
    before = run("history", "--json")

    result = CliRunner().invoke(quota_app, args)

    assert result.exit_code != 0
    assert message in " ".join(result.output.replace("│", " ").split())  # unwrap rich's error box
    assert run("history", "--json") == before


def test_default_ledger_is_a_sqlite_file_under_dot_xirang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(URL_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    run("tenant", "add", "acme", "--quota", "1")
    assert (tmp_path / ".xirang" / "ledger.sqlite").is_file()
    assert '"quota": 1000' in run("show", "--json")


def test_unopenable_ledger_url_is_an_error_naming_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(URL_ENV, f"sqlite:///{tmp_path / 'missing-dir' / 'ledger.sqlite'}")
    result = CliRunner().invoke(quota_app, ["show"])
    assert result.exit_code == 1
    assert "cannot open the quota ledger" in result.output
    assert URL_ENV in result.output
