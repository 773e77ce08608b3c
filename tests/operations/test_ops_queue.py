"""The queue view after real ticks: positions in the cycle's order, hold reasons, and estimates by
forward simulation from the running work's expected ends (declared or historical), `unknown` where
only an unknown end could start a run."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import astuple, dataclass
from pathlib import Path

import pytest
from dagster import build_sensor_context
from typer.testing import CliRunner

from tests.dagster.engine_harness import Engine, engine, request
from tests.scheduling.cycle_builders import job, node, running
from xirang_platform.cli import app
from xirang_platform.control import run_tags as rt
from xirang_platform.dagster_defs.assets.pool import gpu_pool_observer
from xirang_platform.operations.queue_view import (
    UNKNOWN,
    estimate_text,
    position_text,
    queue_rows,
    read_queue,
)
from xirang_platform.operations.waiting import WaitingRun
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.scheduling.snapshot import SchedulerConfig, Snapshot
from xirang_platform.simulate.eta import Forecast

T = 1_900_000_000.0


@pytest.fixture
def e(tmp_path: Path) -> Iterator[Engine]:
    with engine(tmp_path, "sqlite") as platform:
        yield platform


@dataclass(frozen=True)
class Waiting:
    """Two 8-GPU runs waiting behind a gpu_job gang whose end is known and a train_job gang whose end
    is not (`waiting_behind_known_and_unknown_ends`); `duration`: gpu_job's past run, in seconds."""

    first: str
    second: str
    duration: float


def waiting_behind_known_and_unknown_ends(e: Engine) -> Waiting:
    # History: one gpu_job run that succeeded gives that job a duration. Then a gpu_job gang (8 GPUs,
    # its end known) and a train_job gang (8 GPUs, no history: its end unknown) fill the H100s at T + 10;
    # two 8-GPU runs wait: a train_job (no history: once started, it runs for an unknown time) and a
    # gpu_job. The first starts when the gpu_job gang is expected to end; the second would need the
    # first's end or the other gang's, both unknown: its estimate is unknown.
    done = e.submit("research", "gpu_job", request("offline-training", 2, project="llm"))
    e.tick(T)
    e.dequeue()
    e.release_sensors(done)
    record = e.instance.get_run_record_by_id(done)
    assert record is not None
    assert record.start_time
    assert record.end_time
    known = e.submit("research", "gpu_job", request("offline-training", 8, project="llm"))
    unknown = e.submit("product", "train_job", request("online-training", 8, project="serving"))
    first = e.submit("research", "train_job", request("offline-training", 8, project="vision"))
    second = e.submit("research", "gpu_job", request("offline-training", 8, project="vision"))
    report = e.tick(T + 10)
    assert sorted(report.admitted) == sorted([known, unknown])
    return Waiting(first, second, record.end_time - record.start_time)


def test_waiting_runs_get_their_place_in_the_tier_and_a_start_only_where_running_ends_are_known(e: Engine) -> None:
    first, second, duration = astuple(waiting_behind_known_and_unknown_ends(e))
    platform = e.gpu_pool.platform()

    rows = read_queue(e.instance, e.ledger, platform, T + 20)

    assert [(r.run_id, r.tier, r.position, r.gpus) for r in rows] == [
        (first, "offline-training", 1, 8.0),
        (second, "offline-training", 2, 8.0),
    ]
    assert [r.hold_reason for r in rows] == [e.tag(first, rt.HOLD_REASON), e.tag(second, rt.HOLD_REASON)]
    assert rows[0].estimated_start == pytest.approx(max(T + 20, T + 10 + duration))
    assert rows[1].estimated_start is None
    assert rows[1].as_dict(T + 20)["estimated_start"] == UNKNOWN
    assert rows[0].waiting_since == float(e.tag(first, rt.SUBMIT_TIME) or 0)
    assert read_queue(e.instance, e.ledger, platform, T + 20, tenant="product") == []
    # The gpu_pool observation carries the same table.
    with build_sensor_context(instance=e.instance, resources={"gpu_pool": e.gpu_pool}) as context:
        result = gpu_pool_observer(context)
    table = result.asset_events[0].metadata["queue"].value
    assert [line.split(" | ")[0].lstrip("| ") for line in table.splitlines()[2:]] == [first, second]
    assert table.splitlines()[3].split(" | ")[7] == UNKNOWN


def test_the_tick_tags_each_held_run_with_the_queue_views_place_and_estimate(e: Engine) -> None:
    waiting = waiting_behind_known_and_unknown_ends(e)
    # What `xirang queue` says at the tick's own time is what the UI shows on each run.
    rows = read_queue(e.instance, e.ledger, e.gpu_pool.platform(), T + 10)
    assert [(e.tag(r.run_id, rt.POSITION), e.tag(r.run_id, rt.ESTIMATED_START)) for r in rows] == [
        (position_text(r), estimate_text(r.estimated_start, T + 10)) for r in rows
    ]
    assert [(e.tag(r, rt.GATE), e.tag(r, rt.POSITION)) for r in (waiting.first, waiting.second)] == [
        ("capacity", "#1 in offline-training"),
        ("capacity", "#2 in offline-training"),
    ]
    assert e.tag(waiting.first, rt.ESTIMATED_START) == estimate_text(T + 10 + waiting.duration, T + 10)
    assert e.tag(waiting.second, rt.ESTIMATED_START) == UNKNOWN
    # Dagster's queue-criteria dialog lists the queue config's limits that match a run's tags: the
    # gate, and these tags' values, each at limit 0 (the webserver reads the config this way).
    limits = e.instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
    for key in (rt.GATE, rt.HOLD_REASON, rt.POSITION, rt.ESTIMATED_START):
        assert {"key": key, "value": e.tag(waiting.first, key), "limit": 0} in limits, (key, limits)
    assert e.tick(T + 10).counts["queue tags written"] == 0  # the same state again: nothing written


def test_the_queue_command_refuses_an_unknown_tenant_and_an_unset_dagster_home(
    e: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert e.ledger.accounts()  # the platform created its ledger
    runner = CliRunner()
    wrong = runner.invoke(app, ["queue", "--tenant", "nobody"])
    assert wrong.exit_code == 1
    assert "unknown tenant 'nobody': use one of product, research" in wrong.output
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    unset = runner.invoke(app, ["queue"])
    assert unset.exit_code == 1
    assert "DAGSTER_HOME is unset" in unset.output


# -- the view over the estimator ----------------------------------------------------------------------

NOW = 5_000.0


def test_the_rows_follow_the_cycle_order_and_a_declared_duration_dates_the_run_behind() -> None:
    # One node of 8 H100s: a1 (4 GPUs) ends at NOW + 100; b1 (4 GPUs) has no expected end. w1 (4 GPUs,
    # declared 300 s) starts at a1's end; w2 (4 GPUs) at w1's; w3 (8 GPUs) needs b1's end: unknown.
    pool = Pool((node("n0").build(),))
    book = QuotaBook({"acme": 8000}, {("acme", "default"): None})
    allocations = [running(job("a1").gpus(4), {"n0": [0, 1, 2, 3]}), running(job("b1").gpus(4), {"n0": [4, 5, 6, 7]})]
    pending = {r.id: r for r in (job(f"w{i}").gpus(g).at(float(i)).build() for i, g in ((1, 4), (2, 4), (3, 8)))}
    waiting = [WaitingRun(rid, "acme", "default", "offline-training", "capacity: no room", 1.0, {}) for rid in pending]
    known = Forecast({"a1": NOW + 100, "b1": None}, {"w1": 300.0, "w2": 50.0, "w3": 10.0})

    rows = queue_rows(waiting, pending, Snapshot.build(pool, allocations, book), SchedulerConfig(), known, NOW)

    assert [(r.run_id, r.position, r.estimated_start) for r in rows] == [
        ("w1", 1, NOW + 100),
        ("w2", 2, NOW + 400),
        ("w3", 3, None),
    ]


def test_a_run_admitted_and_waiting_for_its_victims_starts_now() -> None:
    pool = Pool((node("n0").build(),))
    book = QuotaBook({"acme": 8000}, {("acme", "default"): None})
    reserved = running(job("p").gpus(8), {"n0": list(range(8))})
    waiting = [WaitingRun("p", "acme", "default", "offline-training", "reserved: its victims stop", 1.0, {})]
    rows = queue_rows(
        waiting, {"p": reserved.request}, Snapshot.build(pool, [reserved], book), SchedulerConfig(), Forecast(), NOW
    )
    assert [(r.run_id, r.estimated_start) for r in rows] == [("p", NOW)]


@pytest.mark.parametrize(
    ("start", "text"),
    [
        pytest.param(None, "unknown", id="no estimate"),
        pytest.param(NOW - 30, "~now", id="an estimate already passed"),
        pytest.param(NOW, "~now", id="an estimate of now"),
        pytest.param(NOW + 1, "~01:24 UTC", id="within the minute: that minute, rounded up"),
        pytest.param(NOW + 60 * 45, "~02:09 UTC", id="later today: the time of day, rounded up"),
        pytest.param(NOW + 86_400 * 3, "~Jan 04 01:24 UTC", id="another day: with its date"),
    ],
)
def test_an_estimated_start_reads_as_an_absolute_time(start: float | None, text: str) -> None:
    # NOW is 1970-01-01 01:23:20 UTC
    assert estimate_text(start, NOW) == text
