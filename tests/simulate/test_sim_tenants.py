"""The `--tenants` YAML file becomes a quota book; a bad file is a clear error naming the place and fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from xirang_platform.cli.quota import parse_gpus
from xirang_platform.control.tenants import TenantsError, default_book, read_tenants
from xirang_platform.scheduling.quota import QuotaBook

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tenants.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_quotas_in_gpus_and_shares_become_milli(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
tenants:
  research:
    quota_gpus: 4.5
    projects:
      llm: {quota_gpus: 3}
      vision: {}
      misc:
  product:
    quota_share: 0.25
""",
    )
    got = read_tenants(path, pool_gpu_milli=16000)
    assert got == QuotaBook(
        {"research": 4500, "product": 4000},
        {
            ("research", "llm"): 3000,
            ("research", "vision"): None,
            ("research", "misc"): None,
            ("product", "default"): None,
        },
    )


def test_the_shipped_example_reads() -> None:
    got = read_tenants(REPO / "data/tenants.example.yaml", pool_gpu_milli=10000)
    assert got.tenants == {"research": 4000, "product": 6000}
    assert sorted(got.projects) == [
        ("product", "ranking"),
        ("product", "serving"),
        ("research", "llm"),
        ("research", "vision"),
    ]


def test_without_a_file_one_tenant_owns_the_pool() -> None:
    assert default_book(8000) == QuotaBook({"default": 8000}, {("default", "default"): None})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("tenants: [a, b]", "expected a top-level `tenants:` mapping", id="not a mapping"),
        pytest.param("teams: {a: {quota_gpus: 1}}", "expected a top-level `tenants:` mapping", id="wrong top key"),
        pytest.param("tenants: {a: {quota_gpu: 1}}", "unknown key 'quota_gpu'; did you mean 'quota_gpus'?", id="typo"),
        pytest.param("tenants: {a: {projects: {}}}", "tenants.a: give quota_gpus", id="no quota"),
        pytest.param("tenants: {a: {quota_gpus: -1}}", "quota -1 is negative", id="negative"),
        pytest.param("tenants: {a: {quota_gpus: many}}", "quota 'many' is not a number", id="not a number"),
        pytest.param("tenants: {a: {quota_share: 1.5}}", "more than the whole pool", id="share above one"),
        pytest.param("tenants: {a: {quota_gpus: 1, quota_share: 0.1}}", "not both", id="both quotas"),
        pytest.param(
            "tenants: {a: {quota_gpus: 2, projects: {p: {quota_gpus: 2}, q: {quota_gpus: 1}}}}",
            "project quotas exceed the tenant quota x 1.2 by 0.6 GPUs",
            id="projects past the tenant",
        ),
        pytest.param(
            "tenants: {a: {quota_gpus: 2, projects: [p]}}",
            "tenants.a.projects: expected a mapping",
            id="projects as a list",
        ),
        pytest.param("tenants: {a: {quota_gpus: 2", "not valid YAML", id="broken yaml"),
        # issue 10, item 3: the ledger's rules for numbers and names, in the ledger's words.
        pytest.param("tenants: {a: {quota_gpus: .inf}}", "tenants.a: quota inf is not a number of GPUs", id="inf"),
        pytest.param("tenants: {a: {quota_gpus: .nan}}", "tenants.a: quota nan is not a number of GPUs", id="nan"),
        pytest.param("tenants: {a: {quota_gpus: 1e30}}", "more than 1,000,000 GPUs", id="quota too large"),
        pytest.param("tenants: {a: {quota_gpus: 0.0005}}", "finer than 1 milli-GPU", id="finer than a milli"),
        pytest.param("tenants: {a: {quota_share: .nan}}", "quota_share nan is not a fraction", id="nan share"),
        pytest.param(
            "tenants: {a: {quota_share: 0.6}, b: {quota_share: 0.5}}",
            "tenant quota_share values sum to 1.1 (a 0.6, b 0.5), more than the whole pool",
            id="shares past the pool",
        ),
        pytest.param("tenants: {a/b: {quota_gpus: 1}}", "invalid tenant name 'a/b'", id="slash in a tenant name"),
        pytest.param('tenants: {"it\'s": {quota_gpus: 1}}', 'invalid tenant name "it\'s"', id="quote in a name"),
        pytest.param(
            "tenants: {Research: {quota_gpus: 1}, research: {quota_gpus: 1}}",
            "invalid tenant name 'Research': use 1-64 lower-case letters, digits, '.', '_' or '-', starting with a "
            "letter or digit (write 'research')",
            id="upper-case name beside its lower-case twin",
        ),
        pytest.param(
            "tenants: {a: {quota_gpus: 1, projects: {x y: {}}}}",
            "tenants.a.projects: invalid project name 'x y'",
            id="space in a project name",
        ),
    ],
)
def test_a_bad_file_names_the_problem_and_the_fix(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(TenantsError) as err:
        read_tenants(path, pool_gpu_milli=16000)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_a_missing_file_points_at_the_example() -> None:
    with pytest.raises(TenantsError, match="tenants.example.yaml"):
        read_tenants("/nonexistent/tenants.yaml", 1000)


def test_a_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_bytes(bytes(range(128, 256)))
    with pytest.raises(TenantsError, match=r"g.yaml: not UTF-8 text"):
        read_tenants(path, 1000)


@pytest.mark.parametrize("quota", ["-1", "1e30", "0.0005", "nan", "many", "3000000"])
def test_the_tenants_file_refuses_a_quota_as_the_ledger_does(tmp_path: Path, quota: str) -> None:
    """One rule: the tenants file and `xirang quota` refuse the same quotas with the same words."""
    with pytest.raises(typer.BadParameter) as ledger_error:
        parse_gpus(quota)
    path = _write(tmp_path, f"tenants: {{a: {{quota_gpus: {quota}}}}}")
    with pytest.raises(TenantsError) as file_error:
        read_tenants(path, pool_gpu_milli=16000)
    # The value is echoed as each read it (text '1e30', YAML's float 1e+30); what follows is the same rule.
    assert f"{path}: tenants.a: quota " in str(file_error.value)
    assert str(file_error.value).split(" is ", 1)[1] == ledger_error.value.message.split(" is ", 1)[1]
