"""The GPU catalog: canonical names, aliases, NVML names, GFD labels, unknown models, the data file."""

from __future__ import annotations

import pytest

from xirang_platform.pool.catalog import (
    Catalog,
    CatalogError,
    architecture_from_cc,
    default_catalog,
    gfd_product_label,
    model_entry,
    parse_model_entry,
)
from xirang_platform.pool.model import MigProfile


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        pytest.param("H100-SXM", "H100-SXM", id="canonical name"),
        pytest.param("h100-sxm", "H100-SXM", id="case does not matter"),
        pytest.param("H100 SXM", "H100-SXM", id="space for dash"),
        pytest.param("NVIDIA H100 80GB HBM3", "H100-SXM", id="NVML name"),
        pytest.param("NVIDIA-H100-80GB-HBM3", "H100-SXM", id="GFD product label"),
        pytest.param("NVIDIA H200", "H200", id="H200 NVML name"),
        pytest.param("NVIDIA-A100-SXM4-80GB", "A100-80", id="A100 80GB label"),
        pytest.param("A100-SXM4-40GB-MIG-1g.5gb-SHARED", "A100-40", id="GFD MIG single and shared suffixes"),
        pytest.param("NVIDIA-L40S-SHARED", "L40S", id="GFD time-slicing suffix"),
        pytest.param("V100M16", "V100-16", id="openb V100M16"),
        pytest.param("V100M32", "V100-32", id="openb V100M32"),
        pytest.param("Tesla-V100-SXM2-32GB", "V100-32", id="V100 label"),
        pytest.param("Tesla T4", "T4", id="T4 NVML name"),
        pytest.param("Tesla P100-PCIE-16GB", "P100", id="P100 NVML name"),
        pytest.param("NVIDIA A10", "A10", id="A10 NVML name"),
        pytest.param("A10", "A10", id="A10 is not A100"),
        pytest.param("g2", "G2", id="openb undisclosed code"),
        pytest.param("G1", "G1", id="openb G1"),
    ],
)
def test_lookup_canonicalises_every_accepted_spelling(spelling, canonical):
    assert default_catalog().lookup(spelling).name == canonical


@pytest.mark.parametrize(
    ("spelling", "suggested"),
    [
        pytest.param("H100-SMX", "H100-SXM", id="transposed letters"),
        pytest.param("V100M64", "V100-32", id="openb-like code"),
        pytest.param("L40", "L40S", id="missing suffix"),
        pytest.param("A100", "A100-80", id="ambiguous: both A100 sizes offered"),
    ],
)
def test_unknown_model_error_suggests_close_names(spelling, suggested):
    with pytest.raises(CatalogError) as exc:
        default_catalog().lookup(spelling)
    assert suggested in exc.value.suggestions
    assert f"unknown GPU model {spelling!r}: did you mean" in str(exc.value)
    assert "known models: H200, H100-SXM" in str(exc.value)
    assert exc.value.name == spelling


def test_unknown_model_with_nothing_close_still_lists_the_known_models():
    with pytest.raises(CatalogError, match="known models") as exc:
        default_catalog().lookup("zzzzzzzz")
    assert exc.value.suggestions == ()


def test_ambiguous_a100_offers_both_sizes():
    assert {"A100-80", "A100-40"} <= set(default_catalog().suggest("A100", n=3))


def test_catalog_holds_the_contract_models_in_file_order():
    assert default_catalog().names == (
        "H200",
        "H100-SXM",
        "A100-80",
        "A100-40",
        "L40S",
        "A10",
        "V100-32",
        "V100-16",
        "T4",
        "P100",
        "G1",
        "G2",
        "G3",
    )


def test_compute_levels_order_the_generations():
    level = {m.name: m.compute_level for m in default_catalog()}
    assert level["H200"] == level["H100-SXM"] == 989
    assert level["H100-SXM"] > level["L40S"] > level["A100-80"] == level["A100-40"] > level["A10"]
    assert level["A10"] == level["V100-32"] == level["V100-16"] > level["T4"] > level["P100"] > 0
    assert level["G1"] == level["G2"] == level["G3"] == 0


def test_nvml_memory_totals_are_below_marketing_sizes():
    memory = {m.name: m.memory_mib for m in default_catalog()}
    assert memory == memory | {
        "H200": 143771,
        "H100-SXM": 81559,
        "A100-80": 81920,
        "A100-40": 40960,
        "L40S": 46068,
        "A10": 23028,
    }


def test_undisclosed_openb_codes_are_flagged_as_assumed():
    for name in ("G1", "G2", "G3"):
        model = default_catalog().lookup(name)
        assert model.notes.startswith("ASSUMED: undisclosed openb code")
        assert model.known


def test_mig_profiles_come_from_the_table():
    a100 = default_catalog().lookup("A100-80")
    assert a100.mig_profiles[0] == MigProfile("1g.10gb", 1, 10, 7)
    assert a100.mig_profiles[0].milli == 142  # 1/7 of a GPU, rounded down
    assert [p.name for p in default_catalog().lookup("H200").mig_profiles] == [
        "1g.18gb",
        "1g.18gb+me",
        "1g.35gb",
        "2g.35gb",
        "3g.71gb",
        "4g.71gb",
        "7g.141gb",
    ]
    assert default_catalog().lookup("L40S").mig_profiles == ()
    assert default_catalog().lookup("A100-40").mig_profiles[-1] == MigProfile("7g.40gb", 7, 40, 1)


def test_from_nvml_returns_the_catalog_model_for_a_known_name():
    model = default_catalog().from_nvml("NVIDIA H100 80GB HBM3", 81559, (9, 0))
    assert model is default_catalog().lookup("H100-SXM")


def test_from_nvml_keeps_an_unknown_model_with_what_nvml_said():
    model = default_catalog().from_nvml("NVIDIA B200", 183359, (10, 0))
    assert (model.name, model.memory_mib, model.compute_level, model.architecture, model.known) == (
        "NVIDIA-B200",
        183359,
        0,
        "blackwell",
        False,
    )
    assert model.nvml_names == ("NVIDIA B200",)
    assert "not in the GPU catalog" in model.notes


def test_default_catalog_is_loaded_once():
    assert default_catalog() is default_catalog()


@pytest.mark.parametrize(
    ("major", "minor", "family"),
    [
        (6, 0, "pascal"),
        (7, 0, "volta"),
        (7, 5, "turing"),
        (8, 0, "ampere"),
        (8, 6, "ampere"),
        (8, 9, "ada-lovelace"),
        (9, 0, "hopper"),
        (10, 0, "blackwell"),
        (12, 0, "blackwell"),
        (13, 0, "rubin"),
        (3, 5, "unknown"),
    ],
)
def test_architecture_family_from_compute_capability(major, minor, family):
    assert architecture_from_cc(major, minor) == family


@pytest.mark.parametrize(
    ("nvml", "label"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("Tesla V100-SXM2-32GB", "Tesla-V100-SXM2-32GB"),
        ("NVIDIA GeForce RTX 4090 (rev a)", "NVIDIA-GeForce-RTX-4090-rev-a"),
    ],
)
def test_gfd_product_label_from_nvml_name(nvml, label):
    assert gfd_product_label(nvml) == label


def entry(**overrides):
    return {"name": "X1", "memory_mib": 1024, "compute_level": 10} | overrides


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        pytest.param(entry(memory_mib="lots"), "`memory_mib` must be a non-negative integer", id="memory not an int"),
        pytest.param(entry(compute_level=-1), "`compute_level` must be a non-negative integer", id="negative level"),
        pytest.param(entry(mig=["1g.10gb"]), "is not '<slices>g.<gb>gb[+me]:<count>'", id="MIG without count"),
        pytest.param(entry(interconnect="infiniband"), "`interconnect` must be one of nvlink, pcie", id="interconnect"),
        pytest.param(entry(memroy_mib=1), "unknown field 'memroy_mib'", id="misspelt field"),
        pytest.param(entry(name=""), "`name` is missing", id="no name"),
        pytest.param(entry(aliases="X"), "`aliases` must be a list of strings", id="aliases not a list"),
    ],
)
def test_malformed_catalog_entry_names_the_entry_and_the_problem(bad, message):
    with pytest.raises(CatalogError, match="models\\[0\\]") as exc:
        parse_model_entry(bad, "my.yaml: models[0]")
    assert message in str(exc.value)


def test_alias_naming_two_models_is_refused():
    text = """
schema_version: 1
models:
  - {name: X1, memory_mib: 1, compute_level: 1, aliases: [shared]}
  - {name: X2, memory_mib: 1, compute_level: 1, aliases: [Shared]}
"""
    with pytest.raises(CatalogError, match="'Shared' of model 'X2' also names 'X1'"):
        Catalog.from_text(text, "my.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("models: {}", "expected a mapping with a `models` list", id="models not a list"),
        pytest.param("schema_version: 2\nmodels: []", "schema_version 2 is not supported", id="future schema"),
        pytest.param("models: [", "not valid YAML", id="broken YAML"),
    ],
)
def test_malformed_catalog_file_is_refused(text, message):
    with pytest.raises(CatalogError) as exc:
        Catalog.from_text(text, "my.yaml")
    assert str(exc.value).startswith("my.yaml: ")
    assert message in str(exc.value)


def test_model_entry_reads_back_as_the_same_model():
    for model in default_catalog():
        assert parse_model_entry(model_entry(model), "x")[0] == model


def test_extended_catalog_refuses_a_second_definition():
    with pytest.raises(CatalogError, match="model 'T4' is defined twice; keep one entry"):
        default_catalog().extended([parse_model_entry(entry(name="T4"), "x")])


def test_extended_catalog_keeps_the_old_aliases_and_adds_models():
    extended = default_catalog().extended([parse_model_entry(entry(name="B200", nvml_names=["NVIDIA B200"]), "x")])
    assert extended.lookup("V100M16").name == "V100-16"
    assert extended.lookup("NVIDIA-B200").name == "B200"
    assert "B200" not in default_catalog()
