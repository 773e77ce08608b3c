"""The usage report and the exporter count an elastic run's resizes (DESIGN.md sections 10 and 11):
the usage rows follow the size the run held when, and both count each resize once."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path

import pytest
from dagster import instance_for_test

from tests.ledger.ledger_helpers import SetClock as Clock
from tests.operations.ops_helpers import labels, scraped
from xirang_platform.ledger import Ledger
from xirang_platform.operations.exporter import XirangCollector
from xirang_platform.operations.usage import totals, usage
from xirang_platform.pool.readers import read_pool
from xirang_platform.scheduling.model import (
    Admit,
    Allocation,
    GpuRange,
    GpuSlice,
    NodeShare,
    Placement,
    PreemptReason,
    Request,
    Resize,
    ResizeKind,
    Tier,
)
from xirang_platform.scheduling.quota import OvercommitPolicy
from xirang_platform.scheduling.result import CycleResult

DAY = date(2026, 12, 1)
T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC).timestamp()
HOUR = 3600.0
POOL_FILE = Path(__file__).resolve().parents[1] / "dagster" / "pool.yaml"


def on_h100(gpus: int, borrowed: bool = False) -> Allocation:
    """Elastic run `train` of acme/vision (2..8 GPUs) on the first `gpus` GPUs of h100-00."""
    request = Request("train", "acme", "vision", Tier.OFFLINE_TRAINING, 0.0, gpus, elastic=GpuRange(2, 8))
    slices = tuple(GpuSlice("h100-00", g, 1000) for g in range(gpus))
    return Allocation(request, Placement(slices, (NodeShare("h100-00", 0, 0),)), T0, borrowed, confirmed=False)


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def resized(tmp_path: Path, clock: Clock) -> Iterator[Ledger]:
    """A ledger where `train` ran 1 h at 2 GPUs, grew to 6 (2 of them past acme's 4.8-GPU cap, so
    borrowed) for 1 h, then was shrunk to 4 in quota by a reclaim and ran 1 h more."""
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", clock=clock)
    ledger.add_tenant("acme", 4000)
    ledger.add_project("acme", "vision")
    ledger.apply_cycle(CycleResult(admits=(Admit(on_h100(2)),)))
    ledger.commit("train")
    steps = [
        (on_h100(6, borrowed=True), ResizeKind.GROW, None),
        (on_h100(4), ResizeKind.SHRINK, PreemptReason.RECLAIM),
    ]
    for new, kind, reason in steps:
        clock.t += HOUR
        [old] = ledger.allocations()
        by = "p0-run" if reason else None
        ledger.apply_cycle(CycleResult(resizes=(Resize(old, new, kind, clock.t, by, reason),)))
        ledger.commit("train")
    clock.t += HOUR
    ledger.release("train")
    yield ledger
    ledger.close()


def test_the_usage_report_follows_each_size_and_counts_the_resizes(resized: Ledger, clock: Clock) -> None:
    rows = usage(resized.entries(), DAY, DAY, clock.t)
    [row] = [r for r in rows if r.project == "vision"]
    assert row.in_quota_s == pytest.approx(2 * HOUR + 4 * HOUR)  # 2 GPUs for 1 h, then 4 GPUs for 1 h
    assert row.borrowed_s == pytest.approx(6 * HOUR)  # the 6-GPU hour, past the cap, borrowed whole
    assert row.resizes == 2
    assert row.as_dict()["resizes"] == 2
    assert totals(rows)["resizes"] == 2


def test_the_exporter_counts_each_resize_once_by_direction(resized: Ledger) -> None:
    with instance_for_test() as instance:
        got = scraped(XirangCollector(resized, instance, read_pool(str(POOL_FILE)), OvercommitPolicy()))
    assert got["xirang_resizes_total"] == {
        labels(tenant="acme", project="vision", tier="offline-training", kind="grow"): 1.0,
        labels(tenant="acme", project="vision", tier="offline-training", kind="shrink"): 1.0,
    }
