"""The pool from GPU Feature Discovery node labels: node objects of an 8-GPU H100 node with an NVLink
clique, an A100 running MIG (mixed) and a time-sliced PCIe L40S node, read through the same client call
the CLI makes (`list_node`), into the same `Pool` model as a YAML inventory."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from typer.testing import CliRunner

from xirang_platform.cli import app
from xirang_platform.launch.k8s_gpu import mig_layout
from xirang_platform.pool.labels import LabelError, inventory_doc, parse_quantity, pool_from_nodes, read_cluster_pool
from xirang_platform.pool.yaml_inventory import parse_inventory

FIXTURES = Path(__file__).parent / "fixtures" / "nodes"


class _Response:
    def __init__(self, doc: dict) -> None:
        self.data = json.dumps(doc)


def node_object(name: str) -> client.V1Node:
    """A recorded node JSON as the client's `V1Node` (the client's own deserializer)."""
    doc = json.loads((FIXTURES / name).read_text())
    return client.ApiClient().deserialize(_Response(doc), "V1Node")


class NodeApi:
    """The one CoreV1Api call pool discovery makes, recording its arguments."""

    def __init__(self, nodes: list[client.V1Node]) -> None:
        self.nodes, self.calls = nodes, []

    def list_node(self, **kwargs) -> client.V1NodeList:
        self.calls.append(kwargs)
        return client.V1NodeList(items=self.nodes)


NODES = ["h100-sxm-8gpu-clique.json", "a100-80gb-mig-mixed.json", "l40s-pcie-time-sliced.json"]


@pytest.mark.parametrize(
    ("fixture", "want"),
    [
        pytest.param(
            "h100-sxm-8gpu-clique.json",
            ("gpu-h100-sxm-017", "H100-SXM", 8, 191450, 1997818, "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1"),
            id="h100-8gpu-domain-is-its-nvlink-clique",
        ),
        pytest.param(
            "a100-80gb-mig-mixed.json",
            ("dgx-a100-03", "A100-80", 8, 255000, 2062734, "dgx-a100-03"),
            id="a100-mig-mixed-counts-physical-gpus",
        ),
        pytest.param(
            "l40s-pcie-time-sliced.json",
            ("gpu-l40s-pcie-02", "L40S", 4, 47810, 376511, "gpu-l40s-pcie-02"),
            id="l40s-shared-suffix-is-the-catalog-model",
        ),
    ],
)
def test_node_fields_from_labels(fixture, want):
    (node,) = pool_from_nodes([node_object(fixture)]).nodes
    assert (node.name, node.model_name, node.gpus, node.cpu_milli, node.memory_mib, node.domain) == want
    assert node.labels["nvidia.com/gpu.present"] == "true"


def test_the_cluster_pool_is_read_through_list_node_with_the_selector():
    api = NodeApi([node_object(n) for n in NODES])
    pool = read_cluster_pool(api, "nvidia.com/gpu.present=true", unit_milli={"L40S": 125})
    assert api.calls == [{"label_selector": "nvidia.com/gpu.present=true"}]
    assert (pool.gpus, pool.models) == (20, ("A100-80", "H100-SXM", "L40S"))
    assert pool.node("gpu-l40s-pcie-02").unit_milli == 125
    assert pool.source == "cluster (nvidia.com/gpu.present=true)"


def test_mig_labels_reach_the_launcher():
    pool = pool_from_nodes([node_object("a100-80gb-mig-mixed.json")])
    layout = mig_layout(pool.node("dgx-a100-03"))
    assert layout is not None
    assert (layout.strategy, [p.name for p in layout.profiles]) == ("mixed", ["1g.10gb"])
    # MIG-capable, strategy mixed, but no MIG devices (no mig-* count labels): whole GPUs.
    assert mig_layout(pool_from_nodes([node_object("h100-sxm-8gpu-clique.json")]).nodes[0]) is None
    assert mig_layout(pool_from_nodes([node_object("l40s-pcie-time-sliced.json")]).nodes[0]) is None


def test_the_pool_round_trips_through_a_yaml_inventory():
    pool = pool_from_nodes([node_object(n) for n in NODES], unit_milli={"L40S": 125})
    again = parse_inventory(yaml.safe_dump(inventory_doc(pool)), "from-cluster")
    assert again.nodes == pool.nodes


def _relabelled(fixture: str, **labels: str) -> client.V1Node:
    node = copy.deepcopy(node_object(fixture))
    node.metadata.labels.update({k.replace("__", "/").replace("_", "."): v for k, v in labels.items()})
    return node


def test_mig_single_strategy_counts_devices_over_instances_per_gpu():
    node = _relabelled(
        "a100-80gb-mig-mixed.json",
        **{
            "nvidia.com__mig_strategy": "single",
            "nvidia.com__gpu_product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
            "nvidia.com__gpu_count": "56",
        },
    )
    (read,) = pool_from_nodes([node]).nodes
    assert (read.model_name, read.gpus) == ("A100-80", 8)


def test_a_node_without_gfd_labels_is_cpu_only():
    node = copy.deepcopy(node_object("l40s-pcie-time-sliced.json"))
    node.metadata.labels = {"kubernetes.io/hostname": "cpu-7"}
    (read,) = pool_from_nodes([node]).nodes
    assert (read.model, read.gpus, read.domain) == (None, 0, "cpu")


@pytest.mark.parametrize(
    ("labels", "says"),
    [
        pytest.param(
            {"nvidia.com__gpu_product": "NVIDIA-H100-NVL"},
            "label nvidia.com/gpu.product='NVIDIA-H100-NVL' is not a GPU model the catalog knows",
            id="unknown-product-names-label-and-fix",
        ),
        pytest.param(
            {"nvidia.com__gpu_count": "eight"},
            "label nvidia.com/gpu.count='eight' is not a count",
            id="malformed-count",
        ),
    ],
)
def test_unreadable_labels_fail_naming_the_node_the_label_and_the_fix(labels, says):
    good = node_object("l40s-pcie-time-sliced.json")
    with pytest.raises(LabelError) as info:
        pool_from_nodes([good, _relabelled("h100-sxm-8gpu-clique.json", **labels)])
    assert str(info.value).startswith("node gpu-h100-sxm-017: ")
    assert says in str(info.value)
    assert "gpu_catalog.yaml" in str(info.value) or "gpu-feature-discovery" in str(info.value)


def test_no_nodes_is_an_error_not_an_empty_pool():
    with pytest.raises(LabelError, match="no nodes listed; check the label selector"):
        read_cluster_pool(NodeApi([]), "nvidia.com/gpu.present=true")


@pytest.mark.parametrize(
    ("text", "value"),
    [("191450m", 191.45), ("64", 64), ("2045765836Ki", 2045765836 * 1024), ("1.5Gi", 1.5 * 2**30), ("2k", 2000)],
)
def test_quantities(text, value):
    assert float(parse_quantity(text)) == pytest.approx(value)


def test_a_malformed_quantity_is_refused():
    with pytest.raises(ValueError, match="is not a quantity"):
        parse_quantity("12 cores")


def test_cli_prints_the_cluster_pool_as_an_inventory_the_readers_accept():
    api = NodeApi([node_object(n) for n in NODES])
    result = CliRunner().invoke(
        app,
        ["k8s", "pool", "--yaml", "--unit-milli", "L40S=125", "--selector", "nvidia.com/gpu.present=true"],
        obj={"k8s_core_api": api},
    )
    assert result.exit_code == 0, result.output
    pool = parse_inventory(result.output, "cli")
    assert (pool.gpus, pool.node("gpu-l40s-pcie-02").unit_milli) == (20, 125)
    assert api.calls == [{"label_selector": "nvidia.com/gpu.present=true"}]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        pytest.param(["--unit-milli", "L40S=7"], "MILLI dividing 1000", id="unit-not-dividing-1000"),
        pytest.param(["--unit-milli", "L41S=125"], "unknown GPU model 'L41S'", id="unit-of-unknown-model"),
    ],
)
def test_cli_refuses_bad_units(args, says):
    result = CliRunner().invoke(app, ["k8s", "pool", *args], obj={"k8s_core_api": NodeApi([])})
    assert result.exit_code == 2
    assert says in result.output


def test_cli_names_the_label_of_an_unknown_product():
    api = NodeApi([_relabelled("h100-sxm-8gpu-clique.json", **{"nvidia.com__gpu_product": "NVIDIA-H100-NVL"})])
    result = CliRunner().invoke(app, ["k8s", "pool"], obj={"k8s_core_api": api})
    assert result.exit_code == 2
    assert "nvidia.com/gpu.product='NVIDIA-H100-NVL'" in result.output


def test_cli_says_when_the_cluster_cannot_be_reached(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    result = CliRunner().invoke(app, ["k8s", "pool", "--kubeconfig", str(kubeconfig)])
    assert result.exit_code == 2
    assert "cannot reach the cluster" in result.output
