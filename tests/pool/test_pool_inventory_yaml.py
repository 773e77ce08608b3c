"""The YAML inventory reader: groups, units, defaults, extra models, and every error naming file:line."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from xirang_platform.pool.inventory_error import InventoryError
from xirang_platform.pool.readers import default_pool, read_pool
from xirang_platform.pool.yaml_inventory import parse_cpu, parse_memory, read_inventory


def write(tmp_path: Path, text: str, name: str = "pool.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


GOOD = """
schema_version: 1
name: lab
unit_milli:
  L40S: 125
nodes:
  - name: h100-{index:02d}
    count: 3
    start: 1
    model: H100-SXM
    gpus: 8
    cpu: 224
    memory: 2Ti
    domain: island-a
    labels: {zone: a, rack: 7, gpu: true}
  - name: l40s-0
    model: NVIDIA-L40S
    gpus: 4
    cpu: "64000m"
    memory: 524288
  - name: cpu-0
    cpu: 0.5
    memory: 1.5Gi
"""


def test_groups_expand_into_named_nodes_with_their_fields(tmp_path):
    pool = read_inventory(write(tmp_path, GOOD))
    assert [n.name for n in pool.nodes] == ["cpu-0", "h100-01", "h100-02", "h100-03", "l40s-0"]
    h100 = pool.node("h100-02")
    assert (h100.model_name, h100.gpus, h100.cpu_milli, h100.memory_mib, h100.domain, h100.unit_milli) == (
        "H100-SXM",
        8,
        224000,
        2 * 1024 * 1024,
        "island-a",
        1000,
    )
    assert dict(h100.labels) == {"gpu": "true", "rack": "7", "zone": "a"}
    l40s = pool.node("l40s-0")
    assert (l40s.model_name, l40s.cpu_milli, l40s.memory_mib, l40s.domain, l40s.unit_milli) == (
        "L40S",
        64000,
        524288,
        "l40s-0",
        125,
    )  # no domain given: the node is its own domain
    cpu = pool.node("cpu-0")
    assert (cpu.model, cpu.gpus, cpu.cpu_milli, cpu.memory_mib) == (None, 0, 500, 1536)
    assert pool.gpus == 28
    assert pool.source == str(tmp_path / "pool.yaml")


def test_inventory_can_describe_a_model_the_catalog_lacks(tmp_path):
    path = write(
        tmp_path,
        """
        schema_version: 1
        models:
          - {name: B200, nvml_names: ["NVIDIA B200"], memory_mib: 183359, compute_level: 2250, interconnect: nvlink}
        unit_milli: {B200: 500}
        nodes:
          - {name: b200-0, model: NVIDIA-B200, gpus: 8, cpu: 224, memory: 2Ti}
        """,
    )
    node = read_inventory(path).node("b200-0")
    assert (node.model_name, node.model.compute_level, node.unit_milli) == ("B200", 2250, 500)


@pytest.mark.parametrize(("value", "milli"), [(96, 96000), (0.5, 500), ("96", 96000), ("2500m", 2500), (0, 0)])
def test_cpu_amounts(value, milli):
    assert parse_cpu(value) == milli


@pytest.mark.parametrize("value", ["many", "0.0001", -1, True, "12x"])
def test_bad_cpu_amounts(value):
    with pytest.raises(ValueError, match=re.escape(str(value))):
        parse_cpu(value)


@pytest.mark.parametrize(
    ("value", "mib"),
    [(4096, 4096), ("512Mi", 512), ("256Gi", 262144), ("2Ti", 2097152), ("1.5GiB", 1536), ("100", 100)],
)
def test_memory_amounts(value, mib):
    assert parse_memory(value) == mib


@pytest.mark.parametrize("value", ["lots", "1.5Mi", "16GB", -1, True])
def test_bad_memory_amounts(value):
    with pytest.raises(ValueError, match=re.escape(str(value))):
        parse_memory(value)


NODE = "  - {name: n0, model: T4, gpus: 2, cpu: 8, memory: 64Gi}\n"


def block(**fields: object) -> str:
    """A one-node block entry at line 2 of the file, fields one per line (name on line 2)."""
    base = {"name": "n0", "model": "T4", "gpus": 2, "cpu": 8, "memory": "64Gi"} | fields
    lines = []
    for i, (key, value) in enumerate((k, v) for k, v in base.items() if v is not None):
        lines.append(("  - " if i == 0 else "    ") + f"{key}: {value}")
    return "nodes:\n" + "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "line", "field", "fix"),
    [
        pytest.param(block(model="H100-SMX"), 3, "model", "did you mean H100-SXM", id="unknown model"),
        pytest.param(block(gpus="eight"), 4, "gpus", "write gpus as a whole number", id="gpus not an integer"),
        pytest.param(block(gpus=-1), 4, "gpus", "write gpus as 0 or more", id="negative gpus"),
        pytest.param(block(gpus=None), 2, "gpus", "add `gpus:`", id="gpus missing for a GPU node"),
        pytest.param(block(cpu=None), 2, "cpu", "add `cpu:`", id="cpu missing"),
        pytest.param(block(memory=None), 2, "memory", "add `memory:`", id="memory missing"),
        pytest.param(block(memory="lots"), 6, "memory", "quantity like 256Gi", id="memory not a quantity"),
        pytest.param(block(cpu="many"), 5, "cpu", "write cores as a number", id="cpu not an amount"),
        pytest.param(block(model=None), 3, "model", "name the GPU model", id="gpus without model"),
        pytest.param(block(gpus=0), 4, "gpus", "drop model for a CPU-only node", id="model with zero gpus"),
        pytest.param(block(count=2), 2, "name", "put {index}", id="group name without index"),
        pytest.param(block(count=0), 7, "count", "set count to 1 or more", id="zero count"),
        pytest.param(block(name="n{index}-{rack}", count=2), 2, "name", "use {index}", id="unknown placeholder"),
        pytest.param(block(name="n{index:zz}", count=2), 2, "name", "use {index}", id="bad format spec"),
        pytest.param(block(gpu=2), 7, "gpu", "did you mean 'gpus'", id="misspelt field"),
        pytest.param(block(labels="[a, b]"), 7, "labels", "key: value", id="labels not a mapping"),
        pytest.param(block(gpu_uuids="[GPU-1]"), 7, "gpu_uuids", "one UUID per GPU", id="too few uuids"),
        pytest.param(block(domain='""'), 7, "domain", "write the domain as a name", id="empty domain"),
        pytest.param(block(name='""'), 2, "name", "give the node (group) a `name`", id="empty name"),
        pytest.param(block() + NODE, 7, "name", "give each node a unique name", id="duplicate node name"),
        pytest.param("node:\n" + NODE, 1, "node", "did you mean 'nodes'", id="misspelt top-level field"),
        pytest.param("nodes: []\n", 1, "nodes", "add a `nodes:` list", id="no nodes"),
        pytest.param(
            "schema_version: 2\nnodes:\n" + NODE, 1, "schema_version", "write schema_version: 1", id="future schema"
        ),
        pytest.param(
            "unit_milli: {T4: 300}\nnodes:\n" + NODE, 1, "unit_milli.T4", "divisor of 1000", id="unit not dividing 1000"
        ),
        pytest.param(
            "unit_milli:\n  T5: 125\nnodes:\n" + NODE,
            2,
            "unit_milli.T5",
            "did you mean T4",
            id="unit for unknown model",
        ),
        pytest.param("unit_milli: 125\nnodes:\n" + NODE, 1, "unit_milli", "`MODEL: milli`", id="unit not a mapping"),
        pytest.param("nodes:\n" + NODE + "nodes:\n" + NODE, 3, "nodes", "keep one of them", id="duplicate key"),
        pytest.param("nodes:\n  - {name: n0, model: T4\n", 3, "yaml", "fix the YAML syntax", id="broken YAML"),
        pytest.param("- just a list\n", 1, "document", "schema_version: 1", id="not a mapping"),
        pytest.param(
            "models:\n  - {name: B8, memory_mib: 8, compute_level: 1}\n  - {name: B9, memory_mib: x}\nnodes:\n" + NODE,
            3,
            "models[1]",
            "fix the model entry",
            id="bad extra model",
        ),
        pytest.param(
            "models:\n  - {name: T4, memory_mib: 8, compute_level: 1}\nnodes:\n" + NODE,
            2,
            "models[0]",
            "defined twice",
            id="extra model clashing with the catalog",
        ),
        pytest.param("models: {B9: 1}\nnodes:\n" + NODE, 1, "models", "entry schema", id="models not a list"),
        pytest.param(
            "nodes:\n" + NODE + "  - just-a-name\n",
            3,
            "nodes[1]",
            "write each node (group) as a mapping",
            id="node not a mapping",
        ),
    ],
)
def test_malformed_inventory_names_file_line_field_and_fix(tmp_path, text, line, field, fix):
    path = write(tmp_path, text)
    with pytest.raises(InventoryError) as exc:
        read_inventory(path)
    err = exc.value
    assert (err.path, err.line, err.field) == (str(path), line, field)
    assert fix in err.fix or fix in err.problem
    where = f"{path}:{line}" if line is not None else str(path)
    assert str(err).startswith(f"{where}: {field}: ")


def test_missing_file_is_an_inventory_error(tmp_path):
    with pytest.raises(InventoryError, match="cannot be read"):
        read_inventory(tmp_path / "absent.yaml")


def test_bundled_default_pool_is_a_small_mixed_pool():
    pool = default_pool()
    assert pool.models == ("A10", "A100-80", "H100-SXM", "L40S")
    assert (len(pool.nodes), pool.gpus) == (22, 128)
    assert {n.domain for n in pool.nodes if n.model_name == "H100-SXM"} == {"h100-a", "h100-b"}
    units = {n.model_name: n.unit_milli for n in pool.nodes if n.model}
    assert units == {"H100-SXM": 1000, "A100-80": 1000, "L40S": 125, "A10": 125}
    assert [n.name for n in pool.nodes if n.model is None] == ["cpu-00", "cpu-01"]
    assert sum(1 for _ in pool.units()) == 64 + 32 + (24 + 8) * 8


def test_read_pool_dispatches_yaml_by_suffix(tmp_path):
    for suffix in ("yaml", "yml", "YAML"):
        path = write(tmp_path, GOOD, name=f"pool.{suffix}")
        assert read_pool(path, domain_size=2).gpus == 28


def test_read_pool_refuses_an_unknown_suffix(tmp_path):
    path = write(tmp_path, GOOD, name="pool.txt")
    with pytest.raises(InventoryError) as exc:
        read_pool(path)
    assert "give a YAML inventory (.yaml, .yml) or an openb node CSV (.csv)" in str(exc.value)
