"""The platform config a running platform reads (`live_config.read_live`): an edit that loads applies;
one the loader refuses is kept out, the last good config stays in force and the reading says why;
a process that starts while the file is bad runs on the copy the platform saved (issue 31: a bad
`xirang.yaml` edit went unnoticed by the tick and failed the next run with a stack trace)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from xirang_platform.control import live_config
from xirang_platform.control.live_config import read_live, saved_at
from xirang_platform.control.platform_config import PlatformConfigError

POOL_FILE = Path(__file__).resolve().parents[1] / "dagster" / "pool.yaml"  # 16 H100-SXM + 4 L40S
GOOD = "pool: pool.yaml\ntenants: {acme: {quota_gpus: 8}}\n"  # the pool beside the file: a relative path
_MTIMES = itertools.count(1_900_000_000)


def edit(path: Path, text: str) -> None:
    """Write `text` as an editor saves it: a new modification time every time."""
    path.write_text(text, encoding="utf-8")
    second = next(_MTIMES)
    os.utime(path, ns=(second * 10**9, second * 10**9))


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A good platform config whose pool file sits beside it, and a Dagster home for the saved copy."""
    (tmp_path / "platform").mkdir()
    (tmp_path / "platform" / "pool.yaml").write_text(POOL_FILE.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    path = tmp_path / "platform" / "xirang.yaml"
    edit(path, GOOD)
    live_config.forget()
    yield path
    live_config.forget()


BAD_EDITS = [
    pytest.param(
        GOOD.replace("quota_gpus: 8", "quota_gpus: 8 GPUs"),
        "tenants.acme: quota '8 GPUs' is not a number of GPUs",
        id="a quota written with its unit",
    ),
    pytest.param(GOOD + "tenants: [\n", "not valid YAML", id="broken YAML"),
    pytest.param(
        GOOD + "tick: {intervall_s: 5}\n", "unknown key 'intervall_s'; did you mean 'interval_s'?", id="a typo"
    ),
]


@pytest.mark.parametrize(("bad", "problem"), BAD_EDITS)
def test_a_bad_edit_keeps_the_last_good_config_and_says_why(config: Path, bad: str, problem: str) -> None:
    good = read_live(config)
    edit(config, bad)

    kept = read_live(config)

    assert kept.config is good.config
    assert kept.problem is not None
    assert problem in kept.problem
    assert kept.line().startswith(f"platform config not applied: {kept.problem}")
    edit(config, GOOD.replace("quota_gpus: 8", "quota_gpus: 6"))  # fixed, and changed
    fixed = read_live(config)
    assert (fixed.problem, fixed.config.book.tenants, fixed.line()) == (None, {"acme": 6000}, "")
    assert fixed.generation > good.generation


@pytest.mark.parametrize(("bad", "problem"), BAD_EDITS)
def test_a_process_started_on_a_bad_edit_runs_on_the_saved_copy(config: Path, bad: str, problem: str) -> None:
    read_live(config)  # a process of the platform read it good: the copy is saved
    edit(config, bad)
    live_config.forget()  # a new process: a run worker, a reloaded code location

    reading = read_live(config)

    assert reading.problem is not None
    assert problem in reading.problem
    assert reading.config.book.tenants == {"acme": 8000}
    assert reading.config.pool.gpus == 20  # `pool: pool.yaml` still the file beside the config
    assert saved_at(config) is not None


def test_a_platform_started_on_a_bad_file_gets_the_loaders_error(config: Path) -> None:
    edit(config, GOOD.replace("quota_gpus: 8", "quota_gpus: 8 GPUs"))
    with pytest.raises(PlatformConfigError, match="is not a number of GPUs"):
        read_live(config)


def test_without_a_dagster_home_nothing_is_saved_for_a_new_process(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DAGSTER_HOME")
    read_live(config)
    assert saved_at(config) is None
    edit(config, GOOD + "tenants: [\n")
    live_config.forget()
    with pytest.raises(PlatformConfigError, match="not valid YAML"):
        read_live(config)


def test_an_unchanged_file_is_not_read_again(config: Path) -> None:
    first = read_live(config)
    assert read_live(config) is first
