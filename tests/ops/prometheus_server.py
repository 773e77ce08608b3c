"""Debian's real Prometheus server for tests (`make prometheus`): started on a free port with a
generated config, queried through its own HTTP API. Used by the exporter's tests and the autoscaler's."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prometheus_binary() -> str:
    """The `prometheus` on PATH; the test fails (never skips) without it."""
    found = shutil.which("prometheus")
    if found is None:
        pytest.fail("no prometheus on PATH: run `make prometheus` (scripts/ensure-prometheus)", pytrace=False)
    return found


@contextmanager
def prometheus_server(tmp_path: Path, scrape_configs: str) -> Iterator[int]:
    """A Prometheus server scraping every second with `scrape_configs` (YAML list items); its port."""
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\nscrape_configs:\n" + scrape_configs, encoding="utf-8"
    )
    process = subprocess.Popen(
        [
            prometheus_binary(),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    try:
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)


def query(port: int, promql: str) -> list[dict[str, Any]]:
    """The result list of an instant query (the test fails on an error status)."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


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
