"""Helpers of the operations tests: scrape a collector and read its samples back with
prometheus_client's own text parser; start Debian's real Prometheus server and query it."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from xirang_platform.operations.exporter import XirangCollector, scrape

Labels = tuple[tuple[str, str], ...]


def parse(text: str) -> dict[str, dict[Labels, float]]:
    """Sample name -> (sorted label pairs -> value), from exposition text."""
    out: dict[str, dict[Labels, float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name][tuple(sorted(s.labels.items()))] = s.value
    return dict(out)


def scraped(collector: XirangCollector) -> dict[str, dict[Labels, float]]:
    """One scrape of `collector`, parsed."""
    return parse(scrape(collector))


def labels(**pairs: str) -> Labels:
    """Sorted label pairs, as `parse` keys them."""
    return tuple(sorted(pairs.items()))


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prometheus_binary() -> str:
    """Debian's `prometheus` (the test fails with the fix when it is not installed)."""
    found = shutil.which("prometheus")
    if found is None:
        pytest.fail("no prometheus on PATH: run `make prometheus` (scripts/ensure-prometheus)", pytrace=False)
    return found


@contextlib.contextmanager
def prometheus_server(workdir: Path, scrape_configs: str) -> Iterator[int]:
    """The real Prometheus server on a free port (yielded), scraping every second with `scrape_configs`
    (the YAML list under `scrape_configs:`); its log in `workdir/prometheus.log`."""
    port = free_port()
    config = workdir / "prometheus.yml"
    config.write_text(
        f"global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n{scrape_configs}", encoding="utf-8"
    )
    process = subprocess.Popen(
        [
            prometheus_binary(),
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "prometheus.log").open("w"),
    )
    try:
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)


def query(port: int, promql: str) -> list[dict[str, Any]]:
    """The result vector of an instant query to the Prometheus server on `port`."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return list(body["data"]["result"])
