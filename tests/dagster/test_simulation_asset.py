"""The trace replay asset materializes real metrics from a real trace."""

from __future__ import annotations

from pathlib import Path

from dagster import materialize

from xirang_platform.dagster_defs.assets.simulation import trace_replay

REPO = Path(__file__).resolve().parents[2]
NODES = REPO / "data/traces/alibaba_openb_gpu_2023/openb_node_list_gpu_node.csv"
ITP = REPO / "data/traces/microsoft_itp_elasticflow_2021/cluster01.csv"


def test_trace_replay_materializes_metrics_from_a_real_trace() -> None:
    config = {"nodes": str(NODES), "jobs": [f"{ITP}:online-training"], "limit": 200}
    result = materialize([trace_replay], run_config={"ops": {"trace_replay": {"config": config}}})
    assert result.success
    [materialization] = result.asset_materializations_for_node("trace_replay")
    meta = materialization.metadata
    assert meta["jobs_submitted"].value == 200
    assert meta["jobs_finished"].value + meta["jobs_rejected"].value + meta["jobs_unfinished"].value == 200
    assert 0 < meta["utilization"].value < 1
    assert meta["cycles"].value > 0
