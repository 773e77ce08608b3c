"""The `--tenants` YAML file becomes a quota book; a bad file is a clear error naming the place and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.simulate.tenants import TenantsError, default_book, read_tenants

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
        pytest.param("tenants: {a: {quota_gpus: -1}}", "quota -1 is not a number of GPUs", id="negative"),
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
