"""The openb node CSV reader: the real trace, automatic and explicit domains, and every error case."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from xirang_platform.pool.inventory_error import InventoryError
from xirang_platform.pool.openb_csv import read_openb_nodes
from xirang_platform.pool.readers import read_pool

TRACE = Path(__file__).resolve().parents[2] / "data" / "traces" / "alibaba_openb_gpu_2023"
HEADER = "sn,cpu_milli,memory_mib,gpu,model"


def write(tmp_path: Path, *rows: str, header: str = HEADER) -> Path:
    path = tmp_path / "nodes.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_real_openb_gpu_node_list():
    pool = read_openb_nodes(TRACE / "openb_node_list_gpu_node.csv")
    assert (len(pool.nodes), pool.gpus) == (1213, 6212)
    nodes_per_model = Counter(n.model_name for n in pool.nodes)
    assert nodes_per_model == {"G2": 549, "T4": 404, "P100": 134, "V100-16": 55, "G3": 39, "V100-32": 30, "A10": 2}
    by_domain: dict[str, list] = {}
    for node in pool.nodes:
        by_domain.setdefault(node.domain, []).append(node)
    assert all(len(nodes) <= 8 for nodes in by_domain.values())
    assert all(len({n.model_name for n in nodes}) == 1 for nodes in by_domain.values())
    # ceil(nodes / 8) per model: 69 + 51 + 17 + 7 + 5 + 4 + 1
    assert len(by_domain) == 154
    assert {n.unit_milli for n in pool.nodes} == {1}


def test_real_openb_all_node_list_adds_cpu_only_nodes():
    pool = read_openb_nodes(TRACE / "openb_node_list_all_node.csv")
    cpu_only = [n for n in pool.nodes if n.model is None]
    assert (len(pool.nodes), pool.gpus, len(cpu_only)) == (1523, 6212, 310)
    assert all(n.gpus == 0 and n.domain.startswith("cpu-") for n in cpu_only)


def test_automatic_domains_are_consecutive_blocks_per_model_in_file_order(tmp_path):
    path = write(
        tmp_path,
        "n0,1000,1024,8,G2",
        "n1,1000,1024,2,T4",
        "n2,1000,1024,8,G2",
        "n3,1000,1024,8,G2",
        "n4,1000,1024,2,T4",
        "n5,1000,1024,0,",
        "n6,1000,1024,8,V100M32",
        "n7,1000,1024,8,G2",
    )
    pool = read_openb_nodes(path, domain_size=2)
    assert {n.name: n.domain for n in pool.nodes} == {
        "n0": "G2-000",
        "n2": "G2-000",
        "n3": "G2-001",
        "n7": "G2-001",
        "n1": "T4-000",
        "n4": "T4-000",
        "n5": "cpu-000",
        "n6": "V100-32-000",
    }


def test_explicit_domain_column_is_kept(tmp_path):
    path = write(tmp_path, "a,1000,1024,8,G2,leaf-1", "b,1000,1024,2,T4,leaf-1", header=HEADER + ",domain")
    assert {n.name: n.domain for n in read_openb_nodes(path).nodes} == {"a": "leaf-1", "b": "leaf-1"}


def test_columns_may_come_in_any_order_with_extras(tmp_path):
    path = write(tmp_path, "T4,2,n0,x,8000,1024", header="model,gpu,sn,comment,cpu_milli,memory_mib")
    node = read_openb_nodes(path).node("n0")
    assert (node.model_name, node.gpus, node.cpu_milli, node.memory_mib) == ("T4", 2, 8000, 1024)


def test_unit_milli_applies_to_gpu_nodes(tmp_path):
    path = write(tmp_path, "n0,1000,1024,2,T4", "n1,1000,1024,0,")
    pool = read_openb_nodes(path, unit_milli=125)
    assert [(n.name, n.unit_milli) for n in pool.nodes] == [("n0", 125), ("n1", 1000)]
    assert sum(1 for _ in pool.units()) == 16


@pytest.mark.parametrize(
    ("rows", "header", "line", "field", "fix"),
    [
        pytest.param(
            ["n0,1000,1024,2"], "sn,cpu_milli,memory_mib,gpu", 1, "model", "the header must hold", id="missing column"
        ),
        pytest.param(
            ["n0,1000,1024,2,T4", "n1,lots,1024,2,T4"], HEADER, 3, "cpu_milli", "whole number", id="non-integer cpu"
        ),
        pytest.param(["n0,1000,-5,2,T4"], HEADER, 2, "memory_mib", "0 or more", id="negative memory"),
        pytest.param(["n0,1000,1024,2.5,T4"], HEADER, 2, "gpu", "whole number", id="fractional gpu count"),
        pytest.param(["n0,1000,1024,,T4"], HEADER, 2, "gpu", "whole number", id="empty gpu"),
        pytest.param(
            ["n0,1000,1024,2,T4", "n1,1000,1024,2,T4", "n0,1000,1024,2,T4"],
            HEADER,
            4,
            "sn",
            "unique name",
            id="duplicate node name",
        ),
        pytest.param(["n0,1000,1024,4,"], HEADER, 2, "model", "name the GPU model", id="gpus with no model"),
        pytest.param(
            ["n0,1000,1024,0,T4"], HEADER, 2, "gpu", "clear model for a CPU-only node", id="model with no gpus"
        ),
        pytest.param(
            ["n0,1000,1024,8,V100M64"], HEADER, 2, "model", "did you mean V100-16, V100-32", id="unknown model"
        ),
        pytest.param([",1000,1024,8,G2"], HEADER, 2, "sn", "give every node a name", id="empty name"),
        pytest.param(["n0,1000,1024,8,G2,extra"], HEADER, 2, "row", "remove the extra fields", id="extra field"),
        pytest.param(
            ["n0,1000,1024,8,G2,"],
            HEADER + ",domain",
            2,
            "domain",
            "drop the column",
            id="empty domain in a domain column",
        ),
        pytest.param([], HEADER, 1, "rows", "add one row per node", id="header only"),
    ],
)
def test_malformed_csv_names_file_line_field_and_fix(tmp_path, rows, header, line, field, fix):
    path = write(tmp_path, *rows, header=header)
    with pytest.raises(InventoryError) as exc:
        read_openb_nodes(path)
    err = exc.value
    assert (err.path, err.line, err.field) == (str(path), line, field)
    assert fix in err.fix or fix in err.problem
    assert str(err).startswith(f"{path}:{line}: {field}: ")


def test_line_numbers_count_blank_lines(tmp_path):
    path = tmp_path / "nodes.csv"
    path.write_text(f"{HEADER}\nn0,1000,1024,2,T4\n\nn1,1000,1024,x,T4\n")
    with pytest.raises(InventoryError) as exc:
        read_openb_nodes(path)
    assert exc.value.line == 4


@pytest.mark.parametrize(
    ("options", "field"),
    [
        pytest.param({"domain_size": 0}, "domain_size", id="zero domain size"),
        pytest.param({"unit_milli": 300}, "unit_milli", id="unit not dividing 1000"),
        pytest.param({"unit_milli": 0}, "unit_milli", id="zero unit"),
    ],
)
def test_bad_options_are_refused(tmp_path, options, field):
    path = write(tmp_path, "n0,1000,1024,2,T4")
    with pytest.raises(InventoryError) as exc:
        read_openb_nodes(path, **options)
    assert exc.value.field == field


def test_missing_file_is_an_inventory_error(tmp_path):
    with pytest.raises(InventoryError, match="absent.csv: file: cannot be read .* check the path"):
        read_openb_nodes(tmp_path / "absent.csv")


def test_read_pool_dispatches_csv_with_its_options(tmp_path):
    path = write(tmp_path, *(f"n{i},1000,1024,8,G2" for i in range(6)))
    pool = read_pool(path, domain_size=4, unit_milli=500)
    assert pool.domains == ("G2-000", "G2-001")
    assert {n.unit_milli for n in pool.nodes} == {500}
