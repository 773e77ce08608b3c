"""The exporter scraped by the real Prometheus server (Debian's `prometheus`, `make prometheus`), its
figures read back through Prometheus' own query API."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dagster import instance_for_test
from ledger_helpers import alloc

from xirang_platform.ledger import Ledger
from xirang_platform.ops.exporter import XirangCollector, serve
from xirang_platform.ops.tick_record import record_steps
from xirang_platform.pool.readers import read_pool
from xirang_platform.scheduling.model import PreemptReason
from xirang_platform.scheduling.quota import OvercommitPolicy

POOL_FILE = Path(__file__).resolve().parents[1] / "dagster" / "pool.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        pytest.fail("no prometheus on PATH: run `make prometheus` (scripts/ensure-prometheus)", pytrace=False)
    return found


def query(port: int, promql: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


@pytest.fixture
def prometheus(prometheus_binary: str, tmp_path: Path) -> Iterator[tuple[int, int]]:
    """(exporter port, Prometheus port): a Prometheus server scraping 127.0.0.1:exporter every second."""
    exporter, server = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: xirang\n    static_configs: [{{targets: ['127.0.0.1:{exporter}']}}]\n",
        encoding="utf-8",
    )
    process = subprocess.Popen(
        [
            prometheus_binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{server}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    try:
        yield exporter, server
    finally:
        process.terminate()
        process.wait(timeout=30)


def wait_for(what: str, predicate: Any, guard_s: float = 120.0) -> Any:
    """Poll until `predicate()` is truthy; the guard only stops a hung test, it asserts no timing."""
    start = time.monotonic()
    while True:
        try:
            got = predicate()
        except OSError:
            got = None
        if got:
            return got
        if time.monotonic() - start > guard_s:
            raise AssertionError(f"still waiting for {what} after {guard_s:.0f} s")
        time.sleep(0.25)


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
