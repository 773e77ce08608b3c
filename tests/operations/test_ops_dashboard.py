"""The Grafana dashboard (deploy/grafana-dashboard.json) asks only for what the exporter serves, and
every family the exporter serves has a panel."""

from __future__ import annotations

import json
import re
from pathlib import Path

from dagster import instance_for_test
from prometheus_client.parser import text_string_to_metric_families

from tests.ledger.ledger_helpers import alloc
from xirang_platform.ledger import Ledger
from xirang_platform.operations.exporter import XirangCollector, scrape
from xirang_platform.operations.tick_record import record_steps
from xirang_platform.pool.readers import read_pool
from xirang_platform.scheduling.quota import OvercommitPolicy

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana-dashboard.json"
POOL_FILE = ROOT / "tests" / "dagster" / "pool.yaml"
METRIC = re.compile(r"\bxirang_[a-z_]+\b")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def queries() -> list[str]:
    doc = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [t["expr"] for p in doc["panels"] for t in p["targets"]]


def served(tmp_path: Path) -> tuple[set[str], set[str]]:
    """(family names, sample names) of a scrape of a small ledger."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    ledger.add_tenant("acme", 2000)
    ledger.add_project("acme", "vision")
    ledger.reserve(alloc("a1", "acme", "vision"))
    with instance_for_test() as instance:
        record_steps(instance, {"read": 1.0})
        text = scrape(XirangCollector(ledger, instance, read_pool(str(POOL_FILE)), OvercommitPolicy()))
    ledger.close()
    families = list(text_string_to_metric_families(text))
    samples = {f.name + s for f in families for s in SUFFIXES[f.type]}
    return {f.name for f in families}, samples


def test_every_dashboard_query_names_only_metrics_the_exporter_serves(tmp_path: Path) -> None:
    _, samples = served(tmp_path)
    asked = {name for q in queries() for name in METRIC.findall(q)}
    assert asked, "the dashboard has no queries"
    assert asked - samples == set()


def test_every_family_the_exporter_serves_has_a_panel(tmp_path: Path) -> None:
    families, _ = served(tmp_path)
    asked = {name for q in queries() for name in METRIC.findall(q)}
    shown = {f for f in families if any(a == f or a.startswith(f + "_") for a in asked)}
    assert shown == families
    assert families >= {
        "xirang_pool_gpus",
        "xirang_allocated_gpus",
        "xirang_borrowed_gpus",
        "xirang_idle_gpus",
        "xirang_quota_gpus",
        "xirang_cap_gpus",
        "xirang_used_gpus",
        "xirang_reserved_gpus",
        "xirang_pending_runs",
        "xirang_oldest_pending_seconds",
        "xirang_admissions",
        "xirang_preemptions",
        "xirang_returns",
        "xirang_resizes",
        "xirang_reconcile_repairs",
        "xirang_tick_duration_seconds",
    }
