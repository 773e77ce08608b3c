"""`xirang quota` through typer's CliRunner on a temporary SQLite ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.ledger.ledger_helpers import alloc
from xirang_platform.cli.quota import quota_app
from xirang_platform.control.platform_config import CONFIG_ENV
from xirang_platform.ledger import Ledger
from xirang_platform.ledger.db import URL_ENV
from xirang_platform.scheduling.model import Tier


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh SQLite ledger named by XIRANG_LEDGER_URL."""
    url = f"sqlite:///{tmp_path / 'cli.sqlite'}"
    monkeypatch.setenv(URL_ENV, url)
    return url


def run(*args: str, ok: bool = True) -> str:
    """The command's stdout (what it says on stderr, like which ledger it read, is not in it)."""
    result = CliRunner().invoke(quota_app, list(args))
    assert (result.exit_code == 0) == ok, result.output
    return result.stdout


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
        {"account": "acme", "tenant": "acme", "project": None, "quota": 8000, "cap": 9600, "ceiling": 9600,
         "used": 3000, "reserved": 0, "borrowed": 3000, "headroom": 6600},
        {"account": "acme/nlp", "tenant": "acme", "project": "nlp", "quota": None, "cap": None, "ceiling": None,
         "used": 0, "reserved": 0, "borrowed": 0, "headroom": None},
        {"account": "acme/vision", "tenant": "acme", "project": "vision", "quota": 4000, "cap": 4800,
         "ceiling": 4800, "used": 3000, "reserved": 0, "borrowed": 3000, "headroom": 1800},
    ]  # fmt: skip
    # At 95% cluster allocation the ratio is 1.0: acme's cap is its quota, its ceiling still quota x 1.2.
    at_95 = json.loads(run("show", "--json", "--allocated", "0.95"))["accounts"][0]
    assert (at_95["cap"], at_95["ceiling"]) == (8000, 9600)
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
    ("args", "code", "message"),
    [
        pytest.param(
            ["tenant", "add", "x", "--quota", "eight"], 2, "'eight' is not a number of GPUs", id="non-numeric"
        ),
        pytest.param(["tenant", "add", "x", "--quota", "-2"], 2, "is negative", id="negative"),
        pytest.param(["tenant", "add", "x", "--quota", "0.0005"], 2, "at most 3 decimals", id="finer than a milli"),
        pytest.param(["tenant", "add", "x", "--quota", "nan"], 2, "not a number of GPUs", id="nan"),
        pytest.param(["tenant", "add", "acme", "--quota", "1"], 1, "already exists", id="tenant twice"),
        pytest.param(
            ["tenant", "set", "ghost", "--quota", "1"], 1, "xirang quota tenant add ghost", id="unknown tenant"
        ),
        pytest.param(["project", "add", "ghost", "p"], 1, "unknown tenant 'ghost'", id="project of unknown tenant"),
        pytest.param(
            ["project", "add", "beta", "vision"], 1, "already belongs to tenant 'acme'", id="project in two tenants"
        ),
        pytest.param(
            ["project", "set", "acme", "ghost", "--quota", "1"], 1, "project add acme ghost", id="unknown project"
        ),
        pytest.param(["project", "set", "acme", "vision", "--quota", "10"], 1, "0.4 GPUs more", id="past tenant cap"),
        pytest.param(["history", "--kind", "refund"], 1, "unknown entry kind 'refund'", id="unknown kind"),
        pytest.param(["show", "--allocated", "2"], 2, "not in 0..1", id="allocation past 1"),
        # issue 10, item 7: one bound in the parser, the same on SQLite and PostgreSQL.
        pytest.param(
            ["tenant", "set", "acme", "--quota", "1e30"], 2, "'1e30' is more than 1,000,000 GPUs", id="quota 1e30"
        ),
        pytest.param(
            ["tenant", "add", "x", "--quota", "3000000"], 2, "more than 1,000,000 GPUs", id="quota past int columns"
        ),
        pytest.param(["tenant", "add", "x", "--quota", "1_000"], 2, "'1_000' is not a number", id="underscores"),
        # item 3: the names the simulator's tenants file refuses too.
        pytest.param(["tenant", "add", "Acme", "--quota", "1"], 1, "(write 'acme')", id="upper-case twin"),
        pytest.param(["tenant", "add", "it's", "--quota", "1"], 1, 'invalid tenant name "it\'s"', id="quote"),
        # item 9: echoed verbatim, neither markup nor emoji rendered.
        pytest.param(
            ["project", "add", "acme", "[bold]x:a:"], 1, "invalid project name '[bold]x:a:'", id="markup verbatim"
        ),
    ],
)
def test_bad_input_exits_nonzero_with_the_fix_and_changes_nothing(
    url: str, args: list[str], code: int, message: str
) -> None:
    run("tenant", "add", "acme", "--quota", "8")
    run("tenant", "add", "beta", "--quota", "2")
    run("project", "add", "acme", "vision", "--quota", "4")
    before = run("history", "--json")

    result = CliRunner().invoke(quota_app, args)

    assert result.exit_code == code, result.output
    assert message in " ".join(result.output.replace("│", " ").split())  # unwrap rich's error box
    assert "Traceback" not in result.output
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


def test_a_ledger_url_naming_a_file_that_is_not_a_database_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 10, item 8: "file is not a database" was a traceback.
    path = tmp_path / "notes.txt"
    path.write_text("these are notes, not a ledger\n" * 100)
    monkeypatch.setenv(URL_ENV, f"sqlite:///{path}")
    result = CliRunner().invoke(quota_app, ["tenant", "add", "acme", "--quota", "1"])
    assert result.exit_code == 1
    assert f"cannot open the quota ledger at sqlite:///{path}: file is not a database" in " ".join(
        result.output.split()
    )
    assert URL_ENV in result.output
    assert "Traceback" not in result.output
    assert path.read_text() == "these are notes, not a ledger\n" * 100


def test_show_says_which_ledger_it_read_and_when_it_just_created_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(URL_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    where = f"ledger: sqlite:///.xirang/ledger.sqlite ({tmp_path / '.xirang' / 'ledger.sqlite'})"
    first = CliRunner().invoke(quota_app, ["show"])
    assert first.exit_code == 0, first.output
    assert f"{where} (created now: it was empty;" in " ".join(first.stdout.split())
    second = CliRunner().invoke(quota_app, ["show", "--json"])
    assert second.exit_code == 0, second.output
    assert " ".join(second.stderr.split()) == where  # on stderr: stdout stays one JSON object
    assert json.loads(second.stdout)["accounts"] == []


def platform_with_ledger(folder: Path) -> Path:
    """A platform config whose ledger is `ledger.sqlite` beside it, holding tenant research (12 GPUs)."""
    folder.mkdir()
    config = folder / "xirang.yaml"
    config.write_text(
        "ledger_url: sqlite:///ledger.sqlite\n"
        "tenants: {research: {quota_gpus: 12, projects: {llm: {}}}}\n"
        "locations: {research: research}\n",
        encoding="utf-8",
    )
    ledger = Ledger(f"sqlite:///{folder / 'ledger.sqlite'}")
    ledger.add_tenant("research", 12000)
    ledger.close()
    return config


def test_show_reads_the_ledger_xirang_config_names_and_creates_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 20 item 9: `quota show` ignored XIRANG_CONFIG and created an empty ./.xirang/ledger.sqlite
    config = platform_with_ledger(tmp_path / "platform")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.delenv(URL_ENV, raising=False)
    monkeypatch.setenv(CONFIG_ENV, str(config))

    shown = json.loads(run("show", "--json"))

    assert [a["account"] for a in shown["accounts"]] == ["research"]
    assert not (tmp_path / "elsewhere" / ".xirang").exists()


def test_xirang_ledger_url_still_wins_over_the_platform_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_ENV, str(platform_with_ledger(tmp_path / "platform")))
    monkeypatch.setenv(URL_ENV, f"sqlite:///{tmp_path / 'other.sqlite'}")
    assert json.loads(run("show", "--json"))["accounts"] == []


def test_a_broken_xirang_config_is_named_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(URL_ENV, raising=False)
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "missing.yaml"))
    result = CliRunner().invoke(quota_app, ["show"])
    assert result.exit_code == 1
    assert f"{tmp_path / 'missing.yaml'}: no platform config here" in " ".join(result.output.split())
    assert "Traceback" not in result.output
