"""The exporter scraped by the real Prometheus server (Debian's `prometheus`, `make prometheus`), its
figures read back through Prometheus' own query API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import instance_for_test

from tests.ledger.ledger_helpers import alloc
from tests.operations.ops_helpers import free_port, prometheus_server, query
from tests.waiting import wait_for
from xirang_platform.ledger import Ledger
from xirang_platform.operations.exporter import XirangCollector, serve
from xirang_platform.operations.tick_record import record_steps
from xirang_platform.pool.readers import read_pool
from xirang_platform.scheduling.model import PreemptReason
from xirang_platform.scheduling.quota import OvercommitPolicy

POOL_FILE = Path(__file__).resolve().parents[1] / "dagster" / "pool.yaml"


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """(exporter port, Prometheus port): a Prometheus server scraping 127.0.0.1:exporter every second."""
    exporter = free_port()
    scrape = f"  - job_name: xirang\n    static_configs: [{{targets: ['127.0.0.1:{exporter}']}}]\n"
    with prometheus_server(tmp_path, scrape) as server:
        yield exporter, server


def test_prometheus_scrapes_the_exporter_and_reads_the_ledgers_figures(
    prometheus: tuple[int, int], tmp_path: Path
) -> None:
    exporter_port, prometheus_port = prometheus
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    ledger.add_tenant("acme", 4000)
    ledger.add_project("acme", "vision", 3000)
    ledger.reserve(alloc("a1", "acme", "vision", gpus=2))
    ledger.reserve(alloc("a2", "acme", "vision", gpus=1, node="n1"))
    ledger.commit("a1")
    ledger.preempt("a2", by="x", reason=PreemptReason.PRIORITY)
    with instance_for_test() as instance:
        record_steps(instance, {"read": 12.5, "plan": 40.0})
        collector = XirangCollector(ledger, instance, read_pool(str(POOL_FILE)), OvercommitPolicy())
        server = serve(collector, exporter_port, "127.0.0.1")
        try:
            up = wait_for("a scrape", lambda: query(prometheus_port, 'up{job="xirang"} == 1'))
            assert len(up) == 1
            used = query(prometheus_port, "xirang_used_gpus")  # Prometheus drops an empty label: project=""
            assert {(r["metric"]["tenant"], r["metric"].get("project", "")): float(r["value"][1]) for r in used} == {
                ("acme", ""): 2.0,
                ("acme", "vision"): 2.0,
            }
            quota = query(prometheus_port, 'xirang_quota_gpus{project="vision"}')
            assert [float(r["value"][1]) for r in quota] == [3.0]
            preempted = query(prometheus_port, "sum(xirang_preemptions_total)")
            assert [float(r["value"][1]) for r in preempted] == [1.0]
            steps = query(prometheus_port, "xirang_tick_duration_seconds_sum")
            assert {r["metric"]["step"]: float(r["value"][1]) for r in steps} == {"read": 0.0125, "plan": 0.04}
            assert [float(r["value"][1]) for r in query(prometheus_port, "xirang_up")] == [1.0]
        finally:
            server.shutdown()
            ledger.close()
