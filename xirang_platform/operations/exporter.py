"""The Prometheus exporter (`xirang metrics serve`): a process of its own, as kube-state-metrics is.

Each scrape reads the ledger (accounts, live holdings, event counts from the entries) and the Dagster
instance (the runs behind the closed gate, the tick's step durations) afresh, through one custom
collector, so what it serves is what the ledger and the instance hold at that moment, and the
counters survive restarts. A scrape that cannot read them serves `xirang_up 0` (and logs why).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from dagster import DagsterInstance
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from xirang_platform.ledger.ledger import Ledger
from xirang_platform.ledger.read_only import read_figures
from xirang_platform.operations.families import Readings, families, unavailable
from xirang_platform.operations.tick_record import read_histograms
from xirang_platform.operations.waiting import waiting_runs
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.quota import OvercommitPolicy

DEFAULT_PORT = 9464
DEFAULT_HOST = "127.0.0.1"  # this machine only: the exporter shows every tenant's quota and queue
_logger = logging.getLogger("xirang.ops")


class XirangCollector(Collector):
    """Reads the ledger and the Dagster instance on every scrape."""

    def __init__(
        self,
        ledger: Ledger,
        instance: DagsterInstance,
        pool: Pool,
        policy: OvercommitPolicy,
        clock: Callable[[], float] = time.time,
        config_problem: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.ledger = ledger
        self.instance = instance
        self.pool = pool
        self.policy = policy
        self.clock = clock
        self.config_problem = config_problem  # why the platform config file is not in force (None: it is)

    def read(self) -> Readings:
        """One scrape's readings (raises when the ledger or the instance cannot be read)."""
        now = self.clock()
        figures = read_figures(self.ledger)
        waiting = waiting_runs(self.instance)
        ticks = read_histograms(self.instance)
        return Readings(self.pool, self.policy, figures, waiting, ticks, now, self.config_problem())

    def collect(self) -> Iterator[Metric]:
        """The families of one scrape; only `xirang_up 0` when something could not be read."""
        try:
            readings = self.read()
        except Exception as e:  # noqa: BLE001 -- a scrape reports the failure as data, it never raises
            _logger.error("scrape failed: %s", e)
            yield from unavailable()
            return
        yield from families(readings)


def registry_for(collector: XirangCollector) -> CollectorRegistry:
    """A registry holding only `collector` (no process or platform collectors)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def scrape(collector: XirangCollector) -> str:
    """One scrape's exposition text, as `/metrics` serves it."""
    return generate_latest(registry_for(collector)).decode()


def serve(collector: XirangCollector, port: int = DEFAULT_PORT, host: str = DEFAULT_HOST) -> Any:
    """Serve `/metrics` on `host:port` in a background thread; returns the server (`.shutdown()` stops it)."""
    server, _thread = start_http_server(port, addr=host, registry=registry_for(collector))
    return server
