"""Debian's real Prometheus server finds replicas through the registry's file_sd files and scrapes them."""

from __future__ import annotations

from pathlib import Path

from tests.operations.ops_helpers import prometheus_server, query
from tests.serving.serving_helpers import body, endpoint_of, post, running
from tests.waiting import wait_for


def test_prometheus_discovers_replicas_by_file_sd_and_reads_their_request_counts(tmp_path: Path) -> None:
    directory = tmp_path / "registry"
    scrape = f"  - job_name: serving\n    file_sd_configs: [{{files: ['{directory}/*.json'], refresh_interval: 1s}}]\n"
    with running(directory, run_id="a", model_version=2) as a, running(directory, run_id="b", model_version=2) as b:
        for i in range(3):
            post(a, body(offset=i))
        post(b, body())
        with prometheus_server(tmp_path, scrape) as port:
            up = wait_for(
                "both replicas scraped", lambda: (r := query(port, 'up{job="serving"} == 1')) and len(r) == 2 and r
            )
            counts = wait_for(
                "the request counts",
                lambda: (r := query(port, 'xirang_serving_requests_total{status="200"}')) and len(r) == 2 and r,
            )
            b.drain()
            left = wait_for("b dropped from discovery", lambda: (r := query(port, "up")) and len(r) == 1 and r)
    assert sorted(r["metric"]["instance"] for r in up) == sorted([endpoint_of(a).target, endpoint_of(b).target])
    assert {r["metric"]["run_id"]: float(r["value"][1]) for r in counts} == {"a": 3.0, "b": 1.0}
    assert {(r["metric"]["service"], r["metric"]["model_version"]) for r in counts} == {("digits", "2")}
    assert [r["metric"]["run_id"] for r in left] == ["a"]
