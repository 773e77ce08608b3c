"""The queue view after real ticks: positions in the cycle's order, hold reasons, and estimates from
the running work's historical durations, `unknown` where there is none."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import astuple, dataclass
from pathlib import Path

import pytest
from dagster import build_sensor_context
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.dagster.engine_harness import Engine, engine, request
from tests.ledger.ledger_helpers import alloc
from xirang_platform.cli import app
from xirang_platform.dagster_defs.assets.pool import gpu_pool_observer
from xirang_platform.ops.queue_view import (
    UNKNOWN,
    estimate_starts,
    estimate_text,
    position_text,
    queue_rows,
    read_queue,
)
from xirang_platform.ops.waiting import WaitingRun
from xirang_platform.platform import run_tags as rt
from xirang_platform.scheduling.model import Request, Tier
from xirang_platform.scheduling.quota import AccountKey, Balance, QuotaBook

T = 1_900_000_000.0


@pytest.fixture
def e(tmp_path: Path) -> Iterator[Engine]:
    with engine(tmp_path, "sqlite") as platform:
        yield platform


@dataclass(frozen=True)
class Waiting:
    """Two 8-GPU gangs waiting behind a gpu_job gang whose end is known and a train_job gang whose end
    is not (`waiting_behind_known_and_unknown_ends`); `duration`: gpu_job's past run, in seconds."""

    first: str
    second: str
    duration: float


def waiting_behind_known_and_unknown_ends(e: Engine) -> Waiting:
    # History: one gpu_job run that succeeded gives that job a duration. Then a gpu_job gang (8 GPUs,
    # its end known) and a train_job gang (8 GPUs, no history: its end unknown) fill the H100s at T + 10;
    # two 8-GPU gangs wait. The first starts when the gpu_job gang is expected to end (4 idle L40S +
    # its 8 cover 8); the second needs 16: the unknown end is needed, so its estimate is unknown.
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
    first = e.submit("research", "gpu_job", request("offline-training", 8, project="vision"))
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


# -- the estimate's rules, case by case ------------------------------------------------------------------

NOW = 5_000.0
BOOK = QuotaBook({"acme": 4000, "beta": 4000}, {("acme", "vision"): None, ("beta", "ranking"): None})


def waiting_run(rid: str, tenant: str, reason: str) -> WaitingRun:
    return WaitingRun(rid, tenant, "vision" if tenant == "acme" else "ranking", "offline-training", reason, 1.0, {})


def pending(rid: str, tenant: str, gpus: int) -> Request:
    project = "vision" if tenant == "acme" else "ranking"
    return Request(rid, tenant, project, Tier.OFFLINE_TRAINING, submit_time=1.0, gpus=gpus)


@pytest.mark.parametrize(
    ("reason", "tenant", "idle_gpus", "ends", "want"),
    [
        pytest.param("capacity: no room", "acme", 2, {}, NOW, id="capacity hold with enough idle GPUs: now"),
        pytest.param(
            "capacity: no room",
            "acme",
            0,
            {"b1": NOW + 50, "a1": NOW + 100},
            NOW + 50,
            id="capacity hold: the earliest known end that frees enough",
        ),
        pytest.param("capacity: no room", "acme", 0, {}, None, id="capacity hold, no end known: unknown"),
        pytest.param(
            "quota: tenant acme at its cap",
            "acme",
            0,
            {"b1": NOW + 50, "a1": NOW + 100},
            NOW + 100,
            id="quota hold: only its own tenant's release brings it under its cap",
        ),
        pytest.param(
            "quota: tenant acme at its cap",
            "acme",
            0,
            {"b1": NOW + 50},
            None,
            id="quota hold, only another tenant's end known: unknown",
        ),
        pytest.param("something else", "acme", 8, {}, None, id="a hold of no known kind: unknown"),
    ],
)
def test_the_estimate_reads_the_known_ends_by_the_hold_kind(
    reason: str, tenant: str, idle_gpus: int, ends: dict[str, float], want: float | None
) -> None:
    # acme holds its whole quota (a1, 4 GPUs), beta 2 GPUs (b1); the pool has 6 + idle_gpus.
    allocations = [alloc("a1", "acme", "vision", gpus=4), alloc("b1", "beta", "ranking", gpus=2, node="n1")]
    balances = {AccountKey("acme"): Balance(4000, used=4000), AccountKey("beta"): Balance(4000, used=2000)}
    w = waiting_run("w", tenant, reason)
    rows = queue_rows(
        [w], {"w": pending("w", tenant, 2)}, BOOK, balances, allocations, ends, (6 + idle_gpus) * 1000, 1.0, NOW
    )
    assert [(r.position, r.estimated_start) for r in rows] == [(1, want)]


@settings(max_examples=200, deadline=None)
@given(
    asks=st.lists(st.integers(1, 8), min_size=1, max_size=8),
    running=st.lists(st.tuples(st.integers(1, 8), st.one_of(st.none(), st.integers(0, 500))), max_size=8),
    idle_gpus=st.integers(0, 8),
)
def test_a_capacity_estimate_is_the_first_known_end_that_frees_the_asks_ahead(
    asks: list[int], running: list[tuple[int, int | None]], idle_gpus: int
) -> None:
    # The estimator walks the known ends once for the whole queue; each start must still be the
    # definition's: now if the idle GPUs cover the asks up to and including this run, else the
    # earliest known end by which idle plus freed GPUs do, else unknown.
    allocations = [
        (alloc(f"a{i}", gpus=g, node=f"n{i}"), None if t is None else NOW + t) for i, (g, t) in enumerate(running)
    ]
    waiting = [(pending(f"w{i}", "acme", g), "capacity") for i, g in enumerate(asks)]
    got = estimate_starts(waiting, allocations, idle_gpus * 1000, BOOK, {}, 1.0, NOW)
    known = sorted((t, a.id, a.milli) for a, t in allocations if t is not None)
    want: list[float | None] = []
    for i in range(len(asks)):
        need = sum(asks[: i + 1]) * 1000
        times = [NOW] + [t for t, _, _ in known]
        freed = [idle_gpus * 1000] + [
            idle_gpus * 1000 + sum(m for _, _, m in known[: k + 1]) for k in range(len(known))
        ]
        want.append(next((max(NOW, t) for t, f in zip(times, freed, strict=True) if f >= need), None))
    assert got == want


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
